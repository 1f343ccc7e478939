"""Blade quickstart: optimize a small model, inspect what was compiled, measure it against
eager, save it, and reload it in a fresh process.

Run with `make demo` (which sets everything up first).
"""
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

import blade


class GatedMLP(torch.nn.Module):
    """Linear layers (library calls into oneDNN from the compiled code) around elementwise
    and activation chains the compiled code fuses."""

    def __init__(self, dim=256, hidden=1024):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.gate_bias = torch.nn.Parameter(torch.randn(hidden) * 0.1)

    def forward(self, x):
        h = self.up(x)
        h = torch.nn.functional.gelu(h * 1.702 + self.gate_bias) * torch.sigmoid(h) + h * 0.5
        y = self.down(h)
        return torch.softmax(torch.tanh(y) * 2.0 + x, dim=-1)


def median_ms(fn, x, runs=50):
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = GatedMLP().eval()
    x = torch.randn(64, 256)

    start = time.perf_counter()
    optimized = blade.optimize(model, (x,))
    compile_s = time.perf_counter() - start
    report = blade.report(optimized)
    print(report)
    print(f"\ncompiled {report.compiled_ops} of {report.total_ops} tensor ops "
          f"in {len(report.clusters)} clusters ({compile_s:.2f} s)")
    for kind, entry in report.unsupported.items():
        print(f"fell back: {kind} x{entry.count}: {entry.reasons[0]}")

    with torch.no_grad():
        expected = model(x)
        actual = optimized(x)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        eager_ms = median_ms(model, x)
        blade_ms = median_ms(optimized, x)
    print(f"\nmedian of 50 runs: eager {eager_ms:.3f} ms, blade {blade_ms:.3f} ms "
          f"(blade/eager = {blade_ms / eager_ms:.2f})")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gated_mlp.pt"
        torch.jit.save(optimized, str(path))
        torch.save((x, expected), str(Path(tmp) / "io.pt"))
        check = textwrap.dedent(f"""
            import torch, blade
            model = torch.jit.load({str(path)!r})
            x, expected = torch.load({str(Path(tmp) / 'io.pt')!r})
            torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
            r = blade.report(model)
            assert r.runtime_fallbacks == 0 and all(c.calls == 1 for c in r.clusters)
            print("fresh process: reloaded model matches eager, engines ran compiled code")
        """)
        out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"reload in a fresh process failed:\n{out.stderr}")
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
