"""Weights as engine params, prepared once: module tensors freezing left as attributes are
folded into constants when nothing writes them, a linear layer's weight is packed for MKL's
GEMM on the first call, and the intermediate buffers of one call are reused by the next."""
import pytest
import torch

import blade
from blade import _C
from helpers import GeluMlp, assert_same, run_compiled


def test_transformer_layer_weights_become_params_and_are_packed():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    x = torch.randn(2, 8, 64)
    optimized, report = run_compiled(model, (x,), rtol=1e-4, atol=1e-5)
    # nn.MultiheadAttention's in_proj_weight/bias stayed attributes after freezing (they
    # are put in a tuple); folded, the engine's only input is the activation.
    assert [c.inputs for c in report.clusters] == ["float32[2,8,64]"], str(report)
    # in_proj, out_proj, linear1 and linear2 multiply by a weight: the first calls (the
    # compile-time check's included) alternate between oneDNN's 1x1 convolution by a
    # reordered copy of the weight and a GEMM on the weight as it is (MKL's sgemm; on an
    # AVX-512 CPU blocked_gemm on a [K, N] copy, these weights being small), then keep the
    # faster, and the loser's copy is freed.
    assert report.clusters[0].packed_weights <= 2 * 4, str(report)
    with torch.no_grad():
        for _ in range(_C.kernel_trial_calls()):
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    copies = report.clusters[0].packed_weights
    assert copies <= 4, str(report)
    # Each copy holds a weight in another layout (oneDNN's pads its blocks): about its
    # weight's own bytes again, which the report says.
    largest = max(p.numel() * p.element_size() for name, p in model.named_parameters()
                  if name.endswith("weight") and p.dim() == 2)
    assert report.clusters[0].prepared_bytes <= 2 * largest * copies, str(report)
    assert (report.clusters[0].prepared_bytes > 0) == (copies > 0), str(report)
    assert (f"prepared weight copies: {copies}," in str(report)) == (copies > 0), str(report)


class Counter(torch.nn.Module):
    """An attribute written by forward must stay an attribute (read fresh every call)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1.0)
        return torch.relu(x * self.count + 1.0)


def test_dynamic_batches_pack_a_few_row_counts_and_run_the_rest_unpacked():
    torch.manual_seed(0)
    model = GeluMlp().eval()
    optimized = blade.optimize(model, (torch.randn(8, 32),), blade.Config(dynamic=True))
    with torch.no_grad():
        for batch in (1, 3, 8, 17, 64, 5, 3):
            x = torch.randn(batch, 32)
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 0 and report.clusters[0].calls == 7, str(report)
    # At most 4 row counts each (each count's first call runs an alternative: the trial of
    # oneDNN's copy against it has not ended for any of them), and on AVX-512 CPUs one
    # [K, N] copy each for the row counts past them (blocked_gemm) and one pack each for
    # Blade's float32 tiles (the alternative for more than a few rows there; MKL's sgemm,
    # elsewhere, needs no copy).
    tiles = 1 if _C.f32_conv_available() else 0
    assert report.clusters[0].packed_weights <= 2 * (4 + 1 + tiles), str(report)


def warm_mlp():
    """(model, optimized model, input) after one compiled call, so the cache holds what
    a call frees."""
    torch.manual_seed(0)
    model = GeluMlp().eval()
    optimized = blade.optimize(model, (torch.randn(256, 32),))
    x = torch.randn(256, 32)
    with torch.no_grad():
        optimized(x)
    return model, optimized, x


def test_intermediate_buffers_are_reused_across_calls():
    model, optimized, x = warm_mlp()
    with torch.no_grad():
        cached = _C.cached_bytes()
        live = _C.live_allocations()
        for _ in range(5):
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
        # The [256, 64] intermediate comes from the cache and goes back to it: the cache
        # does not grow with the calls, and nothing stays allocated.
        assert _C.cached_bytes() == cached >= 256 * 64 * 4
        assert _C.live_allocations() == live
    blade.release_cached_memory()
    assert _C.cached_bytes() == 0


def test_cache_limit_bounds_what_is_kept():
    torch.manual_seed(0)
    model = GeluMlp().eval()
    optimized = blade.optimize(model, (torch.randn(256, 32),))
    x = torch.randn(256, 32)
    try:
        blade.set_cached_memory_limit(0)   # nothing kept: every buffer goes back at once
        assert _C.cached_bytes() == 0
        with torch.no_grad():
            for _ in range(3):
                assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
        assert _C.cached_bytes() == 0
    finally:
        blade.set_cached_memory_limit(1 << 30)
    with torch.no_grad():
        optimized(x)
    assert 0 < _C.cached_bytes() <= 1 << 30


class WritesThroughAView(torch.nn.Module):
    """Forward writes its buffer through a view: the buffer must stay an attribute."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(2, 2))

    def forward(self, x):
        self.count.view(-1).add_(1.0)
        return torch.relu(x * self.count.sum() + 1.0)


class Reassigns(torch.nn.Module):
    """Forward assigns a new tensor to its buffer (prim::SetAttr)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count = self.count + 1.0
        return torch.relu(x * self.count + 1.0)


@pytest.mark.parametrize("module", [Counter, WritesThroughAView, Reassigns],
                         ids=["in_place", "through_a_view", "assigned"])
def test_attributes_that_forward_writes_are_not_folded(module):
    model, reference = module().eval(), module().eval()
    x = torch.randn(4, 8)
    optimized = blade.optimize(model, (x,))
    # optimize ran the model, and gave its buffers back as they were
    assert_same(model.count, reference.count)
    with torch.no_grad():
        for _ in range(3):
            assert_same(optimized(x), reference(x))


def test_outputs_come_from_the_cache_and_return_to_it():
    """A static engine's outputs are blocks of the RAL's allocator: freed by the caller,
    they serve the next call's outputs (no fresh pages per call); they are ordinary CPU
    tensors otherwise (resizable, and live while the caller holds them)."""
    model, optimized, x = warm_mlp()
    with torch.no_grad():
        live = _C.live_allocations()
        held = optimized(x)
        assert _C.live_allocations() == live + 1      # the output the caller holds
        del held
        cached = _C.cached_bytes()
        for _ in range(3):
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
        assert _C.cached_bytes() == cached and _C.live_allocations() == live
        y = optimized(x)
        before = y.clone()
        y.resize_(y.shape[0] + 44, y.shape[1])      # grows into a new block, data kept
        assert torch.equal(y[:before.shape[0]], before)
    del y
    assert _C.live_allocations() == live


def test_prepared_copies_stay_under_the_process_limit():
    """With a limit, copies past it are not made and the weights are used as they are;
    the results are the same, and the report counts what was made."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)).eval()
    x = torch.randn(16, 64)
    first = model[0].weight.nbytes
    try:
        for room, copies in [(None, 0), (first, 1)]:
            # (engines of earlier tests may still hold copies: the room is beyond theirs)
            before = _C.prepared_weights_bytes()
            blade.set_prepared_weights_limit(0 if room is None else before + room)
            optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
            with torch.no_grad():
                for _ in range(2):
                    assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
            report = blade.report(optimized)
            assert report.clusters[0].packed_weights == copies, str(report)
            made = report.clusters[0].prepared_bytes
            assert _C.prepared_weights_bytes() - before == made
            assert (made > 0) == (copies > 0)
    finally:
        blade.set_prepared_weights_limit(None)
