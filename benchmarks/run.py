"""Blade's speed harness: every backend side by side in one process, interleaved
round-robin so that machine drift cancels (each timed call right after an untimed one of
the same backend), 2 threads, medians and p10/p90.

    python benchmarks/run.py [--workloads ew_chain,mlp] [--backends blade,openvino] [--runs 30]

Backends: eager, torchscript (traced, frozen, optimize_for_inference), inductor
(torch.compile), blade, blade_dynamic (Config(dynamic=True)), blade_bf16
(Config(precision="bf16"), on CPUs with avx512_bf16; its max diff column is its accuracy
against float32 eager), and the peers of
`peers.py`: onnxruntime, openvino (float32 hint) and openvino_bf16 (OpenVINO's default,
bf16 on this CPU). The workloads are `workloads.WORKLOADS`: the six standard ones and the
real-model sizes resnet50 ([1,3,224,224]; resnet50_b8 at batch 8), bert_base (12 encoder
layers with distinct weights, [1,128,768]), mobilenet (MobileNetV3-Large, [1,3,224,224]),
efficientnet (EfficientNet-B0: MBConv, SiLU, squeeze-excitation, [1,3,224,224]), convnext
(ConvNeXt-Tiny: 7x7 depthwise, LayerNorm over channels, GELU, [1,3,224,224]) and gpt_block;
`workloads.EXTRA_WORKLOADS` run when named.

Each row gives the backend's ratio to eager and, for workloads with GEMMs or
convolutions, the rate it reaches (their FLOPs, counted by torch's FlopCounterMode on the
eager model, per second of the whole call) as a share of the machine's float32 FMA peak,
measured once by `peak.py`. The FLOPs are those of direct convolutions: a backend running
3x3 convolutions by Winograd (Blade, OpenVINO) does fewer, so its share can pass 100%. The
summary table ends with Blade's ratio to the faster
float32 peer (ONNX Runtime or OpenVINO-f32), and Blade's bf16 mode's ratio to OpenVINO's
default (bf16) with its max abs difference from float32 eager, and the shares of the bfloat16
dot-product peak both reach. Beside each ratio to a peer stands the share of the peak that
0.90x that peer's time would take (0.85x for int8): past 100%, that ratio is beyond what
the machine gives the direct computation.

int8: blade_int8 (Config(precision="int8") calibrated on 8 inputs drawn like the
example's) against the int8 peers of `peers.py` (onnxruntime_int8, openvino_int8,
inductor_int8), every one calibrated on the same inputs. The int8 table gives each one's
ratio to eager, Blade int8's ratio to the fastest int8 peer, its share of the int8 peak,
its ratio to Blade float32, and the
cosine similarity of each one's output to float32 eager (Blade int8's, and the best
peer's). `peak.py` measures the int8 limits too: the int8 peak (VNNI's dot product, else
AVX2's pair sums) and the rate of oneDNN's own u8 x s8 GEMM on a large square problem (AMX
where the CPU has it).

`--kernel-choices` lists each Blade backend's kernel trials after the timed calls (every
weight and input size with a second kernel, each kernel's best time, the one kept): the
per-layer choices that the float32 rows of a convolution network rest on.

A backend whose first call writes into its inputs (Inductor's PT2E int8 graph of gpt_block
does) is called on copies from then on, the copies timed with it, and says so: it changed
every later backend's input and eager's reference (all cosines 0.65).

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
from peak import measure_peak_gflops  # noqa: E402
from peers import INT8_PEERS, PEERS, make_peer  # noqa: E402
from workloads import WORKLOADS, build  # noqa: E402

DEFAULT_BACKENDS = ("torchscript", "inductor", "onnxruntime", "openvino", "openvino_bf16",
                    "blade", "blade_dynamic", "blade_bf16", "blade_int8", "onnxruntime_int8",
                    "openvino_int8", "inductor_int8")
BLADE_BACKENDS = ("blade", "blade_dynamic", "blade_bf16", "blade_int8")
# Calibration inputs of every int8 backend, drawn like the workloads' example inputs.
CALIBRATION_SAMPLES = 8
F32_PEERS = ("onnxruntime", "openvino")

warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")


def calibration_inputs(inputs):
    """CALIBRATION_SAMPLES inputs like `inputs` (standard normal, as the workloads' own)."""
    generator = torch.Generator().manual_seed(1)
    return [tuple(torch.randn(x.shape, generator=generator, dtype=x.dtype) for x in inputs)
            for _ in range(CALIBRATION_SAMPLES)]


def kept_off_its_inputs(name, fn, inputs):
    """`fn` after a first call on copies of `inputs` (which compiles lazily for inductor and
    warms up the others), or, where that call wrote into its inputs, a wrapper that hands it
    copies on every call, their time counted: Inductor's PT2E int8 graph of gpt_block wrote
    into its input, which changed every later backend's input and eager's reference."""
    copies = [x.clone() for x in inputs]
    with torch.no_grad():
        fn(*copies)
    if all(torch.equal(copy, x) for copy, x in zip(copies, inputs)):
        return fn
    print(f"  {name}: writes into its inputs; its calls get copies (timed with them)")
    return lambda *args: fn(*(x.clone() for x in args))


def make_backends(model, inputs, names):
    calibration = calibration_inputs(inputs)
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
            elif name == "blade_bf16":  # GEMMs and convolutions in bfloat16
                fn = blade.optimize(model, inputs, blade.Config(precision="bf16"))
            elif name == "blade_int8":
                fn = blade.optimize(model, inputs, blade.Config(precision="int8",
                                                                calibration=calibration))
            elif name in PEERS:
                fn = make_peer(name, model, inputs, calibration)
            else:
                raise KeyError(name)
            fn = kept_off_its_inputs(name, fn, inputs)
        except Exception as e:  # a backend that cannot take a workload is reported, not fatal
            print(f"  {name}: failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        backends[name] = fn
        compile_s[name] = time.perf_counter() - start
    return backends, compile_s


def cosine(a, b) -> float:
    """Cosine similarity of all the outputs, flattened together, in float64."""
    flat = [torch.cat([t.reshape(-1).double() for t in (x if isinstance(x, (tuple, list))
                                                         else (x,))]) for x in (a, b)]
    return float(torch.nn.functional.cosine_similarity(flat[0], flat[1], dim=0))


def max_diff(a, b):
    if isinstance(a, torch.Tensor):
        return (a - b).abs().max().item()
    return max(max_diff(x, y) for x, y in zip(a, b))


def matmul_flops(model, inputs) -> int:
    """FLOPs of the GEMMs, convolutions and attention of one eager call. Counted with
    nn.MultiheadAttention's and the encoder layer's fused fast path off: the counter does
    not see inside those ops, and the same GEMMs run either way."""
    from torch.utils.flop_counter import FlopCounterMode

    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    return counter.get_total_flops()


# Calls by which every kernel trial of an engine has decided (kernel_trials.cpp), and so
# the warmup's least.
TRIAL_CALLS = blade._C.kernel_trial_calls()


def bench(workload, names, runs, warmup):
    model, inputs = build(workload)
    flops = matmul_flops(model, inputs)
    modes = [m.training for m in model.modules()]
    backends, compile_s = make_backends(model, inputs, names)
    if [m.training for m in model.modules()] != modes:
        raise RuntimeError(f"{workload}: building the backends changed the model's "
                           "train/eval mode, so eager would no longer be the reference")
    times = {name: [] for name in backends}
    with torch.no_grad():
        reference = model(*inputs)
        for _ in range(max(warmup, TRIAL_CALLS)):
            for fn in backends.values():
                fn(*inputs)
        # The accuracy of the steady state, after the warmup: a Blade engine's kernel trials
        # run both kernels on their first calls, where the float32 path's result of a bf16
        # engine's precision trial stands.
        outputs = {name: fn(*inputs) for name, fn in backends.items()}
        diffs = {name: max_diff(out, reference) for name, out in outputs.items()}
        cosines = {name: cosine(out, reference) for name, out in outputs.items()}
        for _ in range(runs):
            for name, fn in backends.items():  # round-robin: drift hits every backend alike
                # An untimed call first: the timed one then finds the backend's threads
                # and caches as a service calling it again would, not the previous
                # backend's threads still winding down on the same cores.
                fn(*inputs)
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
                      "max_abs_diff": diffs[name], "cosine": cosines[name],
                      "samples_ms": samples,
                      "gflops": flops / median / 1e6 if flops else None}
    for name in BLADE_BACKENDS:
        if name in backends:
            report = blade.report(backends[name])
            rows[name]["coverage"] = report.coverage
            # After the timed calls, each kernel trial has settled (kernel_trials.cpp).
            rows[name]["kernel_choices"] = [line for c in report.clusters
                                            for line in c.kernel_choices]
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


def share_needed(row, peer_ms, factor, limit):
    """The share of `limit` (a measured peak, per second) that running `row`'s workload in
    `factor` x `peer_ms` would take: its FLOPs (or int8 ops) over that time. Above 1, the
    ratio `factor` to that peer is past what the hardware gives a direct computation."""
    if not row.get("gflops") or not limit or not peer_ms:
        return None
    return row["gflops"] * row["median_ms"] / (factor * peer_ms) / limit


def summary(results, peak):
    """One line per workload: each backend's ratio to eager, Blade's to the faster float32
    peer, and the share of the FMA peak Blade reaches."""
    names = [n for n in ("inductor", "onnxruntime", "openvino", "openvino_bf16", "blade",
                         "blade_bf16")
             if any(n in rows for rows in results.values())]
    lines = ["| workload | " + " | ".join(names) + " | blade / best f32 peer (0.90x needs) | "
             "blade GFLOP/s (% of peak) | blade_bf16 / openvino_bf16 (max diff) |",
             "|---" * (len(names) + 4) + "|"]
    for workload, rows in results.items():
        cells = [f"{rows[n]['ratio_to_eager']:.2f}" if n in rows else "-" for n in names]
        peers = [rows[n]["median_ms"] for n in F32_PEERS if n in rows]
        versus = "-"
        if peers and "blade" in rows:
            versus = f"{rows['blade']['median_ms'] / min(peers):.2f}"
            needed = share_needed(rows["blade"], min(peers), 0.90, peak and peak["gflops"])
            if needed is not None:
                versus += f" ({100 * needed:.0f}% of peak)"
        rate = rows.get("blade", {}).get("gflops")
        rate_text = f"{rate:.0f} ({100 * rate / peak['gflops']:.0f}%)" if rate and peak else "-"
        bf16 = "-"
        if "blade_bf16" in rows and "openvino_bf16" in rows:
            bf16 = f"{rows['blade_bf16']['median_ms'] / rows['openvino_bf16']['median_ms']:.2f}" \
                   f" ({rows['blade_bf16']['max_abs_diff']:.1e})"
            shares = [rows[n]["gflops"] / peak["bf16_gflops"] for n in ("blade_bf16",
                      "openvino_bf16") if rows[n].get("gflops") and peak.get("bf16_gflops")]
            if len(shares) == 2:
                bf16 += f", {100 * shares[0]:.0f}% / {100 * shares[1]:.0f}% of bf16 peak"
                needed = share_needed(rows["blade_bf16"], rows["openvino_bf16"]["median_ms"],
                                      0.90, peak["bf16_gflops"])
                bf16 += f"; 0.90x needs {100 * needed:.0f}%"
        lines.append(f"| {workload} | " + " | ".join(cells) +
                     f" | {versus} | {rate_text} | {bf16} |")
    return "\n".join(lines)


def int8_summary(results, peak):
    """One line per workload: int8 backends' ratios to eager, Blade int8's to the fastest
    int8 peer and to Blade float32, and the output cosine to float32 eager."""
    names = [n for n in ("blade_int8",) + INT8_PEERS if any(n in r for r in results.values())]
    if "blade_int8" not in names:
        return ""
    limit = max(peak.get("int8_gops") or 0, peak.get("int8_gemm_gops") or 0) if peak else 0
    lines = ["| workload | " + " | ".join(names) + " | blade_int8 / fastest int8 peer | "
             "blade_int8 % of int8 peak (0.85x peer needs) | blade_int8 / blade | "
             "cosine blade_int8 (best peer) |",
             "|---" * (len(names) + 5) + "|"]
    for workload, rows in results.items():
        if "blade_int8" not in rows:
            continue
        cells = [f"{rows[n]['ratio_to_eager']:.2f}" if n in rows else "-" for n in names]
        peers = [n for n in INT8_PEERS if n in rows]
        fastest = min(peers, key=lambda n: rows[n]["median_ms"]) if peers else None
        versus = f"{rows['blade_int8']['median_ms'] / rows[fastest]['median_ms']:.2f} " \
                 f"({fastest})" if fastest else "-"
        share = "-"
        if rows["blade_int8"].get("gflops") and limit:
            share = f"{100 * rows['blade_int8']['gflops'] / limit:.0f}%"
            needed = share_needed(rows["blade_int8"], rows[fastest]["median_ms"], 0.85,
                                  limit) if fastest else None
            if needed is not None:
                share += f" ({100 * needed:.0f}%)"
        own = f"{rows['blade_int8']['median_ms'] / rows['blade']['median_ms']:.2f}" \
            if "blade" in rows else "-"
        best = max((rows[n]["cosine"] for n in peers), default=None)
        accuracy = f"{rows['blade_int8']['cosine']:.5f}" + \
            (f" ({best:.5f})" if best is not None else "")
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | {versus} | {share} | "
                     f"{own} | {accuracy} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--backends", default=",".join(DEFAULT_BACKENDS))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--no-overhead", action="store_true",
                        help="skip the per-call overhead measurement")
    parser.add_argument("--kernel-choices", action="store_true",
                        help="list each Blade backend's kernel trials: every weight and "
                             "input size, each kernel's best time, the kernel kept")
    args = parser.parse_args()
    torch.set_num_threads(2)
    peak = measure_peak_gflops()
    print(f"float32 FMA peak: {peak['gflops']:.0f} GFLOP/s on {peak['threads']} threads "
          f"({peak['isa']}, measured by benchmarks/peak.py)")
    if peak.get("bf16_gflops"):
        print(f"bfloat16 dot-product peak: {peak['bf16_gflops']:.0f} GFLOP/s (avx512_bf16; "
              "the %peak of blade_bf16 and openvino_bf16 rows is of this one)")
    if peak.get("int8_gops"):
        print(f"int8 peak: {peak['int8_gops']:.0f} GOP/s ({peak['int8_isa']}); "
              f"oneDNN's u8 x s8 GEMM, {peak['int8_gemm_size']}^3: "
              f"{peak['int8_gemm_gops']:.0f} GOP/s (the %peak of int8 rows is of the larger)")
    print()
    results = {"fma_peak": peak}
    header = f"{'workload':<14}{'backend':<15}{'median ms':>10}{'p10':>9}{'p90':>9}" \
             f"{'/eager':>8}{'compile s':>10}{'max diff':>10}{'GFLOP/s':>9}{'%peak':>7}"
    print(header)
    workloads = {}
    for workload in args.workloads.split(","):
        rows = bench(workload, args.backends.split(","), args.runs, args.warmup)
        workloads[workload] = rows
        for name, r in rows.items():
            limit = peak["bf16_gflops"] if name.endswith("bf16") and peak.get("bf16_gflops") \
                else peak["gflops"]
            if name.endswith("int8") and peak.get("int8_gops"):
                limit = max(peak["int8_gops"], peak["int8_gemm_gops"])
            rate = f"{r['gflops']:>9.1f}{100 * r['gflops'] / limit:>6.0f}%" \
                if r["gflops"] else ""
            note = ""
            if "coverage" in r:  # a Blade number means little if little of it compiled
                note = f"  compiled {100 * r['coverage']:.0f}%"
            print(f"{workload:<14}{name:<15}{r['median_ms']:>10.3f}{r['p10_ms']:>9.3f}"
                  f"{r['p90_ms']:>9.3f}{r['ratio_to_eager']:>8.2f}{r['compile_s']:>10.2f}"
                  f"{r['max_abs_diff']:>10.1e}{rate}{note}", flush=True)
    results.update(workloads)
    if args.kernel_choices:
        for workload, rows in workloads.items():
            for name, r in rows.items():
                if r.get("kernel_choices"):
                    print(f"\n{workload} {name}: kernel choices\n  " +
                          "\n  ".join(r["kernel_choices"]))
    ratios = [r["blade"]["ratio_to_eager"] for r in workloads.values() if "blade" in r]
    if ratios:
        geomean = statistics.geometric_mean(ratios)
        print(f"\nblade geometric-mean speedup over eager: {1 / geomean:.2f}x")
    print("\nratio to eager (lower is faster):\n" + summary(workloads, peak))
    int8 = int8_summary(workloads, peak)
    if int8:
        print("\nint8 (ratio to eager, lower is faster; cosine of the output to float32 "
              "eager):\n" + int8)
    if not args.no_overhead:
        overhead = call_overhead()
        results["call_overhead_us"] = overhead
        print("\nper-call cost on a 4-element input (median us, the kernel itself takes ns): " +
              ", ".join(f"{name} {us:.1f}" for name, us in overhead.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
