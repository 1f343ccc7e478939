"""The runtime in a service: many threads, many calls, engines from a future Blade."""
import threading

import pytest
import torch

import blade
from blade import _C
from helpers import TanhChain, assert_same, bump_format_version, save_tampered


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(self.fc(x))) * torch.sigmoid(x.sum(-1, True))


def optimized_block():
    torch.manual_seed(0)
    model = Block().eval()
    optimized = blade.optimize(model, (torch.randn(8, 16),))
    assert blade.report(optimized).coverage == 1.0
    return model, optimized


def test_one_module_called_from_four_threads():
    model, optimized = optimized_block()
    inputs = [torch.randn(8, 16) for _ in range(16)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
    errors = []

    def worker(seed):
        try:
            for i in range(500):
                k = (seed * 7 + i) % len(inputs)
                torch.testing.assert_close(optimized(inputs[k]), expected[k], atol=1e-5,
                                           rtol=1e-5)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    report = blade.report(optimized)
    assert report.clusters[0].calls == 2000 and report.runtime_fallbacks == 0


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_repeated_calls_do_not_grow_memory():
    _, optimized = optimized_block()
    x = torch.randn(8, 16)
    with torch.no_grad():
        for _ in range(500):  # warm-up: allocator caches, lazy initialization
            optimized(x)
        live = _C.live_allocations()
        before = resident_bytes()
        for _ in range(10_000):
            optimized(x)
        growth = resident_bytes() - before
    assert growth < 5 * 1024 * 1024, f"resident memory grew by {growth / 1e6:.1f} MB"
    # Every intermediate buffer the generated code allocated was freed.
    assert _C.live_allocations() == live


def save_from_the_future(tmp_path, config):
    """A saved model whose engine claims a format version this runtime does not know."""
    path, x, changed = save_tampered(tmp_path, config, bump_format_version)
    assert changed == 1
    return path, x


def test_engine_format_from_the_future_falls_back(tmp_path):
    path, x = save_from_the_future(tmp_path, None)
    loaded = torch.jit.load(str(path))
    assert_same(loaded(x), TanhChain()(x))
    cluster = blade.report(loaded).clusters[0]
    assert cluster.fallbacks == 1 and "format" in cluster.status, cluster


def test_engine_format_from_the_future_raises_in_error_mode(tmp_path):
    path, _ = save_from_the_future(tmp_path, blade.Config(fallback="error"))
    with pytest.raises(RuntimeError, match="format"):
        torch.jit.load(str(path))
