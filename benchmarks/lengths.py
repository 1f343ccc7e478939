"""One dynamic engine serving every sequence length, against an engine compiled for each
length and the peers with dynamic axes: Hugging Face's BertModel (the bert-base config,
random weights, no download; token ids and an attention mask in, the last hidden state out)
at batch 1 and lengths 8, 24, 48, 77, 128, 200, 384, in one process, the backends
interleaved (each timed call right after an untimed one of the same backend), after each
backend's kernel trials at that length have ended (WARM_CALLS untimed calls).

    python benchmarks/lengths.py [--lengths 8,24,48,77,128,200,384] [--runs 10] [--breakdown]

blade_dynamic: one `blade.optimize` (traced: the model does not script) with the length of
both inputs dynamic (`Config(dynamic_dims=...)`) from a length-128 example, called at every
length. blade_static: one `blade.optimize` per length, on that
length's example. onnxruntime and openvino (its float32 hint): one ONNX export with the
length as a dynamic axis. Per length, the median over `--runs` rounds; every backend's
output is checked against eager's. Before the table, the compile time of the dynamic
engine next to one static compile at length 128, both cold (their own empty code cache,
no model cache, the compiler already imported).

`--breakdown` then times the two Blade engines by kernel at every length (the runtime's
call profile, blade._C.call_profile): ms per model call in each library call (matmul,
attention, ...) and kernel call (aten and int8 ops), and in the generated code itself (the
engine's whole call less those), dynamic beside static: where the dynamic engine loses.
"""
import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import THREADS, export_onnx, onnxruntime_backend, openvino_backend  # noqa: E402

import blade  # noqa: E402
from blade import _C  # noqa: E402
from profiled import profiled_calls  # noqa: E402

LENGTHS = (8, 24, 48, 77, 128, 200, 384)
# Untimed calls of each backend at each length before its timing: an engine's kernel trials
# take its first calls at an input size (PreparedWeights::next_kernel), which would
# otherwise be some of the timed rounds, each running the kernel that may lose.
WARM_CALLS = _C.kernel_trial_calls()
EXAMPLE_LENGTH = 128


class Bert(torch.nn.Module):
    """BertModel with positional inputs and one tensor out."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        self.bert = BertModel(BertConfig(), add_pooling_layer=False).eval()

    def forward(self, ids, mask):
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def example(length: int):
    """Token ids and a mask of ones (no padding), as a tokenizer gives one sentence."""
    generator = torch.Generator().manual_seed(length)
    return (torch.randint(0, 30522, (1, length), generator=generator),
            torch.ones(1, length, dtype=torch.int64))


DYNAMIC = blade.Config(allow_tracing=True, dynamic_dims={0: [1], 1: [1]})
STATIC = blade.Config(allow_tracing=True)


def cold_optimize(model, inputs, config: blade.Config):
    """`blade.optimize` with an empty code cache of its own and no model cache: seconds and
    the optimized model."""
    with tempfile.TemporaryDirectory() as cache:
        config = dataclasses.replace(config, cache_dir=cache, cache_models=False)
        start = time.perf_counter()
        optimized = blade.optimize(model, inputs, config)
        return time.perf_counter() - start, optimized


GENERATED = "generated code"
LOOPS = "generated parallel loops"


def kernel_times(fn, inputs, runs):
    """ms per call of `fn(*inputs)` in each library and kernel call, in the generated
    code's parallel loops together (each engine names its own by address), and in the rest
    of the generated code (the engines' whole calls less those)."""
    times = {LOOPS: 0.0}
    for name, _, seconds in profiled_calls(fn, inputs, runs):
        key = LOOPS if name.startswith("parallel loop") else name
        times[key] = times.get(key, 0.0) + seconds * 1e3 / runs
    whole = times.pop("engine calls (whole)", 0.0)
    times[GENERATED] = whole - sum(times.values())
    return times


def print_breakdown(dynamic, statics, inputs, runs):
    print("\nper kernel, ms per call: dynamic engine / static engine (difference)")
    for n, example_inputs in inputs.items():
        mine = kernel_times(dynamic, example_inputs, runs)
        theirs = kernel_times(statics[n], example_inputs, runs)
        names = sorted(set(mine) | set(theirs), key=lambda k: -max(mine.get(k, 0.0),
                                                                   theirs.get(k, 0.0)))
        print(f"length {n}: " + "; ".join(
            f"{name} {mine.get(name, 0.0):.2f} / {theirs.get(name, 0.0):.2f} "
            f"({mine.get(name, 0.0) - theirs.get(name, 0.0):+.2f})" for name in names))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--breakdown", action="store_true",
                        help="then time both Blade engines by kernel at every length")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    torch.set_num_threads(THREADS)
    model = Bert().eval()
    inputs = {n: example(n) for n in lengths}
    # The compiler's imports (torch-mlir) first, so that neither compile timed pays them.
    blade.optimize(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),),
                   blade.Config(cache_dir="off"))
    dynamic_s, dynamic = cold_optimize(model, example(EXAMPLE_LENGTH), DYNAMIC)
    static_s, _ = cold_optimize(model, example(EXAMPLE_LENGTH), STATIC)
    print(f"compile, cold: dynamic engine {dynamic_s:.1f} s, one static engine (length "
          f"{EXAMPLE_LENGTH}) {static_s:.1f} s: {dynamic_s / static_s:.2f}x")
    statics = {n: blade.optimize(model, inputs[n], STATIC) for n in lengths}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bert_base.onnx"
        export_onnx(model, example(EXAMPLE_LENGTH), path,
                    dynamic_axes={0: {1: "length"}, 1: {1: "length"}})
        peers = {"onnxruntime": onnxruntime_backend(path),
                 "openvino": openvino_backend(path, "f32")}
        names = ["blade_dynamic", "blade_static", *peers]
        times = {(name, n): [] for name in names for n in lengths}
        worst = {name: 0.0 for name in names}
        with torch.no_grad():
            for n in lengths:
                expected = model(*inputs[n])
                run = {"blade_dynamic": dynamic, "blade_static": statics[n], **peers}
                for name in names:   # warm-up, and the check against eager
                    diff = (run[name](*inputs[n]) - expected).abs().max().item()
                    worst[name] = max(worst[name], diff)
                    # The engines' kernel trials at this length end before the timing.
                    for _ in range(WARM_CALLS):
                        run[name](*inputs[n])
                for _ in range(args.runs):
                    for name in names:
                        # An untimed call first, so the timed one does not pay for the
                        # previous backend's threads winding down on the same cores.
                        run[name](*inputs[n])
                        start = time.perf_counter()
                        run[name](*inputs[n])
                        times[(name, n)].append(time.perf_counter() - start)
    report = blade.report(dynamic)
    print(f"dynamic engine: {report.clusters[0].inputs}, {report.runtime_fallbacks} calls "
          "ran TorchScript instead")
    print("max abs difference from eager over all lengths: " +
          ", ".join(f"{name} {worst[name]:.1e}" for name in names))
    print("\n| length | " + " | ".join(f"{name} ms" for name in names) +
          " | dynamic / static | dynamic / best peer |")
    print("|---" * (len(names) + 3) + "|")
    for n in lengths:
        ms = {name: statistics.median(times[(name, n)]) * 1e3 for name in names}
        best_peer = min(ms[name] for name in peers)
        print(f"| {n} | " + " | ".join(f"{ms[name]:.2f}" for name in names) +
              f" | {ms['blade_dynamic'] / ms['blade_static']:.2f} | "
              f"{ms['blade_dynamic'] / best_peer:.2f} |")
    if args.breakdown:
        print_breakdown(dynamic, statics, inputs, args.runs)


if __name__ == "__main__":
    main()
