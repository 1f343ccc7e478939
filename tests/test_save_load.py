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
