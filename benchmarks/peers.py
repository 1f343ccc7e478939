"""The runtimes a team deploying PyTorch on CPU would pick instead of Blade, as benchmark
backends: ONNX Runtime, OpenVINO with its float32 precision hint, and OpenVINO as it runs
by default (bf16 on CPUs with avx512_bf16, such as this one).

Each takes the model through `torch.onnx.export(..., dynamo=False)` (opset 20), runs on 2
intra-op threads, and is called like the model: torch tensors in, torch tensors out.
ONNX Runtime's threads do not spin between runs (they would take the cores from the next
backend of the round-robin). Inputs are handed over without a copy (numpy views of the tensors); OpenVINO's outputs
live in buffers its next call reuses, so they are copied out, and the copy is part of the
measured call. ONNX Runtime returns fresh arrays, wrapped without a copy.
"""
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch

PEERS = ("onnxruntime", "openvino", "openvino_bf16")
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


def export_onnx(model: torch.nn.Module, inputs: Sequence[torch.Tensor], path: Path) -> None:
    names = [f"input_{i}" for i in range(len(inputs))]
    model = _PositionalOnly(model)
    # Without MultiheadAttention's fast path: nn.TransformerEncoderLayer would trace into a
    # fused op (aten::_transformer_encoder_layer_fwd) that ONNX cannot express.
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=20,
                              input_names=names)
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
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()

    def run(*inputs):
        tensors = {i: openvino.Tensor(x.numpy(), shared_memory=True)
                   for i, x in enumerate(inputs)}
        results = request.infer(tensors, share_inputs=True, share_outputs=True)
        return _as_tuple_or_tensor([torch.from_numpy(results[o].copy())
                                    for o in compiled.outputs])

    run.precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return run


def make_peer(name: str, model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> Callable:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export_onnx(model, inputs, path)
        if name == "onnxruntime":
            return onnxruntime_backend(path)
        if name == "openvino":
            return openvino_backend(path, "f32")
        if name == "openvino_bf16":
            return openvino_backend(path, "default")
    raise KeyError(name)
