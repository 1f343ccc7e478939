"""What a saved Blade model costs to keep and to load, against the same model frozen and
saved by TorchScript: the saved file's size, `torch.jit.load`'s time, and the resident
memory the loaded model adds (RSS after the load and after 3 calls, less RSS before).
Every load runs in a fresh process (medians over --runs of them), as a service's would.
Blade is measured twice: as it runs by default, and with
`blade.set_prepared_weights_limit(0)` (no prepared weight copies: memory over speed), each
with the time of a call after those 3 and the weight memory its engines gave back (read only
through their oneDNN copies: csrc/ral/prepared_weights.h).

    python benchmarks/footprint.py [--models bert_base,resnet50] [--runs 3]

bert_base: 12 nn.TransformerEncoderLayer(768, 12, 3072) with distinct weights, [1,128,768];
resnet50: a bottleneck ResNet-50, [1,3,224,224] (benchmarks/workloads.py). The models are
optimized and saved once, in a process of their own, with the compile cache off.
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from child import run_child

SAVE = """
import blade
from workloads import build
model, inputs = build({name!r})
with torch.no_grad():
    torch.jit.save(torch.jit.freeze(torch.jit.trace(model, inputs)), {plain!r})
torch.jit.save(blade.optimize(model, inputs, blade.Config(cache_dir="off")), {blade!r})
torch.save(inputs, {inputs!r})
"""

# Runs in a fresh process: load one saved model, call it 3 times, print what was measured.
LOAD = """
import blade


def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024


inputs = torch.load({inputs!r})
if {no_copies!r}:
    blade.set_prepared_weights_limit(0)
before = rss_mb()
start = time.perf_counter()
model = torch.jit.load({path!r})
seconds = time.perf_counter() - start
after_load = rss_mb()
with torch.no_grad():
    for _ in range(3):
        model(*inputs)
    calls_mb = rss_mb() - before
    released = 0
    if model._c.hasattr("_blade_report"):
        released = sum(getattr(model, c.name).released_bytes()
                       for c in blade.report(model).clusters if c.compiled)
    start = time.perf_counter()
    for _ in range(5):
        model(*inputs)
print(json.dumps({{"seconds": seconds, "load_mb": after_load - before, "calls_mb": calls_mb,
                  "call_ms": (time.perf_counter() - start) / 5 * 1e3,
                  "given_back_mb": released / 1e6}}))
"""


def measure_loads(path: Path, inputs: Path, runs: int, no_copies: bool = False) -> dict:
    code = LOAD.format(path=str(path), inputs=str(inputs), no_copies=no_copies)
    samples = [json.loads(run_child(code)) for _ in range(runs)]
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert_base,resnet50")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':<27} {'file MB':>14} {'load s':>7} {'RSS after load MB':>20} "
          f"{'after 3 calls MB':>20} {'ms/call':>8} {'given back MB':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            paths = {kind: Path(tmp) / f"{name}_{kind}.pt" for kind in ("plain", "blade")}
            inputs = Path(tmp) / f"{name}_inputs.pt"
            run_child(SAVE.format(name=name, plain=str(paths["plain"]),
                                  blade=str(paths["blade"]), inputs=str(inputs)))
            measure_loads(paths["blade"], inputs, 1)  # the page cache
            plain = measure_loads(paths["plain"], inputs, args.runs)
            size = {kind: path.stat().st_size / 1e6 for kind, path in paths.items()}
            rows = [("TorchScript", plain, size["plain"]),
                    ("Blade", measure_loads(paths["blade"], inputs, args.runs), size["blade"]),
                    ("Blade, no copies", measure_loads(paths["blade"], inputs, args.runs,
                                                       no_copies=True), size["blade"])]
            for label, m, mb in rows:
                print(f"{name + ' ' + label:<27} {mb:6.0f} ({mb / size['plain']:.3f}x)"
                      f" {m['seconds']:7.2f}"
                      f" {m['load_mb']:11.0f} ({m['load_mb'] / plain['load_mb']:.2f}x)"
                      f" {m['calls_mb']:11.0f} ({m['calls_mb'] / plain['calls_mb']:.2f}x)"
                      f" {m['call_ms']:8.1f} {m['given_back_mb']:14.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
