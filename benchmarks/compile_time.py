"""How long `blade.optimize` takes, and its peak memory, on real-model sizes: cold (a new
process, an empty compile cache) and warm (another new process, the same model, the cache
the cold run filled: the model comes whole from the model cache, blade/model_cache.py), and
"code" (the same, with Config(cache_models=False): the compile cache alone spares code
generation, the front end runs). Each measurement runs in a process of its own, so imports
and the compile cache are what a user's next process would see.

    python benchmarks/compile_time.py [--models bert_base,resnet50,gpt2]
    python benchmarks/compile_time.py --check-cost [--models ew_chain,mlp] [--rounds 3]

bert_base: 12 nn.TransformerEncoderLayer(768, 12, 3072) with distinct weights, [1,128,768];
resnet50: a bottleneck ResNet-50, [1,3,224,224]; gpt2: 12 GPT-2-sized decoder blocks
compiled with a dynamic sequence length (Config(dynamic_dims={0: [1]})). The times include
importing the compiler (torch-mlir), as a user's first optimize in a process does (from
Python's bytecode cache, which a first run fills).

`--check-cost` measures what the engine check (Config.check_engines, blade/self_check.py)
adds to a cold optimize of each benchmark workload (default: all of run.py's): new processes
with the check on and off, alternating, `--rounds` of each; the ratio of the medians, and
the check's own seconds as the report counts them.
"""
import argparse
import json
import statistics
import sys
import tempfile

from child import run_child

# Runs in the child: optimize one model once, print what was measured as JSON.
CHILD = """
from workloads import build
model, inputs = build({name!r})
start = time.perf_counter()
import blade
config = blade.Config(cache_dir={cache!r}, dynamic_dims={dynamic_dims!r}, check_engines={check!r},
                      cache_models={cache_models!r})
optimized = blade.optimize(model, inputs, config)
seconds = time.perf_counter() - start
report = blade.report(optimized)
with torch.no_grad():
    diff = (optimized(*inputs) - model(*inputs)).abs().max().item()
print(json.dumps({{"seconds": seconds, "peak_mb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "coverage": report.coverage,
    "engines": len(report.clusters), "compiled": sum(c.code == "compiled"
    for c in report.clusters), "max_diff": diff, "check_seconds": report.check_seconds}}))
"""

DYNAMIC = {"gpt2": {0: [1]}}


def measure(name: str, cache: str, check: bool = True, cache_models: bool = True) -> dict:
    code = CHILD.format(name=name, cache=cache, dynamic_dims=DYNAMIC.get(name), check=check,
                        cache_models=cache_models)
    try:
        output = run_child(code)
    except RuntimeError as e:
        raise RuntimeError(f"{name}: {e}") from None
    return json.loads(output.strip().splitlines()[-1])


def check_cost(models, rounds: int) -> None:
    print(f"{'workload':<14} {'check off s':>11} {'check on s':>10} {'ratio':>6} "
          f"{'check s':>8}")
    ratios = []
    for name in models:
        times = {False: [], True: []}
        checking = []
        for _ in range(rounds):
            for check in (False, True):
                m = measure(name, "off", check)
                times[check].append(m["seconds"])
                if check:
                    checking.append(m["check_seconds"])
        off, on = statistics.median(times[False]), statistics.median(times[True])
        ratios.append(on / off)
        print(f"{name:<14} {off:>11.2f} {on:>10.2f} {on / off:>6.2f} "
              f"{statistics.median(checking):>8.2f}", flush=True)
    print(f"largest ratio: {max(ratios):.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None)
    parser.add_argument("--check-cost", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # Python's bytecode cache filled, as a user's first `import blade` leaves it (child.py).
    run_child("import blade.compiler, blade.codegen.driver")
    if args.check_cost:
        from workloads import WORKLOADS

        check_cost(args.models.split(",") if args.models else list(WORKLOADS), args.rounds)
        return 0
    args.models = args.models or "bert_base,resnet50,gpt2"
    print(f"{'model':<10} {'run':<5} {'optimize s':>10} {'peak MB':>8} {'engines':>8} "
          f"{'compiled':>8} {'coverage':>8} {'max diff':>9}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            for run in ("cold", "warm", "code"):
                m = measure(name, cache, cache_models=run != "code")
                print(f"{name:<10} {run:<5} {m['seconds']:>10.2f} {m['peak_mb']:>8.0f} "
                      f"{m['engines']:>8} {m['compiled']:>8} {100 * m['coverage']:>7.1f}% "
                      f"{m['max_diff']:>9.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
