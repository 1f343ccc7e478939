"""Blade's speed harness: every backend side by side in one process, interleaved
round-robin so that machine drift cancels, 2 threads, medians and p10/p90.

    python benchmarks/run.py [--workloads ew_chain,mlp] [--runs 30] [--json out.json]

The default workloads are the six of `workloads.WORKLOADS`; `workloads.EXTRA_WORKLOADS`
run when named: `--workloads resnet18,unet_decoder,gpt_block` (a whole ResNet-18 at batch
2, 224 x 224; one U-Net level with upsampling and a skip concatenation; a GPT-2 block), and
the real-model sizes `resnet50` ([1,3,224,224]), `bert_base` (12 encoder layers with
distinct weights, [1,128,768]) and `gpt2` (12 GPT-2-sized decoder blocks).

Quote ratios from one run (backend / eager, lower is faster), never absolute times from
different runs: these machines are noisy.
"""
import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import blade  # noqa: E402
from workloads import WORKLOADS, build  # noqa: E402

warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")


def make_backends(model, inputs, names):
    backends, compile_s = {"eager": model}, {"eager": 0.0}
    for name in names:
        if name == "eager":
            continue
        start = time.perf_counter()
        try:
            if name == "torchscript":
                traced = torch.jit.trace(model, inputs, check_trace=False)
                fn = torch.jit.optimize_for_inference(torch.jit.freeze(traced))
            elif name == "inductor":
                fn = torch.compile(model)
            elif name == "blade":
                fn = blade.optimize(model, inputs)
            elif name == "blade_dynamic":  # one engine for every batch/sequence size
                fn = blade.optimize(model, inputs, blade.Config(dynamic=True))
            else:
                raise KeyError(name)
            with torch.no_grad():
                fn(*inputs)  # compiles lazily for inductor; warms up the others
        except Exception as e:  # a backend that cannot take a workload is reported, not fatal
            print(f"  {name}: failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        backends[name] = fn
        compile_s[name] = time.perf_counter() - start
    return backends, compile_s


def max_diff(a, b):
    if isinstance(a, torch.Tensor):
        return (a - b).abs().max().item()
    return max(max_diff(x, y) for x, y in zip(a, b))


def bench(workload, names, runs, warmup):
    model, inputs = build(workload)
    backends, compile_s = make_backends(model, inputs, names)
    times = {name: [] for name in backends}
    with torch.no_grad():
        reference = model(*inputs)
        diffs = {name: max_diff(fn(*inputs), reference) for name, fn in backends.items()}
        for _ in range(warmup):
            for fn in backends.values():
                fn(*inputs)
        for _ in range(runs):
            for name, fn in backends.items():  # round-robin: drift hits every backend alike
                start = time.perf_counter()
                fn(*inputs)
                times[name].append((time.perf_counter() - start) * 1e3)
    rows = {}
    eager = statistics.median(times["eager"])
    for name, samples in times.items():
        q = statistics.quantiles(samples, n=10)
        median = statistics.median(samples)
        rows[name] = {"median_ms": median, "p10_ms": q[0], "p90_ms": q[-1],
                      "ratio_to_eager": median / eager, "compile_s": compile_s[name],
                      "max_abs_diff": diffs[name], "samples_ms": samples}
    for name in ("blade", "blade_dynamic"):
        if name in backends:
            rows[name]["coverage"] = blade.report(backends[name]).coverage
    return rows


class Tiny(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0 + 1.0)


def call_overhead(samples=20000):
    """Microseconds per call on a 4-element input, where the kernel itself takes a few
    nanoseconds: what a call costs beyond its work. `blade engine` is one engine's execute
    (signature check, descriptors, output allocation, the call); `blade module` adds the
    optimized module's TorchScript forward and input guard."""
    model, x = Tiny().eval(), torch.randn(4)
    optimized = blade.optimize(model, (x,))
    engine = getattr(optimized, blade.report(optimized).clusters[0].name)
    scripted = torch.jit.freeze(torch.jit.script(model))
    calls = {"eager": lambda: model(x), "torchscript": lambda: scripted(x),
             "blade module": lambda: optimized(x), "blade engine": lambda: engine.execute([x])}
    times = {name: [] for name in calls}
    with torch.no_grad():
        for fn in calls.values():
            for _ in range(1000):
                fn()
        for _ in range(samples):
            for name, fn in calls.items():
                start = time.perf_counter_ns()
                fn()
                times[name].append((time.perf_counter_ns() - start) / 1e3)
    assert blade.report(optimized).runtime_fallbacks == 0
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--backends", default="torchscript,inductor,blade,blade_dynamic")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--no-overhead", action="store_true",
                        help="skip the per-call overhead measurement")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {}
    header = f"{'workload':<14}{'backend':<13}{'median ms':>10}{'p10':>9}{'p90':>9}" \
             f"{'/eager':>8}{'compile s':>10}{'max diff':>10}"
    print(header)
    for workload in args.workloads.split(","):
        rows = bench(workload, args.backends.split(","), args.runs, args.warmup)
        results[workload] = rows
        for name, r in rows.items():
            note = ""
            if "coverage" in r:  # a Blade number means little if little of it compiled
                note = f"  compiled {100 * r['coverage']:.0f}%"
            print(f"{workload:<14}{name:<13}{r['median_ms']:>10.3f}{r['p10_ms']:>9.3f}"
                  f"{r['p90_ms']:>9.3f}{r['ratio_to_eager']:>8.2f}{r['compile_s']:>10.2f}"
                  f"{r['max_abs_diff']:>10.1e}{note}")
    ratios = [r["blade"]["ratio_to_eager"] for r in results.values() if "blade" in r]
    if ratios:
        geomean = statistics.geometric_mean(ratios)
        print(f"\nblade geometric-mean speedup over eager: {1 / geomean:.2f}x")
    if not args.no_overhead:
        overhead = call_overhead()
        results["call_overhead_us"] = overhead
        print("\nper-call cost on a 4-element input (median us, the kernel itself takes ns): " +
              ", ".join(f"{name} {us:.1f}" for name, us in overhead.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
