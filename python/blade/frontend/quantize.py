"""Blade's own post-training int8 quantization (Config(precision="int8")), on the frozen graph.

Which layers: every `aten::linear` and `aten::conv2d` of the graph (in branches and loops
too) that the calibration inputs reach and whose weight is a float32 constant of the
frozen module (its bias one too, or None; a convolution's strides and padding constants),
unless its op is in Config.excluded_ops or the weight's attribute path starts with one of
Config.float_layers. Softmax, normalisation and everything else stay float32. The first
and the last of them are quantized only where the calibration run shows it safe (see
`_keep_ends_safe`): they see the raw input and make the model's answer, and are where
int8 most often costs accuracy.

How: the weight gets one symmetric int8 scale per output channel (max |w| / 127, the
values in [-127, 127]; on a CPU with AVX2 but no VNNI, max |w| / 64: the most its 16-bit
pair sums take exactly, `_C.int8_weight_limit`); the layer's input gets one uint8 scale and
zero point per tensor, from the calibration inputs. Its range is chosen by the error it
leaves: the run keeps a sample of the values each layer reads, and of the ranges
[alpha * low, alpha * high] for alpha in `_CLIP_FACTORS` (alpha = 1 is min/max) the one
whose quantize-dequantize of the sample has the least mean squared error wins. Min/max
alone lets one outlier of a GELU's output stretch the steps for all the other values; a
percentile cut must be tuned per model; the squared error weighs both effects on the values
actually seen.

The layer becomes `blade::quantized_linear(x, w_int8, w_scale, bias, input_range)` or
`blade::quantized_conv2d(x, w_int8, w_scale, bias, stride, padding, dilation, groups,
input_range)` (csrc/ral/int8_kernels.h), which engines call as kernel calls and
TorchScript runs the same way, so the engine and its fallback compute alike.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.graph_queries import all_nodes, argument_name, insert_op, nodes_of
from blade.frontend.inputs import ExampleInputsError, describe_inputs, failure_summary
from blade.frontend.int8_handoffs import (QUANTIZED_CONV2D, QUANTIZED_LINEAR, ResidualAdd,
                                          fuse_residual_adds, residual_adds)

# TorchScript's ScalarType numbers.
_QUINT8, _INT32, _FLOAT32 = 13, 3, 6
# The ops quantized, and what each becomes.
QUANTIZED = {"aten::linear": QUANTIZED_LINEAR, "aten::conv2d": QUANTIZED_CONV2D}
_CONV2D = ("aten::conv2d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[2] "
           "stride=[1, 1], SymInt[2] padding=[0, 0], SymInt[2] dilation=[1, 1], "
           "SymInt groups=1) -> Tensor")
# The fractions of the observed range tried as the clipping range (1.0: min/max).
_CLIP_FACTORS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5)
# Linear layers with fewer multiply-adds a call stay float32: quantizing the input and
# oneDNN's call cost about what int8 saves there, unless a larger layer reads the same
# input. Convolutions that Blade's own int8 kernel runs (csrc/ral/int8_conv.h) are int8
# however small: its call costs little, and their float32 inputs and results stay NHWC
# (codegen/stablehlo/layouts.py), so MobileNetV3's 0.2-13M ones run faster in int8 than
# in float32, and a network's convolutions stay int8 end to end.
MIN_MACS = 1 << 24
# A linear layer with at least this many weights and at most MAX_WEIGHT_BOUND_ROWS rows a
# call (a classifier's, a decoder's at batch 1) is bound by reading its weight, which int8
# cuts to a quarter: such layers are int8 whatever their multiply-adds.
MIN_WEIGHT_BOUND_WEIGHTS = 1 << 20
MAX_WEIGHT_BOUND_ROWS = 16
# Values of each layer's input kept per calibration input for the range search.
_SAMPLE = 1 << 16
# torch.float32 as TorchScript's ScalarType number.
_FLOAT32 = 6
# Quantizing the first or last layer may lower the output's cosine similarity to float
# eager's by at most this much more than quantizing the others did.
_END_LAYER_COST = 1e-3


@dataclass
class LinearLayer:
    """One `aten::linear` or `aten::conv2d` chosen for int8, and what calibration found
    for it."""
    node: torch._C.Node
    name: str  # the weight's attribute path (or its value's name)
    operand: int = 0  # the operand of `node` observed (an add's: its residual operand)
    macs: int = 0  # multiply-adds of its largest call on the calibration inputs
    low: float = float("inf")
    high: float = float("-inf")
    samples: List[torch.Tensor] = field(default_factory=list)
    scale: float = 1.0
    zero_point: int = 0


@dataclass
class Int8Weight:
    """A quantized weight: its int8 values and scales, the activation scale and zero point
    of the layers that read it (None where they differ), its float storage, and the float
    weight itself (for the report's error of each int8 engine, frontend/int8_error)."""
    values: torch.Tensor
    scales: torch.Tensor
    activation: Optional[Tuple[float, int]]
    storage: int
    original: Optional[torch.Tensor] = None


@dataclass
class Int8Summary:
    """What quantization did, for the report."""
    layers: List[str] = field(default_factory=list)
    float_layers: Dict[str, str] = field(default_factory=dict)  # name -> why it stays float
    # Linears left float without a name worth listing: in branches the calibration inputs
    # never took (nn.TransformerEncoderLayer's training path), or with a computed weight.
    unreached: int = 0
    computed_weights: int = 0
    # Layers that hand uint8 activations to the next (int8_handoffs.hand_on_uint8).
    chained: int = 0
    # Float activations that the engines' code rounds to uint8 for the int8 linears
    # reading them (int8_handoffs.round_in_code).
    rounded_in_code: int = 0
    # Residual adds folded into the convolution before them (int8_handoffs).
    residual_adds: int = 0
    # Linears the calibration never reached that read a quantized weight (or rows of one):
    # int8 with the activation's scale measured on each call (int8_readers).
    uncalibrated: int = 0
    calibration_inputs: int = 0
    # Output agreement of the quantized graph with the float graph, on the calibration inputs.
    cosine: float = 1.0
    max_abs_error: float = 0.0
    # Engine name -> its error against its float twin (frontend/int8_error.EngineError's
    # dict), the engines that compiled.
    engines: Dict[str, dict] = field(default_factory=dict)
    # Float weight (data pointer, sizes, strides) -> its int8 copy; not reported.
    weights: Dict[Tuple, Int8Weight] = field(default_factory=dict)
    # The float graph's outputs on each calibration input (for `agreement`); not reported.
    references: List = field(default_factory=list)

    def measure_agreement(self, module, graph: torch._C.Graph, calibration) -> None:
        """The output agreement of `graph` as it is (every int8 rewrite made) with the
        float graph's, on the calibration inputs."""
        self.cosine, self.max_abs_error = _agreement_with(module, graph, [], calibration,
                                                          self.references, self.weights)

    def to_dict(self) -> dict:
        return {"layers": self.layers, "float_layers": self.float_layers,
                "unreached": self.unreached, "computed_weights": self.computed_weights,
                "uncalibrated": self.uncalibrated, "chained": self.chained,
                "rounded_in_code": self.rounded_in_code,
                "residual_adds": self.residual_adds,
                "calibration_inputs": self.calibration_inputs, "cosine": self.cosine,
                "max_abs_error": self.max_abs_error, "engines": self.engines}


def weight_name(node: torch._C.Node) -> str:
    """The attribute path of a layer's weight when freezing kept it as the constant's name
    (`self.encoder.layer.0.output.dense.weight` -> `encoder.layer.0.output.dense`)."""
    name = node.inputsAt(1).debugName()
    name = name[len("self."):] if name.startswith("self.") else name
    for suffix in (".weight", ".weight_fused_bn"):  # the latter: freezing folded a BatchNorm
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def candidates(graph: torch._C.Graph, excluded_ops: Sequence[str],
               float_layers: Sequence[str], summary: "Int8Summary") -> List[LinearLayer]:
    """The linear layers to quantize; the summary gets the ones kept float."""
    chosen: List[LinearLayer] = []
    kept = summary.float_layers
    for node in _linears(graph):
        if node.kind() in excluded_ops:
            continue
        name = weight_name(node)
        weight = _constant_tensor(node.inputsAt(1))
        bias_value = node.inputsAt(2)
        bias = _constant_tensor(bias_value)
        rank = 2 if node.kind() == "aten::linear" else 4
        if weight is None:
            summary.computed_weights += 1
        elif weight.dtype != torch.float32 or weight.dim() != rank:
            kept[name] = f"its weight is not a float32 tensor of {rank} dims"
        elif rank == 4 and (node.schema() != _CONV2D or not all(
                v.node().kind() in ("prim::Constant", "prim::ListConstruct")
                for v in list(node.inputs())[3:])):
            kept[name] = "its padding is a string or its strides are computed"
        elif rank == 4 and _constant_value(node.inputsAt(6)) != 1 and \
                not _depthwise_on_blades_kernel(node, weight):
            # Grouped convolutions are memory-bound: int8 saves no time there and its
            # quantize and layout passes cost some (as in bf16 mode). Depthwise ones that
            # Blade's kernel runs read and write uint8 activations: a quarter of the bytes.
            kept[name] = "it is a grouped convolution, memory-bound (int8 depthwise ones: " \
                "3x3 or 5x5, no dilation)"
        elif bias is None and bias_value.type() != torch._C.NoneType.get() and \
                not _is_none(bias_value):
            kept[name] = "its bias is computed, not a constant"
        elif bias is not None and bias.dtype != torch.float32:
            kept[name] = "its bias is not float32"
        elif any(name == p or name.startswith(p + ".") for p in float_layers):
            kept[name] = "it is in Config.float_layers"
        else:
            chosen.append(LinearLayer(node, name))
    return chosen


def _linears(graph: torch._C.Graph) -> List[torch._C.Node]:
    """The graph's `aten::linear` and `aten::conv2d` nodes, branches and loops included,
    in an order that a copy of the graph repeats."""
    return nodes_of(graph, QUANTIZED)


def _in_model_order(graph: torch._C.Graph, layers: List["LinearLayer"]) -> List["LinearLayer"]:
    order = {node: k for k, node in enumerate(all_nodes(graph))}
    return sorted(layers, key=lambda layer: order[layer.node])


def _constant_value(value: torch._C.Value):
    return value.toIValue() if value.node().kind() == "prim::Constant" else None


def _is_none(value: torch._C.Value) -> bool:
    return value.node().kind() == "prim::Constant" and value.toIValue() is None


def _constant_tensor(value: torch._C.Value) -> Optional[torch.Tensor]:
    if value.node().kind() != "prim::Constant":
        return None
    ivalue = value.toIValue()
    return ivalue if isinstance(ivalue, torch.Tensor) else None


def observe(module, graph: torch._C.Graph, layers: List[LinearLayer], run_inputs) -> List:
    """Runs a copy of `graph` that also returns every layer's input on each of
    `run_inputs`; keeps each layer's range and a sample of its values. Returns the graph's
    own outputs per input (the float reference)."""
    copy = graph.copy()
    originals = {node: k for k, node in enumerate(all_nodes(graph))}
    copied = all_nodes(copy)
    first = next(iter(copy.nodes()))
    none = copy.insertConstant(None)
    none.node().moveBefore(first)
    tensors = torch._C.ListType(torch._C.TensorType.get())
    observed = []
    for layer in layers:
        linear = copied[originals[layer.node]]
        # A list at the top that the layer's block appends to (a branch's value cannot be
        # returned; a loop's appends each of its runs); a clone, since an in-place op
        # after the layer would change the value.
        record = copy.create("prim::ListConstruct")
        record.output().setType(tensors)
        record.insertBefore(first)
        observed_value = linear.inputsAt(layer.operand)
        clone = copy.create("aten::clone", [observed_value, none])
        clone.output().setType(observed_value.type())
        clone.insertBefore(linear)
        append = copy.create("aten::append", [record.output(), clone.output()])
        append.output().setType(tensors)
        append.insertAfter(clone)
        observed.append(record.output())
    outputs = list(copy.outputs())
    for _ in range(len(outputs)):
        copy.eraseOutput(0)
    result = copy.create("prim::TupleConstruct", outputs + observed)
    result.output().setType(torch._C.TupleType([v.type() for v in outputs + observed]))
    copy.appendNode(result)
    copy.registerOutput(result.output())
    function = torch._C._create_function_from_graph("blade_calibrate", copy)
    references = []
    names = [argument_name(v) for v in list(graph.inputs())[1:]]
    for index, inputs in enumerate(run_inputs):
        # The plain interpreter: the profiling executor would optimize a graph run a few
        # times only.
        try:
            with torch.no_grad(), torch.jit.optimized_execution(False):
                results = function(module._c, *inputs)
        except RuntimeError as e:
            raise ExampleInputsError(
                f"blade.optimize: the model raised when run on calibration input {index} "
                f"({describe_inputs(inputs, names)}): {failure_summary(e)}. Calibration "
                "inputs must be what forward takes, like the example inputs.",
                str(e)) from None
        references.append(results[:len(outputs)])
        for layer, seen in zip(layers, results[len(outputs):]):
            for x in seen:
                if layer.node.kind() in QUANTIZED:
                    layer.macs = max(layer.macs, _macs(layer.node, x.shape))
                x = x.detach().float().reshape(-1)
                if x.numel() == 0:
                    continue
                layer.low = min(layer.low, float(x.min()))
                layer.high = max(layer.high, float(x.max()))
                step = max(1, x.numel() // _SAMPLE)
                layer.samples.append(x[::step].clone())
    return references


def _macs(node: torch._C.Node, input_shape) -> int:
    """Multiply-adds of `node` (a linear or 2-d convolution) on an input of `input_shape`."""
    weight = _constant_tensor(node.inputsAt(1))
    if node.kind() == "aten::linear":
        return (int(torch.Size(input_shape).numel()) // max(1, input_shape[-1])) * \
            weight.shape[0] * weight.shape[1]
    stride, padding, dilation = (_constant_value(node.inputsAt(i)) for i in (3, 4, 5))
    out = [(input_shape[2 + d] + 2 * padding[d] - dilation[d] * (weight.shape[2 + d] - 1) - 1)
           // stride[d] + 1 for d in range(2)]
    return input_shape[0] * out[0] * out[1] * weight[0].numel() * weight.shape[0]


def _weight_bound(layer: LinearLayer) -> bool:
    """Whether `layer` is a linear layer whose calls read more weight than they compute
    with (MIN_WEIGHT_BOUND_WEIGHTS, MAX_WEIGHT_BOUND_ROWS)."""
    if layer.node.kind() != "aten::linear":
        return False
    weights = _constant_tensor(layer.node.inputsAt(1)).numel()
    return weights >= MIN_WEIGHT_BOUND_WEIGHTS and \
        layer.macs <= MAX_WEIGHT_BOUND_ROWS * weights


def _blade_kernel_takes(layer: LinearLayer) -> bool:
    """Whether `layer` is a convolution that Blade's own int8 kernels run on this CPU
    (one group, candidates' rule, or depthwise; no dilation)."""
    return layer.node.kind() == "aten::conv2d" and _C.int8_conv_available() and \
        _constant_value(layer.node.inputsAt(5)) == [1, 1]


def _depthwise_on_blades_kernel(node: torch._C.Node, weight: torch.Tensor) -> bool:
    """Whether the grouped convolution `node` (a constant groups) is a depthwise one that
    Blade's int8 depthwise kernel runs: one filter of 3x3 or 5x5 per channel, no dilation
    (csrc/ral/depthwise_conv.h)."""
    return weight.dim() == 4 and weight.shape[1] == 1 and \
        _constant_value(node.inputsAt(6)) == weight.shape[0] and \
        tuple(weight.shape[2:]) in ((3, 3), (5, 5)) and \
        _constant_value(node.inputsAt(5)) == [1, 1] and _C.int8_depthwise_available()


def choose_range(layer: LinearLayer) -> None:
    """The layer's input scale and zero point (see the module's docstring)."""
    if not layer.samples or not (layer.high >= layer.low):
        layer.scale, layer.zero_point = 1.0, 0
        return
    sample = torch.cat(layer.samples)
    best = None
    for alpha in _CLIP_FACTORS:
        scale, zero_point = uint8_range(alpha * layer.low, alpha * layer.high)
        q = torch.clamp(torch.round(sample / scale) + zero_point, 0, 255)
        error = float(((q - zero_point) * scale - sample).pow(2).mean())
        if best is None or error < best[0]:
            best = (error, scale, zero_point)
    _, layer.scale, layer.zero_point = best
    layer.samples = []


def uint8_range(low: float, high: float) -> Tuple[float, int]:
    """Scale and zero point covering [min(low, 0), max(high, 0)] in 256 steps (as
    csrc/ral/int8_kernels.cpp's uint8_range)."""
    low, high = min(low, 0.0), max(high, 0.0)
    if not high > low or not torch.isfinite(torch.tensor(high - low)):
        return 1.0, 0
    scale = (high - low) / 255.0
    return scale, int(min(255, max(0, round(-low / scale))))


def quantize_weight(weight: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per output channel (dim 0), symmetric: int8 values in [-limit, limit] (this CPU's
    `_C.int8_weight_limit()`: 127, or 64 with AVX2 alone; 127 where it has no int8
    kernels, whose ops then compute in float32) and float32 scales."""
    limit = _C.int8_weight_limit() or 127
    scale = weight.abs().amax(dim=tuple(range(1, weight.dim()))) / float(limit)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    rows = scale.view([-1] + [1] * (weight.dim() - 1))
    q = torch.clamp(torch.round(weight / rows), -limit, limit).to(torch.int8)
    return q, scale.float().contiguous()


def _key(weight: torch.Tensor) -> Tuple:
    return weight.data_ptr(), tuple(weight.shape), tuple(weight.stride())


def rewrite(graph: torch._C.Graph, layer: LinearLayer,
            weights: Optional[Dict[Tuple, Int8Weight]] = None) -> torch._C.Node:
    """Replaces the layer's `aten::linear` by `blade::quantized_linear`; `weights` shares
    the int8 copy of a weight between the layers and graphs that read it."""
    node = layer.node
    weight = _constant_tensor(node.inputsAt(1))
    weights = {} if weights is None else weights
    key = _key(weight)
    activation = (layer.scale, layer.zero_point)
    if key not in weights:
        values, scales = quantize_weight(weight)
        weights[key] = Int8Weight(values, scales, activation,
                                  weight.untyped_storage().data_ptr(), weight)
    entry = weights[key]
    if entry.activation != activation:
        entry.activation = None  # layers with other ranges share the weight
    return _insert(graph, node, entry.values, entry.scales, layer.scale, layer.zero_point,
                   layer.name)


def _insert(graph, node, q, scale, x_scale_value: float, x_zero_point_value: int,
            name: str, bias=None) -> torch._C.Node:
    """`blade::quantized_linear` of `node`'s input 0 (and bias: `bias`, else its input 2)
    in place of `node`."""
    with graph.insert_point_guard(node):
        q_value = graph.insertConstant(q)
        scale_value = graph.insertConstant(scale)
        input_range = graph.insertConstant(
            torch.tensor([float(x_scale_value), float(x_zero_point_value)]))
    q_value.setDebugName(f"{name}.weight_int8")
    scale_value.setDebugName(f"{name}.weight_scale")
    input_range.setDebugName(f"{name}.input_range")
    operands = [node.inputsAt(0), q_value, scale_value,
                node.inputsAt(2) if bias is None else bias]
    operands.append(input_range)
    if node.kind() == "aten::conv2d":  # stride, padding, dilation, groups
        operands[4:4] = list(node.inputs())[3:7]
    with graph.insert_point_guard(node):  # a float result, no post-op
        operands += [graph.insertConstant(None), graph.insertConstant("none")]
    kind = QUANTIZED.get(node.kind(), QUANTIZED_LINEAR)
    quantized = graph.create(kind, operands, 1)
    quantized.insertBefore(node)
    quantized.output().setType(node.output().type())
    node.output().replaceAllUsesWith(quantized.output())
    node.destroy()
    return quantized


def quantize(module, graph: torch._C.Graph, calibration: Sequence[Tuple],
             excluded_ops: Sequence[str] = (), float_layers: Sequence[str] = ()) -> Int8Summary:
    """Quantizes the linear layers of the frozen `module`'s `graph` in place, calibrated on
    `calibration` (tuples of forward's inputs, bound as the graph takes them)."""
    summary = Int8Summary(calibration_inputs=len(calibration))
    layers = candidates(graph, excluded_ops, float_layers, summary)
    if not layers:
        return summary
    adds = [LinearLayer(add.node, add.name, operand=add.other) for add in residual_adds(
        graph, {layer.node: layer.name for layer in layers if layer.node.kind() ==
                "aten::conv2d"})]
    references = summary.references = observe(module, graph, layers + adds, calibration)
    summary.unreached = sum(not layer.samples for layer in layers)
    layers = [layer for layer in layers if layer.samples]
    # A small layer whose input a large one reads too stays int8: that input is rounded to
    # uint8 once for both (ResNet's first 1x1 beside its projection).
    shared = {layer.node.inputsAt(0).unique() for layer in layers if layer.macs >= MIN_MACS}
    for layer in [layer for layer in layers if layer.macs < MIN_MACS and
                  layer.node.inputsAt(0).unique() not in shared and not _weight_bound(layer)
                  and not _blade_kernel_takes(layer)]:
        summary.float_layers[layer.name] = (
            f"{layer.macs / 1e6:.1f}M multiply-adds a call: too few for int8 to repay "
            "quantizing its input and the call")
        layers.remove(layer)
    if not layers:
        return summary
    for layer in layers:
        choose_range(layer)
    layers = _in_model_order(graph, layers)
    ends = [layers[0]] + ([layers[-1]] if len(layers) > 1 else [])
    middle = [layer for layer in layers if all(layer is not e for e in ends)]
    chosen, (summary.cosine, summary.max_abs_error) = _keep_ends_safe(
        module, graph, middle, ends, calibration, references, summary)
    for layer in chosen:
        rewrite(graph, layer, summary.weights)
        summary.layers.append(layer.name)
    for add in adds:
        choose_range(add)
    summary.residual_adds = fuse_residual_adds(graph, [
        ResidualAdd(add.node, add.operand, add.name, add.scale, add.zero_point)
        for add in adds if add.high >= add.low])
    return summary


def int8_readers(graph: torch._C.Graph, weights: Dict[Tuple, Int8Weight]) -> Tuple[int, int]:
    """Makes every other reader of a quantized float weight, or of a block of its rows (the
    constant-folded q/k/v blocks of an attention's in-projection), read its int8 copy: an
    `aten::linear` becomes `blade::quantized_linear` (with the layer's activation scale, or
    one measured on each call where no calibrated layer read it or several did, with
    different ranges), any other reader (a fused op, a branch the calibration never took)
    gets `int8 values * scales`, computed where it reads it. The float weight then has no
    reader, and the saved model holds its int8 copy alone. Run on the optimized graph after
    its last constant propagation (which would fold `values * scales` back into a float
    constant), and on the unspecialized one. Returns how many linears and other readers."""
    linears = others = 0
    for constant in graph.findAllNodes("prim::Constant", True):
        if not constant.output().uses() or \
                not isinstance(constant.output().type(), torch._C.TensorType):
            continue
        found = _int8_rows(constant.output().toIValue(), weights)
        if found is None:
            continue
        for use in list(constant.output().uses()):
            user = use.user
            if user.kind() in QUANTIZED and use.offset == 1 and \
                    (user.kind() == "aten::linear" or user.schema() == _CONV2D):
                x_scale, x_zero_point = found.activation or (-1.0, 0)
                _insert(graph, user, found.values, found.scales, x_scale, x_zero_point,
                        weight_name(user))
                linears += 1
                continue
            with graph.insert_point_guard(user):
                values = graph.insertConstant(found.values)
                rows = graph.insertConstant(found.scales.view(
                    [-1] + [1] * (found.values.dim() - 1)))
                widened = graph.insert("aten::to", [values, graph.insertConstant(_FLOAT32)])
                dequantized = graph.insert("aten::mul", [widened, rows])
            user.replaceInput(use.offset, dequantized)
            others += 1
    return linears, others


def _int8_rows(tensor, weights: Dict[Tuple, Int8Weight]) -> Optional[Int8Weight]:
    """The int8 copy of `tensor` when it is a quantized weight or a block of its rows."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or \
            tensor.dim() != 2:
        return None
    if _key(tensor) in weights:
        return weights[_key(tensor)]
    storage = tensor.untyped_storage().data_ptr()
    for (data, shape, stride), entry in weights.items():
        if entry.storage != storage or tuple(tensor.stride()) != stride or \
                tensor.shape[1] != shape[1]:
            continue
        offset = (tensor.data_ptr() - data) // tensor.element_size()
        first = offset // stride[0]
        if offset % stride[0] == 0 and 0 <= first and first + tensor.shape[0] <= shape[0]:
            rows = slice(first, first + tensor.shape[0])
            # Kept with the weights: the graph's other readers of these rows, and the other
            # graph's, share one copy.
            weights[_key(tensor)] = Int8Weight(entry.values[rows].contiguous(),
                                               entry.scales[rows].contiguous(), None, storage,
                                               tensor)
            return weights[_key(tensor)]
    return None


def from_dynamic_quantized(graph: torch._C.Graph) -> int:
    """A model quantized before optimize with `torch.ao.quantization.quantize_dynamic`:
    each `quantized::linear_dynamic` (int8 weights, activations quantized per call) whose
    weight is symmetric (zero points 0, per tensor or per output channel) becomes
    `blade::quantized_linear` with the same int8 values and scales and an activation
    range measured on each call, which engines compile. (fbgemm's kernel keeps 7 of the
    activations' 8 bits with `reduce_range`, so that CPUs without VNNI do not saturate;
    this one keeps all 8, on CPUs with VNNI or AMX only: elsewhere the op stays.)
    Returns how many layers it rewrote."""
    count = 0
    for node in graph.findAllNodes("quantized::linear_dynamic", True):
        weight = _packed_int8_weight(graph, node)
        if weight is None:
            continue
        _insert(graph, node, *weight[:2], -1.0, 0, weight[2], bias=weight[3])
        count += 1
    return count


def _packed_int8_weight(graph: torch._C.Graph, node: torch._C.Node,
                        at: Optional[torch._C.Node] = None):
    """The int8 values, per-row scales, layer name and bias (a constant inserted before
    `at`, else `node`) of the constant packed weight that `node` (a quantized::linear*) reads, when
    it is symmetric int8 (zero points 0, per tensor or per output channel); else None."""
    packed = node.inputsAt(1)
    if packed.node().kind() != "prim::Constant":
        return None
    weight, bias = torch.ops.quantized.linear_unpack(packed.toIValue())
    if weight.dtype != torch.qint8:
        return None
    if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        if weight.q_zero_point() != 0:
            return None
        scales = torch.full((weight.shape[0],), weight.q_scale(), dtype=torch.float32)
    elif weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        if weight.q_per_channel_axis() != 0 or \
                bool((weight.q_per_channel_zero_points() != 0).any()):
            return None
        scales = weight.q_per_channel_scales().float().contiguous()
    else:
        return None
    values = weight.int_repr().detach().contiguous()
    with graph.insert_point_guard(at or node):
        bias_value = graph.insertConstant(bias.detach().float().contiguous() if bias is not None
                                          else None)
    name = packed.debugName()
    suffix = "._packed_params._packed_params"
    return values, scales, name[:-len(suffix)] if name.endswith(suffix) else name, bias_value


def from_static_quantized(graph: torch._C.Graph) -> int:
    """A model quantized before optimize with eager-mode static quantization
    (`torch.ao.quantization.prepare` / `convert`): each `quantized::linear` between a
    `quantize_per_tensor` (uint8, constant scale and zero point) of a float activation
    and the one `dequantize` of its result (two would share one tensor) becomes Blade's
    int8 layer with the same int8 weight and scales, the input quantized with that scale
    and zero point and the result rounded to uint8 with the layer's output scale and
    zero point (oneDNN), then dequantized: eager's numbers, but for float32 rounding
    before the output's rounding. Returns how many layers it rewrote."""
    count = 0
    for node in graph.findAllNodes("quantized::linear", True):
        x, _, out_scale, out_zero_point = node.inputs()
        source = x.node()
        readers = [use.user for use in node.output().uses()]
        if source.kind() != "aten::quantize_per_tensor" or source.schema() == "(no schema)" \
                or len(readers) != 1 or any(r.kind() != "aten::dequantize" or
                                      r.inputsAt(0) is not node.output() or
                                      len(list(r.inputs())) != 1 for r in readers):
            continue
        scale, zero_point, dtype = (_constant_value(v) for v in list(source.inputs())[1:])
        output_range = (_constant_value(out_scale), _constant_value(out_zero_point))
        scale, zero_point = (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1
                             else v for v in (scale, zero_point))
        if dtype != _QUINT8 or not isinstance(scale, float) or \
                not isinstance(zero_point, int) or not isinstance(output_range[0], float) or \
                not isinstance(output_range[1], int):
            continue
        activation = source.inputsAt(0).type()
        if isinstance(activation, torch._C.TensorType) and \
                activation.scalarType() not in (None, "Float"):
            continue  # the int8 layer takes float32
        weight = _packed_int8_weight(graph, node, at=source)
        if weight is None:
            continue
        values, scales, name, bias = weight
        # Made where the activation was quantized: the layer reads the float values of
        # then, as the quantized copy eager makes there holds them, whatever writes follow.
        with graph.insert_point_guard(source):
            int8_range = graph.insertConstant(torch.tensor([scale, float(zero_point)]))
            out_range = graph.insertConstant(torch.tensor([output_range[0],
                                                           float(output_range[1])]))
            none = graph.insertConstant("none")
            weights = (graph.insertConstant(values), graph.insertConstant(scales))
        layer = graph.create(QUANTIZED_LINEAR, [source.inputsAt(0), *weights, bias,
                                                int8_range, out_range, none], 1)
        layer.insertBefore(source)
        weights[0].setDebugName(f"{name}.weight_int8")
        with graph.insert_point_guard(source):
            # The uint8 result, carried as int8 bytes: (byte & 255 - zero point) * scale.
            unsigned = insert_op(graph, "aten::bitwise_and",
                                 insert_op(graph, "aten::to", layer.output(), _INT32), 255)
            dequantized = insert_op(graph, "aten::mul", insert_op(
                graph, "aten::sub", insert_op(graph, "aten::to", unsigned, _FLOAT32),
                output_range[1]), output_range[0])
        for reader in readers:
            reader.output().replaceAllUsesWith(dequantized)
            reader.destroy()
        node.destroy()
        if not source.output().uses():
            source.destroy()
        count += 1
    return count


def _keep_ends_safe(module, graph, middle: List[LinearLayer], ends: List[LinearLayer],
                    calibration, references,
                    summary: Int8Summary) -> Tuple[List[LinearLayer], Tuple[float, float]]:
    """The layers to quantize: all of `middle`, and each of `ends` whose quantization costs
    at most _END_LAYER_COST of the output's cosine similarity on the calibration inputs
    beyond what the middle layers cost; and the output's agreement (cosine, largest
    absolute error) with them quantized."""
    weights = summary.weights  # one int8 copy per weight, for the trials and the graph
    chosen = list(middle)
    agreement = _agreement_with(module, graph, chosen, calibration, references, weights)
    for end in ends:
        trial = _agreement_with(module, graph, chosen + [end], calibration, references,
                                weights)
        cost = agreement[0] - trial[0]
        if cost <= _END_LAYER_COST:
            chosen.append(end)
            agreement = trial
        else:
            summary.float_layers[end.name] = (
                f"quantizing it lowered the output's cosine similarity by {cost:.4f} on the "
                "calibration inputs")
    return _in_model_order(graph, chosen), agreement


def _agreement_with(module, graph, layers: List[LinearLayer], calibration, references,
                    weights: Dict[Tuple, Int8Weight]) -> Tuple[float, float]:
    """Cosine similarity (of all float outputs, flattened together) and the largest absolute
    difference between the outputs of `graph` with `layers` quantized (on a copy) and
    `references`, on the calibration inputs."""
    copy = graph.copy()
    originals = _linears(graph)
    copied = _linears(copy)
    for layer in layers:
        twin = LinearLayer(copied[originals.index(layer.node)], layer.name,
                           scale=layer.scale, zero_point=layer.zero_point)
        rewrite(copy, twin, weights)
    function = torch._C._create_function_from_graph("blade_int8_check", copy)
    got, want = [], []
    for inputs, reference in zip(calibration, references):
        with torch.no_grad(), torch.jit.optimized_execution(False):
            got += _float_leaves(function(module._c, *inputs))
        want += _float_leaves(reference)
    if not got:
        return 1.0, 0.0
    a = torch.cat([t.reshape(-1).double() for t in got])
    b = torch.cat([t.reshape(-1).double() for t in want])
    if not a.numel():
        return 1.0, 0.0
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0)), \
        float((a - b).abs().max())


def _float_leaves(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _float_leaves(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _float_leaves(v)]
    return []
