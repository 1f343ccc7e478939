"""Each int8 engine's error against its float engine, on the calibration inputs: what the
report's int8 section lists per engine (Config(precision="int8")).

A cluster with Blade's int8 ops runs, on each calibration input, the inputs the int8 graph
gives it there (recorded as the engine check records examples,
`self_check.capture_cluster_examples`), twice: as it is, and as its float twin, where each
int8 op is the float op it stands for, with the layer's float weight (a folded BatchNorm's
in it), without rounding: a uint8 input dequantized with the range it was rounded to (the float
activation itself where the graph rounded it, int8_handoffs.round_in_code), the
ReLU, GELU or hardswish post-op in float, the residual operand added. Both read the same inputs, so
the error is the engine's own, not the error of the engines before it. Outputs are
compared in float: uint8 results dequantized (NHWC bytes back to NCHW), integer and bool
outputs left out.

Clusters are named as compile_clusters names them in its first round (`blade_engine_<k>`,
in cluster order); the report keeps the engines that compiled.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from blade.engines import ENGINE_PREFIX
from blade.frontend.int8_handoffs import (QUANTIZED_CONV2D, QUANTIZED_CONV2D_ADD,
                                          QUANTIZED_LINEAR, QUANTIZED_MAX_POOL2D,
                                          RANGE_OPERANDS, constant_value, rounded_in_code)
from blade.self_check import capture_cluster_examples

TWIN = "blade_float_twin"
_LIBRARY = torch.library.Library(TWIN, "DEF")
_LIBRARY.define("linear(Tensor input, Tensor weight, Tensor? bias, Tensor input_range, "
                "str post_op) -> Tensor")
_LIBRARY.define("conv2d(Tensor input, Tensor weight, Tensor? bias, int[] stride, "
                "int[] padding, int[] dilation, int groups, Tensor input_range, "
                "str post_op) -> Tensor")
_LIBRARY.define("conv2d_add(Tensor input, Tensor weight, Tensor? bias, int[] stride, "
                "int[] padding, int[] dilation, int groups, Tensor input_range, Tensor accum, "
                "Tensor accum_range, str post_op) -> Tensor")
_LIBRARY.define("max_pool2d(Tensor input, int[] kernel_size, int[] stride, int[] padding, "
                "int[] dilation, bool ceil_mode) -> Tensor")


def dequantized(x: torch.Tensor, value_range: torch.Tensor, image: bool) -> torch.Tensor:
    """A uint8 activation (carried as int8 bytes; NHWC for an image) as float values in
    the int8 graph's own layout; a float tensor as it is."""
    if x.dtype != torch.int8:
        return x
    scale, zero_point = float(value_range[0]), float(value_range[1])
    values = (x.view(torch.uint8).float() - zero_point) * scale
    return values.permute(0, 3, 1, 2) if image else values


def _post_op(y: torch.Tensor, post_op: str) -> torch.Tensor:
    if post_op == "relu":
        return torch.relu(y)
    if post_op == "hardswish":
        return torch.nn.functional.hardswish(y)
    if post_op in ("gelu", "gelu_tanh"):
        return torch.nn.functional.gelu(y, approximate="tanh" if post_op == "gelu_tanh"
                                        else "none")
    return y


def _linear(x, weight, bias, input_range, post_op):
    return _post_op(torch.nn.functional.linear(dequantized(x, input_range, False), weight,
                                               bias), post_op)


def _conv2d(x, weight, bias, stride, padding, dilation, groups, input_range, post_op):
    return _post_op(torch.nn.functional.conv2d(dequantized(x, input_range, True), weight, bias,
                                               stride, padding, dilation, groups), post_op)


def _conv2d_add(x, weight, bias, stride, padding, dilation, groups, input_range, accum,
                accum_range, post_op):
    y = torch.nn.functional.conv2d(dequantized(x, input_range, True), weight, bias, stride,
                                   padding, dilation, groups)
    return _post_op(y + dequantized(accum, accum_range, True), post_op)


def _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    if x.dtype == torch.int8:  # bytes in: pooled as the int8 graph pools them
        return torch.ops.blade.quantized_max_pool2d(x, kernel_size, stride, padding, dilation,
                                                    ceil_mode)
    return torch.nn.functional.max_pool2d(x, kernel_size, stride, padding, dilation,
                                          ceil_mode=ceil_mode)


for _name, _function in (("linear", _linear), ("conv2d", _conv2d),
                         ("conv2d_add", _conv2d_add), ("max_pool2d", _max_pool2d)):
    _LIBRARY.impl(_name, _function, "CompositeExplicitAutograd")

# Blade's op -> (its twin, the operand positions the twin drops: the weight's scales, the
# output range).
_TWINS = {kind: (name, (2, RANGE_OPERANDS[kind][1])) for kind, name in (
    (QUANTIZED_LINEAR, "linear"), (QUANTIZED_CONV2D, "conv2d"),
    (QUANTIZED_CONV2D_ADD, "conv2d_add"))}
_TWINS[QUANTIZED_MAX_POOL2D] = ("max_pool2d", ())


class EngineError:
    """One int8 engine against its float twin, accumulated output by output over the
    calibration inputs (sums, not the outputs, are kept)."""

    def __init__(self):
        self.dot = self.got_squares = self.want_squares = 0.0
        self.max_abs_error = self.max_abs_value = 0.0
        self.values = 0

    def add(self, got: torch.Tensor, want: torch.Tensor) -> None:
        got, want = got.reshape(-1).double(), want.reshape(-1).double()
        self.dot += float(got @ want)
        self.got_squares += float(got @ got)
        self.want_squares += float(want @ want)
        if got.numel():
            self.max_abs_error = max(self.max_abs_error, float((got - want).abs().max()))
            self.max_abs_value = max(self.max_abs_value, float(want.abs().max()))
        self.values += got.numel()

    @property
    def cosine(self) -> float:
        norms = (self.got_squares * self.want_squares) ** 0.5
        return self.dot / norms if norms > 0 else float(self.got_squares == self.want_squares)

    def to_dict(self) -> dict:
        return {"cosine": self.cosine, "max_abs_error": self.max_abs_error,
                "max_abs_value": self.max_abs_value}


def float_twin(subgraph: torch._C.Graph,
               float_weight: Dict[int, torch.Tensor]) -> Optional[torch._C.Graph]:
    """A copy of `subgraph` with each of Blade's int8 ops as its float twin; None when an
    int8 op's weight is no constant. `float_weight` maps an int8 weight's data pointer to
    its float weight; a weight it lacks is dequantized (its own rounding then counts as
    no error)."""
    twin = subgraph.copy()
    for node in list(twin.nodes()):
        if node.kind() not in _TWINS:
            continue
        name, dropped = _TWINS[node.kind()]
        operands = [v for k, v in enumerate(node.inputs()) if k not in dropped]
        # An activation the graph rounded for the layer: the float one, unrounded.
        operands[0] = rounded_in_code(operands[0]) or operands[0]
        if node.kind() != QUANTIZED_MAX_POOL2D:
            weight, scales = constant_value(node.inputsAt(1)), constant_value(node.inputsAt(2))
            if not isinstance(weight, torch.Tensor) or not isinstance(scales, torch.Tensor):
                return None
            original = float_weight.get(weight.data_ptr())
            if original is None:
                original = weight.float() * scales.reshape(-1, *[1] * (weight.dim() - 1))
            with twin.insert_point_guard(node):
                operands[1] = twin.insertConstant(original)
        replacement = twin.create(f"{TWIN}::{name}", operands, 1)
        replacement.insertBefore(node)
        replacement.output().setType(torch._C.TensorType.get())
        node.output().replaceAllUsesWith(replacement.output())
        node.destroy()
    outputs = list(twin.outputs())
    if len(outputs) != 1:   # a function returns one value: the outputs as a tuple
        packed = twin.create("prim::TupleConstruct", outputs)
        twin.appendNode(packed)
        packed.output().setType(torch._C.TupleType([v.type() for v in outputs]))
        for _ in outputs:
            twin.eraseOutput(0)
        twin.registerOutput(packed.output())
    return twin


def _output_ranges(subgraph: torch._C.Graph) -> List[Optional[Tuple[torch.Tensor, bool]]]:
    """Per output of `subgraph`: the range its uint8 bytes were rounded to and whether it is
    an NHWC image, for an int8 op's uint8 result (through a uint8 max-pool); else None."""
    found = []
    for value in subgraph.outputs():
        node = value.node()
        if node.kind() == QUANTIZED_MAX_POOL2D:
            node = node.inputsAt(0).node()
        out_range = RANGE_OPERANDS[node.kind()][1] if node.kind() in RANGE_OPERANDS else None
        value_range = constant_value(node.inputsAt(out_range)) if out_range is not None else None
        found.append((value_range, node.kind() != QUANTIZED_LINEAR)
                     if isinstance(value_range, torch.Tensor) else None)
    return found


def _as_float(t, value_range: Optional[Tuple[torch.Tensor, bool]]) -> Optional[torch.Tensor]:
    if not isinstance(t, torch.Tensor):
        return None
    if t.dtype == torch.int8 and value_range is not None:
        return dequantized(t, *value_range)
    return t.double() if t.is_floating_point() else None


def measure_engines(module, graph: torch._C.Graph, clusters: Sequence, calibration: Sequence,
                    float_weight: Dict[int, torch.Tensor]) -> Dict[str, dict]:
    """The error of each cluster with int8 ops against its float twin (EngineError's dict),
    by the engine name compile_clusters gives it, on every calibration input the cluster
    ran; {"not_measured": why} for a cluster whose twin could not be made or run (the
    report says so; the compile goes on)."""
    measured, failed = {}, {}
    for k, cluster in enumerate(clusters):
        subgraph = cluster.g("Subgraph")
        if not any(n.kind() in _TWINS for n in subgraph.nodes()):
            continue
        twin = float_twin(subgraph, float_weight)
        if twin is None:
            failed[k] = "an int8 layer's weight is not a constant"
            continue
        measured[k] = (torch._C._create_function_from_graph("blade_int8_twin", twin),
                       _output_ranges(subgraph), EngineError())
    chosen = [clusters[k] for k in measured]
    for inputs in calibration if chosen else ():
        examples = capture_cluster_examples(module, graph, chosen, inputs)()
        for (k, (run, ranges, error)), example in zip(list(measured.items()), examples):
            if example is None:   # this input did not reach the cluster
                continue
            try:
                with torch.no_grad(), torch.jit.optimized_execution(False):
                    outputs = run(*example.inputs)
            except Exception as e:  # a report's figure must not stop the compile
                failed[k] = f"its float twin raised {type(e).__name__}: " + \
                    (str(e).splitlines() or [""])[0]
                del measured[k]
                continue
            outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
            for actual, reference, value_range in zip(example.outputs, outputs, ranges):
                a, b = _as_float(actual, value_range), _as_float(reference, value_range)
                if a is not None and b is not None and a.shape == b.shape:
                    error.add(a, b)
    found = {f"{ENGINE_PREFIX}{k}": error.to_dict()
             for k, (_, _, error) in measured.items() if error.values}
    found.update({f"{ENGINE_PREFIX}{k}": {"not_measured": why} for k, why in failed.items()})
    return found
