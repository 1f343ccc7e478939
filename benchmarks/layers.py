"""One workload layer by layer: Blade's engine beside OpenVINO, matched by shapes.

    python benchmarks/layers.py --workload resnet50 --precision int8 [--calls 60]

Blade's side is its call profile (`_C.call_profile`): every kernel call by name and
shapes, its mean time per call. OpenVINO's is its own per-layer profile (`PERF_COUNT`):
every layer's primitive (oneDNN's `brgconv_avx512_I8`, ...) and mean time. Convolutions
and linear layers are matched by their input and weight shapes (what both sides name), so
a row says where one side loses time on the same work; what matches nothing is listed
after. `--precision`: float32 (OpenVINO's f32 hint), bf16 (OpenVINO's default) or int8
(Blade's own calibration, NNCF's on the same inputs). 2 threads, like `run.py`.
"""
import argparse
import ast
import collections
import math
import re
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import blade  # noqa: E402
from peers import THREADS, export_onnx  # noqa: E402
from profiled import profiled_calls  # noqa: E402
from run import calibration_inputs  # noqa: E402
from workloads import build  # noqa: E402

warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")

_SHAPES = re.compile(r"\[[0-9, ]*\]")


def blade_key(name):
    """The work a Blade kernel call's profile name describes, as ("conv", input NCHW,
    weight) or ("linear", rows, depth, columns); None for any other call."""
    shapes = [tuple(ast.literal_eval(s)) for s in _SHAPES.findall(name)]
    if "conv2d" in name and len(shapes) >= 2 and len(shapes[0]) == 4 and \
            len(shapes[1]) == 4:
        image, weight = shapes[0], shapes[1]
        channels = (weight[0], weight[1])
        # NHWC unless only the second dim holds the channels (a float32 NCHW input).
        if image[1] in channels and image[3] not in channels:
            return ("conv", image, weight)
        return ("conv", (image[0], image[3], image[1], image[2]), weight)
    if ("linear" in name or "matmul" in name) and len(shapes) >= 2 and len(shapes[1]) == 2:
        return ("linear", math.prod(shapes[0][:-1]), shapes[0][-1], shapes[1][0])
    return None


def openvino_key(layer_type, inputs):
    """The same for an OpenVINO layer, by its type and its inputs' shapes."""
    if layer_type == "Convolution" and len(inputs) >= 2 and len(inputs[0]) == 4 and \
            len(inputs[1]) == 4:
        return ("conv", tuple(inputs[0]), tuple(inputs[1]))
    if layer_type.startswith("FullyConnected") and len(inputs) >= 2 and \
            len(inputs[1]) == 2:
        return ("linear", math.prod(inputs[0][:-1]), inputs[0][-1], inputs[1][0])
    return None


def blade_profiler(model, inputs, precision):
    """A function that runs `calls` calls of Blade's engine, profiled, and adds each
    kernel call's time to `seconds` (name -> [calls, seconds]), the whole calls' under
    "engine calls (whole)"."""
    calibration = calibration_inputs(inputs) if precision == "int8" else None
    fn = blade.optimize(model, inputs, blade.Config(precision=precision, calibration=calibration))
    with torch.no_grad():
        for _ in range(10):
            fn(*inputs)

    def run(calls, seconds):
        for name, count, spent in profiled_calls(fn, inputs, calls):
            seconds[name][0] += count
            seconds[name][1] += spent
    return run


def openvino_profiler(model, inputs, precision):
    """The same for OpenVINO's layers (name -> [calls, seconds]), and their [(name, type,
    primitive, input shapes)] in execution order."""
    import openvino

    core = openvino.Core()
    with tempfile.TemporaryDirectory() as tmp:
        export_onnx(model, inputs, Path(tmp) / "model.onnx")
        ov_model = core.read_model(str(Path(tmp) / "model.onnx"))
    config = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY",
              "PERF_COUNT": True}
    if precision == "float32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    if precision == "int8":
        import nncf

        calibration = calibration_inputs(inputs)
        dataset = nncf.Dataset([tuple(x.numpy() for x in sample) for sample in calibration])
        ov_model = nncf.quantize(ov_model, dataset, subset_size=len(calibration))
    compiled = core.compile_model(ov_model, "CPU", config)
    shapes = {op.get_friendly_name(): [list(op.get_input_partial_shape(i).to_shape())
                                       for i in range(op.get_input_size())
                                       if op.get_input_partial_shape(i).is_static]
              for op in compiled.get_runtime_model().get_ordered_ops()}
    request = compiled.create_infer_request()
    feed = {i: x.numpy() for i, x in enumerate(inputs)}
    for _ in range(10):
        request.infer(feed)
    layers = [(info.node_name, info.node_type, info.exec_type, shapes.get(info.node_name, []))
              for info in request.get_profiling_info()]

    def run(calls, seconds):
        for _ in range(calls):
            request.infer(feed)
            for info in request.get_profiling_info():
                seconds[info.node_name][0] += 1
                seconds[info.node_name][1] += info.real_time.total_seconds()
    return run, layers


def matched(blade_rows, openvino_rows):
    """Rows of the table: per Blade kernel with a key, Blade's calls and mean us beside the
    OpenVINO layers of the same key (their count, mean us, primitives); then the kernels
    and layers that matched nothing."""
    by_key = collections.defaultdict(list)
    for name, layer_type, primitive, us, inputs in openvino_rows:
        key = openvino_key(layer_type, inputs)
        if key is not None:
            by_key[key].append((name, primitive, us))
    table, unmatched, used = [], [], set()
    for name, count, us in sorted(blade_rows, key=lambda r: -r[1] * r[2]):
        key = blade_key(name)
        layers = by_key.get(key, [])
        if key is None or not layers:
            unmatched.append(("blade", name, count, us))
            continue
        used.add(key)
        table.append((name, count, us, len(layers), sum(u for _, _, u in layers) / len(layers),
                      sorted({p for _, p, _ in layers})))
    for key, layers in by_key.items():
        if key not in used:
            for name, _, us in layers:
                unmatched.append(("openvino", name, 1, us))
    return table, unmatched


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="resnet50")
    parser.add_argument("--precision", default="int8", choices=("float32", "bf16", "int8"))
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    model, inputs = build(args.workload)
    blade_run = blade_profiler(model, inputs, args.precision)
    openvino_run, layers = openvino_profiler(model, inputs, args.precision)
    # Interleaved in rounds, so that the machine's drift falls on both sides alike.
    blade_seconds = collections.defaultdict(lambda: [0, 0.0])
    openvino_seconds = collections.defaultdict(lambda: [0, 0.0])
    rounds = 4
    for _ in range(rounds):
        blade_run(max(1, args.calls // rounds), blade_seconds)
        openvino_run(max(1, args.calls // rounds), openvino_seconds)
    calls = rounds * max(1, args.calls // rounds)
    whole = blade_seconds.pop("engine calls (whole)", [0, 0.0])[1] * 1e6 / calls
    blade_rows = [(name, count / calls, spent * 1e6 / count)
                  for name, (count, spent) in blade_seconds.items() if count]
    openvino_rows = [(name, layer_type, primitive, openvino_seconds[name][1] * 1e6 / calls,
                      inputs) for name, layer_type, primitive, inputs in layers
                     if openvino_seconds[name][1] > 0]
    table, unmatched = matched(blade_rows, openvino_rows)
    print(f"{args.workload}, {args.precision}: Blade's engine call {whole:.0f} us (its kernels "
          f"{sum(c * u for _, c, u in blade_rows):.0f}), OpenVINO's layers "
          f"{sum(r[3] for r in openvino_rows):.0f} us; means over {calls} calls each, "
          f"interleaved\n")
    print("| Blade kernel | calls | Blade us | OpenVINO layers | OpenVINO us | Blade / "
          "OpenVINO | OpenVINO primitive |\n|---|---|---|---|---|---|---|")
    for name, count, us, ov_count, ov_us, primitives in table:
        print(f"| {name} | {count:g} | {us:.1f} | {ov_count} | {ov_us:.1f} | {us / ov_us:.2f} | "
              f"{', '.join(primitives)} |")
    print("\nmatched nothing (side, name, calls per model call, mean us):")
    for side, name, count, us in sorted(unmatched, key=lambda r: -r[2] * r[3]):
        if count * us >= 5:
            print(f"  {side:<9}{us:9.1f} us x {count:g}  {name}")


if __name__ == "__main__":
    main()
