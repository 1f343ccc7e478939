"""How long `blade.optimize` takes, and its peak memory, on real-model sizes: cold (a new
process, an empty compile cache) and warm (another new process, the same model, the cache
the cold run filled). Each measurement runs in a process of its own, so imports and the
compile cache are what a user's next process would see.

    python benchmarks/compile_time.py [--models bert_base,resnet50,gpt2]

bert_base: 12 nn.TransformerEncoderLayer(768, 12, 3072) with distinct weights, [1,128,768];
resnet50: a bottleneck ResNet-50, [1,3,224,224]; gpt2: 12 GPT-2-sized decoder blocks
compiled with a dynamic sequence length (Config(dynamic_dims={0: [1]})). The times include
importing the compiler (torch-mlir), as a user's first optimize in a process does.
"""
import argparse
import json
import sys
import tempfile

from child import run_child

# Runs in the child: optimize one model once, print what was measured as JSON.
CHILD = """
from workloads import build
model, inputs = build({name!r})
start = time.perf_counter()
import blade
config = blade.Config(cache_dir={cache!r}, dynamic_dims={dynamic_dims!r})
optimized = blade.optimize(model, inputs, config)
seconds = time.perf_counter() - start
report = blade.report(optimized)
with torch.no_grad():
    diff = (optimized(*inputs) - model(*inputs)).abs().max().item()
print(json.dumps({{"seconds": seconds, "peak_mb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "coverage": report.coverage,
    "engines": len(report.clusters), "compiled": sum(c.code == "compiled"
    for c in report.clusters), "max_diff": diff}}))
"""

DYNAMIC = {"gpt2": {0: [1]}}


def measure(name: str, cache: str) -> dict:
    code = CHILD.format(name=name, cache=cache, dynamic_dims=DYNAMIC.get(name))
    try:
        output = run_child(code)
    except RuntimeError as e:
        raise RuntimeError(f"{name}: {e}") from None
    return json.loads(output.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert_base,resnet50,gpt2")
    args = parser.parse_args()
    print(f"{'model':<10} {'run':<5} {'optimize s':>10} {'peak MB':>8} {'engines':>8} "
          f"{'compiled':>8} {'coverage':>8} {'max diff':>9}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            for run in ("cold", "warm"):
                m = measure(name, cache)
                print(f"{name:<10} {run:<5} {m['seconds']:>10.2f} {m['peak_mb']:>8.0f} "
                      f"{m['engines']:>8} {m['compiled']:>8} {100 * m['coverage']:>7.1f}% "
                      f"{m['max_diff']:>9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
