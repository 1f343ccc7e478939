"""Saved optimized models reload and run compiled in a fresh process with only `import blade`."""
import subprocess
import sys
import textwrap

import torch

import blade
from helpers import assert_same


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.gamma = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        h = self.fc(x)
        return torch.softmax(torch.tanh(h) * self.gamma + x, dim=-1)


def test_reload_in_fresh_process_runs_compiled_code(tmp_path):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 16)
    optimized = blade.optimize(model, (x,))
    path = tmp_path / "model.pt"
    torch.jit.save(optimized, str(path))
    with torch.no_grad():
        torch.save((x, model(x)), str(tmp_path / "io.pt"))
    script = textwrap.dedent(f"""
        import sys, torch, blade
        model = torch.jit.load({str(path)!r})
        x, expected = torch.load({str(tmp_path / 'io.pt')!r})
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        report = blade.report(model)
        assert report.clusters and report.clusters[0].calls == 1, report
        assert report.runtime_fallbacks == 0, report
        assert "torch_mlir" not in sys.modules, "loading must not import the compiler"
        print("reloaded-ok", report.compiled_ops)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "reloaded-ok" in proc.stdout
    # Nothing was written next to the process (the code is loaded from memory).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["io.pt", "model.pt"]


def test_reload_in_same_process_matches(tmp_path):
    torch.manual_seed(1)
    model = Block().eval()
    x = torch.randn(4, 16)
    path = tmp_path / "m.pt"
    torch.jit.save(blade.optimize(model, (x,)), str(path))
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        assert_same(loaded(x), model(x))
    assert blade.report(loaded).clusters[0].calls == 1


def test_each_weight_is_saved_once(tmp_path):
    """The graph around the engines (the unspecialized model that other inputs run, above
    all) reads its weights from the engines that hold them, views of them included
    (MultiheadAttention's q/k/v chunks): the saved file is about the size of the frozen
    TorchScript model, and both paths give eager's results after loading."""
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True) for _ in range(2)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(2, 16, 256)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    with torch.no_grad():
        plain = torch.jit.freeze(torch.jit.trace(model, (x,)))
    plain_path, path = tmp_path / "plain.pt", tmp_path / "model.pt"
    torch.jit.save(plain, str(plain_path))
    torch.jit.save(optimized, str(path))
    assert path.stat().st_size <= 1.1 * plain_path.stat().st_size, \
        (path.stat().st_size, plain_path.stat().st_size)
    loaded = torch.jit.load(str(path))
    other = torch.randn(3, 5, 256)  # not the example's sizes: the unspecialized model runs
    with torch.no_grad():
        assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-4)
        assert_same(loaded(other), model(other), rtol=1e-4, atol=1e-4)
    report = blade.report(loaded)
    assert report.guard_fallbacks == 1 and report.clusters[0].calls == 1, str(report)
    assert report.runtime_fallbacks == 1  # the guard's, for `other`


def test_loaded_model_holds_each_weight_once(tmp_path):
    """After loading, the graph's code holds no copy of a weight (it reads them from the
    engines, which share storage where one weight is a view of another), and the saved
    code's branches are functions (csrc/passes/outline_branches.h: compiling them at load
    is linear in the code)."""
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True) for _ in range(2)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(2, 8, 64)
    path = tmp_path / "model.pt"
    torch.jit.save(blade.optimize(model, (x,), blade.Config(cache_dir="off")), str(path))
    loaded = torch.jit.load(str(path))
    code, constants = loaded.code_with_constants
    assert not [t for t in constants.const_mapping.values()
                if isinstance(t, torch.Tensor) and t.numel() > 1], "a weight in the code"
    assert "blade_branches" in code
    storages = {}
    for cluster in blade.report(loaded).clusters:
        for p in getattr(loaded, cluster.name).params():
            if isinstance(p, torch.Tensor):
                storages[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(storages.values()) <= 1.01 * weights, (sum(storages.values()), weights)
    with torch.no_grad():
        assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-4)
