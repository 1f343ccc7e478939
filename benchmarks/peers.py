"""The runtimes a team deploying PyTorch on CPU would pick instead of Blade, as benchmark
backends: ONNX Runtime, OpenVINO with its float32 precision hint, and OpenVINO as it runs
by default (bf16 on CPUs with avx512_bf16, such as this one).

Their int8 modes, each calibrated on the same inputs as Blade's int8 (`calibration`):
onnxruntime_int8 (`onnxruntime.quantization`: dynamic int8 weights for transformer and MLP
workloads, static QDQ with per-channel weights for convolution ones), openvino_int8
(NNCF's `nncf.quantize`, model type TRANSFORMER where it applies, run as OpenVINO runs
by default) and inductor_int8 (PyTorch's PT2E flow from torchao with X86InductorQuantizer,
compiled by `torch.compile` with freezing).

Each takes the model through `torch.onnx.export(..., dynamo=False)` (opset 20), runs on 2
intra-op threads, and is called like the model: torch tensors in, torch tensors out. ONNX
Runtime's threads do not spin between runs (they would take the cores from the next backend
of the round-robin). Inputs are handed over without a copy (numpy views of the tensors);
OpenVINO's outputs live in buffers its next call reuses, so they are copied out, and the
copy is part of the measured call. ONNX Runtime returns fresh arrays, wrapped without a
copy.
"""
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import torch

PEERS = ("onnxruntime", "openvino", "openvino_bf16", "onnxruntime_int8", "openvino_int8",
         "inductor_int8")
INT8_PEERS = ("onnxruntime_int8", "openvino_int8", "inductor_int8")
THREADS = 2


class _PositionalOnly(torch.nn.Module):
    """`model` called with exactly the example inputs. The TorchScript-based exporter fills
    forward's missing arguments in from its defaults and traces them as inputs:
    nn.TransformerEncoderLayer's `is_causal=False` became a tensor, which
    scaled_dot_product_attention refuses."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        # The exporter puts the wrapper back in its own mode afterwards, which train()
        # passes on to `model`: an nn.Module starts in training mode.
        self.train(model.training)

    def forward(self, *inputs):
        return self.model(*inputs)


def export_onnx(model: torch.nn.Module, inputs: Sequence[torch.Tensor], path: Path,
                dynamic_axes: Optional[Dict[int, Dict[int, str]]] = None) -> None:
    """`dynamic_axes`: {input position: {dim: name}}, the dims the exported model takes at
    any size (ONNX's dynamic axes); the others are fixed at the example's."""
    names = [f"input_{i}" for i in range(len(inputs))]
    model = _PositionalOnly(model)
    # Without MultiheadAttention's fast path: nn.TransformerEncoderLayer would trace into a
    # fused op (aten::_transformer_encoder_layer_fwd) that ONNX cannot express.
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=20,
                              input_names=names, dynamic_axes={
                                  names[i]: axes for i, axes in (dynamic_axes or {}).items()})
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


def _as_tuple_or_tensor(outputs):
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def onnxruntime_backend(path: Path) -> Callable:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Its threads would otherwise spin after each run, taking the cores from the backend
    # measured next in the harness's round-robin.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*inputs):
        outputs = session.run(None, {n: x.numpy() for n, x in zip(names, inputs)})
        return _as_tuple_or_tensor([torch.from_numpy(o) for o in outputs])

    return run


def openvino_backend(path: Path, precision: str) -> Callable:
    """precision: "f32" (the float32 hint) or "default" (what OpenVINO picks: bf16 here)."""
    import openvino

    config = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY"}
    if precision == "f32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    core = openvino.Core()
    return _openvino_runner(core.compile_model(core.read_model(str(path)), "CPU", config))


def _openvino_runner(compiled) -> Callable:
    """A compiled OpenVINO model called like the torch model."""
    import openvino

    request = compiled.create_infer_request()

    def run(*inputs):
        tensors = {i: openvino.Tensor(x.numpy(), shared_memory=True)
                   for i, x in enumerate(inputs)}
        results = request.infer(tensors, share_inputs=True, share_outputs=True)
        return _as_tuple_or_tensor([torch.from_numpy(results[o].copy())
                                    for o in compiled.outputs])

    run.precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return run


def _has_convolutions(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def onnxruntime_int8_path(path: Path, model: torch.nn.Module, calibration, tmp: Path) -> Path:
    """ONNX Runtime's recommended int8 for the model: dynamic quantization of the weights
    (activations quantized per call) for transformers and MLPs, static QDQ with per-channel
    weights calibrated on `calibration` for convolution networks."""
    from onnxruntime import quantization as q

    out = tmp / "model_int8.onnx"
    if not _has_convolutions(model):
        q.quantize_dynamic(str(path), str(out), weight_type=q.QuantType.QInt8)
        return out

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.items = iter([{f"input_{i}": x.numpy() for i, x in enumerate(inputs)}
                               for inputs in calibration])

        def get_next(self):
            return next(self.items, None)

    prepared = tmp / "model_prepared.onnx"
    q.quant_pre_process(str(path), str(prepared))
    q.quantize_static(str(prepared), str(out), Reader(), quant_format=q.QuantFormat.QDQ,
                      per_channel=True, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8)
    return out


def openvino_int8_backend(path: Path, model: torch.nn.Module, calibration) -> Callable:
    """NNCF's post-training quantization of the OpenVINO model on `calibration`."""
    import nncf
    import openvino

    core = openvino.Core()
    ov_model = core.read_model(str(path))
    dataset = nncf.Dataset([tuple(x.numpy() for x in inputs) for inputs in calibration])
    options = {} if _has_convolutions(model) else {"model_type": nncf.ModelType.TRANSFORMER}
    quantized = nncf.quantize(ov_model, dataset, subset_size=len(calibration), **options)
    config = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY"}
    return _openvino_runner(core.compile_model(quantized, "CPU", config))


def inductor_int8_backend(model: torch.nn.Module, inputs, calibration) -> Callable:
    """PyTorch's own int8 path: torch.export, torchao's PT2E prepare/calibrate/convert with
    X86InductorQuantizer's default (static) config, torch.compile with freezing."""
    import torch._inductor.config as inductor_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    inductor_config.freezing = True
    exported = torch.export.export(_PositionalOnly(model), tuple(inputs)).module()
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for sample in calibration:
            prepared(*sample)
    converted = convert_pt2e(prepared)
    return torch.compile(converted)


def make_peer(name: str, model: torch.nn.Module, inputs: Sequence[torch.Tensor],
              calibration: Sequence[Sequence[torch.Tensor]] = ()) -> Callable:
    if name == "inductor_int8":
        return inductor_int8_backend(model, inputs, calibration)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export_onnx(model, inputs, path)
        if name == "onnxruntime":
            return onnxruntime_backend(path)
        if name == "openvino":
            return openvino_backend(path, "f32")
        if name == "openvino_bf16":
            return openvino_backend(path, "default")
        if name == "onnxruntime_int8":
            return onnxruntime_backend(onnxruntime_int8_path(path, model, calibration,
                                                             Path(tmp)))
        if name == "openvino_int8":
            return openvino_int8_backend(path, model, calibration)
    raise KeyError(name)
