"""Models that write into the caller's tensors (a recurrent state, a running statistic): the
engine computes the new values and writes them itself, so such models compile whole, leave the
same values in their inputs and buffers as eager, after save and load too, and a corrupted or
edited write is refused. Writes of a few elements (a KV cache's position) stay in place."""
import copy
import sys
from pathlib import Path

import pytest
import torch

import blade
from helpers import assert_ran_compiled, assert_same

sys.path.insert(0, str(Path(__file__).parent / "ral"))
from saved_state import META, rewrite_engines  # noqa: E402


class TwoStates(torch.nn.Module):
    """A recurrent step that updates the two states it is given in place."""

    def forward(self, h, c, x, w):
        h.mul_(0.5).add_(torch.tanh(x @ w))
        c.add_(h * 0.1)
        return torch.softmax(h + c, dim=-1) @ w.t()


def state_inputs():
    return (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 6), torch.randn(6, 8))


class KvCacheAttention(torch.nn.Module):
    """One decoding step: the new key and value written into position 5 of the caches."""

    def forward(self, k_cache, v_cache, k, v, q):
        k_cache[:, :, 5:6] = k
        v_cache[:, :, 5:6] = v
        weights = torch.softmax(q @ k_cache.transpose(-1, -2) * 0.5, dim=-1)
        return weights @ v_cache


def kv_inputs():
    return (torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 1, 4),
            torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))


def clones(inputs):
    return [t.clone() for t in inputs]


def assert_writes_like_eager(model, optimized, inputs, calls=2):
    """Each call gives eager's result and leaves eager's values in the inputs."""
    mine, theirs = clones(inputs), clones(inputs)
    for _ in range(calls):
        with torch.no_grad():
            assert_same(optimized(*mine), model(*theirs))
        for got, want in zip(mine, theirs):
            torch.testing.assert_close(got, want)


def engine_writes(report) -> int:
    return sum(c.ops.get("blade::write_back", 0) for c in report.clusters)


def test_states_updated_in_place_compile_whole_and_the_engine_writes_them():
    model = TwoStates()
    inputs = state_inputs()
    optimized = blade.optimize(model, clones(inputs))
    assert_writes_like_eager(model, optimized, inputs)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops and not report.unsupported, str(report)
    assert engine_writes(report) == 2, str(report)
    assert len(report.clusters) == 1, str(report)


def test_a_kv_cache_written_through_a_slice_keeps_its_write_in_place():
    """Eager writes one position of each cache; a new cache written back whole would cost
    more than the attention: the slice write stays TorchScript, the attention compiles."""
    model = KvCacheAttention()
    inputs = kv_inputs()
    optimized = blade.optimize(model, clones(inputs))
    assert_writes_like_eager(model, optimized, inputs)
    report = assert_ran_compiled(optimized)
    assert report.unsupported["aten::copy_"].count == 2, str(report)
    assert engine_writes(report) == 0 and report.compiled_ops > 0, str(report)


class StaticCacheLayers(torch.nn.Module):
    """Two decoding layers over a static KV cache, written as Hugging Face's StaticCache
    does: a position counter and the caches updated in place, then attention with a mask."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x, mask, k1, v1, n1, k2, v2, n2):
        for proj, (k, v, n) in zip(self.proj, ((k1, v1, n1), (k2, v2, n2))):
            position = torch.arange(1) + n
            n.add_(1)
            k.index_copy_(2, position, proj(x))
            v.index_copy_(2, position, x * 2)
            x = proj(torch.nn.functional.scaled_dot_product_attention(x, k, v, attn_mask=mask))
        return x


def test_static_cache_layers_compile_into_one_engine_that_writes_the_caches():
    """Neither the writes into the other layer's tensors nor the attention's branch on its
    mask split the layers: one engine computes both and writes all four caches."""
    model = StaticCacheLayers().eval()
    inputs = (torch.randn(1, 2, 1, 8), torch.tensor([[[[True] * 5 + [False]]]])) + tuple(
        t for _ in range(2) for t in (torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8),
                                      torch.tensor(0)))
    optimized = blade.optimize(model, clones(inputs))
    assert_writes_like_eager(model, optimized, inputs, calls=3)
    report = assert_ran_compiled(optimized)
    layers = max(report.clusters, key=lambda c: sum(c.ops.values()))
    assert layers.ops.get("blade::write_back", 0) == 4, str(report)
    assert layers.ops.get("aten::linear", 0) == 4, str(report)


class ScatterInto(torch.nn.Module):
    def forward(self, x, i, v):
        x.index_put_((i,), v, accumulate=True)
        return x.relu()


def test_scattered_writes_compile_into_small_tensors_only():
    """A write of a few elements costs a copy of the whole tensor once compiled: small
    tensors' compile (SMALL_WRITE_ELEMENTS), a large one's stays in place."""
    from blade.frontend.simplify import SMALL_WRITE_ELEMENTS

    model = ScatterInto()
    for size, compiled in ((64, True), (SMALL_WRITE_ELEMENTS + 1, False)):
        inputs = (torch.randn(size), torch.tensor([0, 3, 3]), torch.randn(3))
        optimized = blade.optimize(model, clones(inputs))
        assert_writes_like_eager(model, optimized, inputs)
        report = assert_ran_compiled(optimized)
        assert (engine_writes(report) == 1) == compiled, str(report)
        assert ("aten::index_put_" in report.unsupported) != compiled, str(report)


class RunningMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(6))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls.add_(1)
        self.mean.mul_(0.9).add_(x.mean(0) * 0.1)
        return (x - self.mean) * self.calls


def test_buffers_written_by_forward_evolve_as_in_eager_and_optimize_leaves_them_alone():
    model = RunningMean()
    x = torch.randn(4, 6)
    optimized = blade.optimize(model, (x,))
    # optimize ran the model (types, the engine check) without changing its state
    assert model.calls.item() == 0 and torch.equal(model.mean, torch.zeros(6))
    reference = copy.deepcopy(model)
    for _ in range(3):
        with torch.no_grad():
            assert_same(optimized(x), reference(x))
    torch.testing.assert_close(model.mean, reference.mean)  # optimized shares the buffers
    assert model.calls.item() == 3
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    assert engine_writes(report) >= 2, str(report)


def test_saved_model_writes_into_its_inputs(tmp_path):
    model = TwoStates()
    inputs = state_inputs()
    path = tmp_path / "states.pt"
    torch.jit.save(blade.optimize(model, clones(inputs)), str(path))
    loaded = torch.jit.load(str(path))
    assert len(loaded.blade_engine_0.writes().split(";")) == 2
    assert_writes_like_eager(model, loaded, inputs)
    assert_ran_compiled(loaded)


class AddInto(torch.nn.Module):
    def forward(self, x, y):
        x.add_(y)
        return x * 2.0


def test_inputs_sharing_memory_with_a_written_one_run_the_model_as_it_was():
    """The engine computes x's new value from the inputs as they were when it started: eager's
    only when y shares no memory with x. The guard sends other inputs to the unspecialized
    model."""
    model = AddInto()
    optimized = blade.optimize(model, (torch.randn(6), torch.randn(6)))
    assert_writes_like_eager(model, optimized, (torch.randn(6), torch.randn(6)))
    assert_ran_compiled(optimized)
    x = torch.randn(6)
    mine, theirs = x.clone(), x.clone()
    with torch.no_grad():
        assert_same(optimized(mine, mine), model(theirs, theirs))
    torch.testing.assert_close(mine, theirs)
    x = torch.randn(9)   # a partial overlap, which eager refuses
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        model(x[:6], x[3:9])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        optimized(x[:6], x[3:9])
    report = blade.report(optimized)
    assert report.guard_fallbacks == 2 and "shares memory" in report.guard_status, str(report)
    disjoint = torch.randn(12)   # views of one tensor that do not overlap are let in
    mine, theirs = (disjoint[:6].clone(), disjoint[6:].clone()), (disjoint[:6], disjoint[6:])
    with torch.no_grad():
        assert_same(optimized(disjoint[:6], disjoint[6:]), model(*mine))
    assert blade.report(optimized).guard_fallbacks == 2


def test_memory_shared_through_another_storage_is_seen_too():
    import numpy

    model = AddInto()
    optimized = blade.optimize(model, (torch.randn(6), torch.randn(6)))
    memory = numpy.random.rand(6).astype(numpy.float32)
    expected = torch.from_numpy(memory.copy())
    # two tensors, two storages, one memory
    x, y = torch.from_numpy(memory), torch.from_numpy(memory)
    with torch.no_grad():
        assert_same(optimized(x, y), model(expected, expected))
    torch.testing.assert_close(x, expected)
    report = blade.report(optimized)
    assert report.guard_fallbacks == 1 and "shares memory" in report.guard_status, str(report)


def test_result_that_the_input_cannot_hold_raises_as_in_eager():
    class IntoInts(torch.nn.Module):
        def forward(self, x):
            x.add_(0.5)
            return x

    x = torch.arange(4)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        IntoInts()(x.clone())
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        blade.optimize(IntoInts(), (x.clone(),))


def test_refused_code_still_writes_through_the_subgraph(tmp_path):
    model = TwoStates()
    inputs = state_inputs()
    path = tmp_path / "states.pt"
    torch.jit.save(blade.optimize(model, clones(inputs)), str(path))
    edited = tmp_path / "edited.pt"

    def flip_cpu_features(state, members):
        state[META] = state[META].replace("cpu_features=", "cpu_features=,")
        return state

    assert rewrite_engines(path, edited, flip_cpu_features) == 1
    loaded = torch.jit.load(str(edited))
    assert_writes_like_eager(model, loaded, inputs)
    report = blade.report(loaded)
    assert report.runtime_fallbacks == 2 and "does not match its contents" in \
        report.clusters[0].status, str(report)


@pytest.mark.parametrize("writes", ["7:0", "0:9", "0", "x:1", "0:-1", "0:1;"])
def test_edited_writes_are_refused_at_load(tmp_path, writes):
    model = TwoStates()
    path = tmp_path / "states.pt"
    torch.jit.save(blade.optimize(model, state_inputs()), str(path))
    edited = tmp_path / "edited.pt"

    def edit(state, members):
        lines = [line for line in state[META].splitlines() if not line.startswith("writes=")]
        state[META] = "\n".join(lines + [f"writes={writes}"]) + "\n"
        return state

    assert rewrite_engines(path, edited, edit) == 1
    with pytest.raises(RuntimeError, match="is not 'output:input'"):
        torch.jit.load(str(edited))


def test_a_write_moved_to_another_input_is_refused(tmp_path):
    model = TwoStates()
    path = tmp_path / "states.pt"
    torch.jit.save(blade.optimize(model, state_inputs()), str(path))
    edited = tmp_path / "edited.pt"
    inputs = state_inputs()

    def edit(state, members):
        lines = state[META].splitlines()
        writes = next(line for line in lines if line.startswith("writes="))
        pairs = [p.split(":") for p in writes[len("writes="):].split(";")]
        # the first output written into the other state instead: valid indices, but not
        # what was signed
        pairs[0][1] = pairs[1][1]
        moved = "writes=" + ";".join(":".join(p) for p in pairs)
        state[META] = "\n".join(moved if line == writes else line for line in lines) + "\n"
        return state

    assert rewrite_engines(path, edited, edit) == 1
    loaded = torch.jit.load(str(edited))
    with torch.no_grad():
        loaded(*clones(inputs))
    report = blade.report(loaded)
    assert report.runtime_fallbacks == 1 and "does not match its contents" in \
        report.clusters[0].status, str(report)
