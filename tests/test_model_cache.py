"""Whole optimized models are reused (python/blade/model_cache.py): a second optimize of the
same model on the same inputs with the same Config skips everything after scripting, shares
the model's weights as a cold optimize does, and any change to what the result depends on,
or a damaged entry, is a miss."""
import io
import os
import subprocess
import sys
import textwrap
from typing import List

import pytest
import torch

import blade
import blade.frontend.pipeline
from blade.model_cache import SUFFIX, wait_for_writes
from helpers import assert_same, count_calls


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.conv = torch.nn.Conv1d(8, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm1d(8)  # folded into the conv: a tensor optimize makes

    def forward(self, x):
        return self.layer(x) + self.norm(self.conv(x.transpose(1, 2)[:, :8])).sum()


def block(seed=0):
    torch.manual_seed(seed)
    model = Block().eval()
    with torch.no_grad():
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    return model


def model_entries(directory):
    wait_for_writes()
    return sorted(directory.glob(f"*/*{SUFFIX}"))


@pytest.fixture
def front_ends(monkeypatch):
    """Counts the optimizes that went past the model cache (froze and compiled)."""
    return count_calls(monkeypatch, blade.frontend.pipeline, "run")


def optimize_and_compare(model, x, config):
    optimized = blade.optimize(model, (x,), config)
    with torch.no_grad():
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters and all(c.compiled for c in report.clusters), str(report)
    for cluster in report.clusters:
        engine = getattr(optimized, cluster.name)
        assert engine.is_compiled() and engine.calls() == 1, engine.load_error()
    assert report.runtime_fallbacks == 0 and not report.compile_errors, str(report)
    return optimized, report


def test_the_same_model_again_is_taken_whole_and_shares_the_weights(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = block(), torch.randn(2, 10, 32)
    _, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 1 and report.model_cache == ""
    assert len(model_entries(tmp_path)) == 1
    optimized, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 1 and report.model_cache == "hit"
    assert "whole from the model cache" in str(report)
    # The engines read the model's own tensors (the folded conv weight aside), as a cold
    # optimize's do: nothing of the model is copied.
    storages = {t.untyped_storage().data_ptr()
                for t in [*model.parameters(), *model.buffers()]}
    params = [p for c in report.clusters for p in getattr(optimized, c.name).params()]
    shared = [p for p in params if p.untyped_storage().data_ptr() in storages]
    assert len(shared) >= len(params) - 2 and len(shared) >= 8, (len(shared), len(params))
    # Freezing keeps nn.MultiheadAttention's packed weight as an attribute; only the engine
    # reads it, so neither the cold optimize's module nor the hit's holds it.
    assert not optimized._c.getattr("layer").getattr("self_attn").hasattr("in_proj_weight")


class Listed(torch.nn.Module):
    """Weights in a list attribute: keyed, and shared on a hit, like any other."""

    def __init__(self):
        super().__init__()
        self.weights = [torch.randn(16, 16), torch.randn(16)]

    def forward(self, x):
        return torch.tanh(torch.nn.functional.linear(x, self.weights[0], self.weights[1]))


def test_weights_in_a_list_are_the_model_s_on_a_hit(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    torch.manual_seed(0)
    model, x = Listed().eval(), torch.randn(4, 16)
    optimize_and_compare(model, x, config)
    optimized, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 1 and report.model_cache == "hit"
    params = getattr(optimized, report.clusters[0].name).params()
    assert model.weights[0].data_ptr() in {p.data_ptr() for p in params}


class Experts(torch.nn.Module):
    """A list of weights indexed by an input: freezing leaves the list a constant."""

    def __init__(self):
        super().__init__()
        self.weights: List[torch.Tensor] = [torch.randn(16, 16) for _ in range(3)]

    def forward(self, x, i: int):
        return torch.tanh(x @ self.weights[i])


def test_tensors_in_a_list_constant_are_not_kept(tmp_path, front_ends):
    # The entry would hold copies of them, where the model's own must be read.
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = Experts().eval(), torch.randn(4, 16)
    for _ in range(2):
        optimized = blade.optimize(model, (x, 1), config)
        with torch.no_grad():
            assert_same(optimized(x, 1), model(x, 1))
        assert "list, tuple or dict" in blade.report(optimized).model_cache
    assert front_ends["n"] == 2 and not model_entries(tmp_path)


class Forked(torch.nn.Module):
    def forward(self, x):
        return torch.jit.wait(torch.jit.fork(_doubled, x)) + 1


def _doubled(x):
    return x * 2


def test_what_the_graph_does_not_show_is_not_kept(tmp_path, front_ends):
    # A forked function's body is not in forward's graph, so it could change unseen.
    config = blade.Config(cache_dir=str(tmp_path))
    optimized = blade.optimize(Forked(), (torch.randn(4),), config)
    assert blade.report(optimized).model_cache.startswith("not kept: forward runs what")
    assert not model_entries(tmp_path)


def test_the_default_dtype_is_in_the_key(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = Branchy().eval(), torch.rand(4, 16)
    optimize_and_compare(model, x, config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _, report = optimize_and_compare(model, x, config)
    finally:
        torch.set_default_dtype(previous)
    assert front_ends["n"] == 2 and report.model_cache == ""


def test_weights_that_torchscript_reads_are_the_model_s(tmp_path, front_ends):
    # With linear left to TorchScript, its weights stay graph constants of the optimized
    # model: the entry holds markers, and the hit the model's tensors.
    config = blade.Config(cache_dir=str(tmp_path), excluded_ops=["aten::linear"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()
    x = torch.randn(4, 16)
    optimize_and_compare(model, x, config)
    optimized, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 1 and report.model_cache == "hit"
    constants = blade._C.tensor_constants(optimized.graph)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len([c for c in constants if c.untyped_storage().data_ptr() in storages]) >= 4


def test_inputs_unlike_the_examples_still_run_the_model_s_weights(tmp_path, front_ends):
    # The graph under the input guard (the unspecialized model) reads weights through
    # constants and kept submodule attributes, which the entry holds as markers.
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = block(), torch.randn(2, 10, 32)
    optimize_and_compare(model, x, config)
    optimized, report = optimize_and_compare(model, x, config)
    assert report.model_cache == "hit"
    other = torch.randn(3, 7, 32)
    with torch.no_grad():
        expected = model(other)
    # Under grad mode too: the weights the hit put back are no autograd views (as the
    # frozen constants of a cold optimize are not).
    result = optimized(other)
    assert not result.requires_grad
    assert_same(result, expected, rtol=1e-4, atol=1e-5)
    assert blade.report(optimized).guard_fallbacks == 1
    params = [p for c in report.clusters for p in getattr(optimized, c.name).params()]
    assert not any(p.requires_grad or p.grad_fn is not None for p in params)


@pytest.mark.parametrize("change", ["weight", "buffer", "config", "input shape"])
def test_any_change_is_a_miss(tmp_path, front_ends, change):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = block(), torch.randn(2, 10, 32)
    optimize_and_compare(model, x, config)
    if change == "weight":
        with torch.no_grad():
            model.layer.linear1.weight[0, 0] += 1
    elif change == "buffer":
        with torch.no_grad():
            model.norm.running_var[0] += 1
    elif change == "config":
        config = blade.Config(cache_dir=str(tmp_path), min_cluster_size=2)
    else:
        x = torch.randn(2, 11, 32)
    _, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 2 and report.model_cache == ""


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        if bool(x.sum() > 0):
            return torch.relu(self.fc(x))
        return torch.tanh(self.fc(x)) * 2


def test_example_values_that_take_another_branch_are_a_miss(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    model = Branchy().eval()
    positive = torch.rand(4, 16)
    optimize_and_compare(model, positive, config)
    optimized, report = optimize_and_compare(model, -positive, config)
    assert front_ends["n"] == 2 and report.model_cache == ""
    optimized, report = optimize_and_compare(model, positive, config)
    assert front_ends["n"] == 2 and report.model_cache == "hit"


@pytest.mark.parametrize("damage", ["flipped", "truncated", "garbage"])
def test_a_damaged_entry_is_a_miss_and_written_again(tmp_path, front_ends, damage):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = block(), torch.randn(2, 10, 32)
    optimize_and_compare(model, x, config)
    (entry,) = model_entries(tmp_path)
    data = entry.read_bytes()
    entry.write_bytes({"flipped": data[:300] + bytes([data[300] ^ 1]) + data[301:],
                       "truncated": data[:len(data) // 2],
                       "garbage": os.urandom(len(data))}[damage])
    _, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 2 and report.model_cache == ""
    assert model_entries(tmp_path) == [entry]  # written again, whole: the next is a hit
    _, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 2 and report.model_cache == "hit"


def test_code_gone_from_the_compile_cache_is_a_miss(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = block(), torch.randn(2, 10, 32)
    optimize_and_compare(model, x, config)
    for code in tmp_path.glob("*/*.code"):
        code.unlink()
    _, report = optimize_and_compare(model, x, config)
    assert front_ends["n"] == 2 and report.model_cache == "" and \
        report.clusters[0].code == "compiled"


def test_a_hit_saves_and_loads_in_another_process(tmp_path):
    config = blade.Config(cache_dir=str(tmp_path / "cache"))
    model, x = block(), torch.randn(2, 10, 32)
    optimize_and_compare(model, x, config)
    optimized, report = optimize_and_compare(model, x, config)
    assert report.model_cache == "hit"
    buffer = io.BytesIO()
    torch.jit.save(optimized, buffer)
    path = tmp_path / "model.pt"
    path.write_bytes(buffer.getvalue())
    torch.save((x, model(x).detach()), tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import torch, blade
        x, expected = torch.load({str(tmp_path / "io.pt")!r})
        loaded = torch.jit.load({str(path)!r})
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=1e-4, atol=1e-5)
        report = blade.report(loaded)
        assert all(getattr(loaded, c.name).is_compiled() for c in report.clusters), str(report)
        assert report.runtime_fallbacks == 0, str(report)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def test_what_cannot_be_keyed_is_not_kept(tmp_path, front_ends):
    config = blade.Config(cache_dir=str(tmp_path))
    model, x = Branchy().eval(), torch.randn(4, 16)

    @blade.register_decomposition("aten::tanh")
    def tanh(a: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(2 * a) * 2 - 1

    try:
        optimize_and_compare(model, -x.abs(), config)
        _, report = optimize_and_compare(model, -x.abs(), config)
    finally:
        blade.unregister_decomposition("aten::tanh")
    assert front_ends["n"] == 2 and not model_entries(tmp_path)
    assert report.model_cache == "not kept: a user decomposition is registered"
    assert "model cache: not kept: a user decomposition" in str(report)
    # Nor is anything with the model cache off, or the compile cache.
    for off in (blade.Config(cache_dir=str(tmp_path), cache_models=False),
                blade.Config(cache_dir="off")):
        optimize_and_compare(model, x, off)
    assert front_ends["n"] == 4 and not model_entries(tmp_path)


def test_model_entries_count_towards_the_cache_bound(tmp_path):
    config = blade.Config(cache_dir=str(tmp_path))
    x = torch.randn(2, 10, 32)
    for seed in range(4):  # the same code, four entries
        optimize_and_compare(block(seed), x, config)
    entries = model_entries(tmp_path)
    total = sum(p.stat().st_size for p in tmp_path.glob("*/*") if p.is_file())
    # Room for what is there and half an entry more: the fifth model's entry evicts one.
    bound = total + entries[0].stat().st_size // 2
    bounded = blade.Config(cache_dir=str(tmp_path), cache_max_bytes=bound)
    oldest = min(entries, key=lambda p: p.stat().st_mtime)
    optimize_and_compare(block(seed=4), x, bounded)
    after = model_entries(tmp_path)
    assert sum(p.stat().st_size for p in tmp_path.glob("*/*") if p.is_file()) <= bound
    assert len(after) == 4 and oldest not in after  # the least recently used went first
    # An entry that would take more than a quarter of the bound is not written at all.
    small = blade.Config(cache_dir=str(tmp_path), cache_max_bytes=bound // 8)
    _, report = optimize_and_compare(block(seed=5), x, small)
    assert report.model_cache.startswith("not kept: its entry would take")
