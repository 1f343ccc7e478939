"""What a saved Blade model costs to keep and to load, against the same model frozen and
saved by TorchScript: the saved file's size, `torch.jit.load`'s time, and the resident
memory the loaded model adds (RSS after the load and after 3 calls, less RSS before).
Every load runs in a fresh process (medians over --runs of them), as a service's would.

    python benchmarks/footprint.py [--models bert_base,resnet50] [--runs 3]

bert_base: 12 nn.TransformerEncoderLayer(768, 12, 3072) with distinct weights, [1,128,768];
resnet50: a bottleneck ResNet-50, [1,3,224,224] (benchmarks/workloads.py). The models are
optimized and saved once, in a process of their own, with the compile cache off.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

SAVE = """
import sys, warnings
sys.path.insert(0, {here!r})
warnings.filterwarnings("ignore", message=r"`torch\\\\.jit\\\\.\\\\w+` is deprecated")
import torch
torch.set_num_threads(2)
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
import json, time, warnings
warnings.filterwarnings("ignore", message=r"`torch\\\\.jit\\\\.\\\\w+` is deprecated")
import torch
torch.set_num_threads(2)
import blade


def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024


inputs = torch.load({inputs!r})
before = rss_mb()
start = time.perf_counter()
model = torch.jit.load({path!r})
seconds = time.perf_counter() - start
after_load = rss_mb()
with torch.no_grad():
    for _ in range(3):
        model(*inputs)
print(json.dumps({{"seconds": seconds, "load_mb": after_load - before,
                  "calls_mb": rss_mb() - before}}))
"""


def run_child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return done.stdout


def measure_loads(path: Path, inputs: Path, runs: int) -> dict:
    samples = [json.loads(run_child(LOAD.format(path=str(path), inputs=str(inputs))))
               for _ in range(runs)]
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert_base,resnet50")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("model       file MB (x plain)   load s (plain)   RSS after load MB (x plain)   "
          "after 3 calls MB (x plain)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            paths = {kind: Path(tmp) / f"{name}_{kind}.pt" for kind in ("plain", "blade")}
            inputs = Path(tmp) / f"{name}_inputs.pt"
            run_child(SAVE.format(here=str(HERE), name=name, plain=str(paths["plain"]),
                                  blade=str(paths["blade"]), inputs=str(inputs)))
            run_child(LOAD.format(path=str(paths["blade"]), inputs=str(inputs)))  # page cache
            plain = measure_loads(paths["plain"], inputs, args.runs)
            ours = measure_loads(paths["blade"], inputs, args.runs)
            size = {kind: path.stat().st_size / 1e6 for kind, path in paths.items()}
            print(f"{name:<10} {size['blade']:8.0f} ({size['blade'] / size['plain']:.3f}x)"
                  f"   {ours['seconds']:6.2f} ({plain['seconds']:.2f})"
                  f"   {ours['load_mb']:14.0f} ({ours['load_mb'] / plain['load_mb']:.2f}x)"
                  f"   {ours['calls_mb']:20.0f} ({ours['calls_mb'] / plain['calls_mb']:.2f}x)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
