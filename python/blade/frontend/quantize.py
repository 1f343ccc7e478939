"""Blade's own post-training int8 quantization (Config(precision="int8")), on the frozen graph.

Which layers: every `aten::linear` of the graph (in branches and loops too) that the
calibration inputs reach and whose weight is a float32 constant of the frozen module (its
bias one too, or None), unless `aten::linear` is in
Config.excluded_ops or the weight's attribute path starts with one of
Config.float_layers. Softmax, normalisation and everything else stay float32. The first
and the last of them are quantized only where the calibration run shows it safe (see
`_keep_ends_safe`): they see the raw input and make the model's answer, and are where
int8 most often costs accuracy.

How: the weight gets one symmetric int8 scale per output channel (max |w| / 127, the
values in [-127, 127]); the layer's input gets one uint8 scale and zero point per tensor,
from the calibration inputs. Its range is chosen by the error it leaves: the run keeps a
sample of the values each layer reads, and of the ranges [alpha * low, alpha * high] for
alpha in `_CLIP_FACTORS` (alpha = 1 is min/max) the one whose quantize-dequantize of the
sample has the least mean squared error wins. Min/max alone lets one outlier of a GELU's
output stretch the steps for all the other values; a percentile cut must be tuned per
model; the squared error weighs both effects on the values actually seen.

The layer becomes `blade::quantized_linear(x, w_int8, w_scale, bias, x_scale,
x_zero_point)` (csrc/ral/int8_kernels.h), which engines call as a kernel call and
TorchScript runs the same way, so the engine and its fallback compute alike.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

QUANTIZED_LINEAR = "blade::quantized_linear"
# The fractions of the observed range tried as the clipping range (1.0: min/max).
_CLIP_FACTORS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5)
# Values of each layer's input kept per calibration input for the range search.
_SAMPLE = 1 << 16
# torch.float32 as TorchScript's ScalarType number.
_FLOAT32 = 6
# Quantizing the first or last layer may lower the output's cosine similarity to float
# eager's by at most this much more than quantizing the others did.
_END_LAYER_COST = 1e-3


@dataclass
class LinearLayer:
    """One `aten::linear` chosen for int8, and what calibration found for it."""
    node: torch._C.Node
    name: str  # the weight's attribute path (or its value's name)
    low: float = float("inf")
    high: float = float("-inf")
    samples: List[torch.Tensor] = field(default_factory=list)
    scale: float = 1.0
    zero_point: int = 0


@dataclass
class Int8Weight:
    """A quantized weight: its int8 values and scales, the activation scale and zero point
    of the layers that read it (None where they differ), and its float storage."""
    values: torch.Tensor
    scales: torch.Tensor
    activation: Optional[Tuple[float, int]]
    storage: int


@dataclass
class Int8Summary:
    """What quantization did, for the report."""
    layers: List[str] = field(default_factory=list)
    float_layers: Dict[str, str] = field(default_factory=dict)  # name -> why it stays float
    # Linears left float without a name worth listing: in branches the calibration inputs
    # never took (nn.TransformerEncoderLayer's training path), or with a computed weight.
    unreached: int = 0
    computed_weights: int = 0
    # Linears the calibration never reached that read a quantized weight (or rows of one):
    # int8 with the activation's scale measured on each call (int8_readers).
    uncalibrated: int = 0
    calibration_inputs: int = 0
    # Output agreement of the quantized graph with the float graph, on the calibration inputs.
    cosine: float = 1.0
    max_abs_error: float = 0.0
    # Float weight (data pointer, sizes, strides) -> its int8 copy; not reported.
    weights: Dict[Tuple, Int8Weight] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"layers": self.layers, "float_layers": self.float_layers,
                "unreached": self.unreached, "computed_weights": self.computed_weights,
                "uncalibrated": self.uncalibrated,
                "calibration_inputs": self.calibration_inputs, "cosine": self.cosine,
                "max_abs_error": self.max_abs_error}


def weight_name(node: torch._C.Node) -> str:
    """The attribute path of a linear's weight when freezing kept it as the constant's name
    (`self.encoder.layer.0.output.dense.weight` -> `encoder.layer.0.output.dense`)."""
    name = node.inputsAt(1).debugName()
    name = name[len("self."):] if name.startswith("self.") else name
    return name[:-len(".weight")] if name.endswith(".weight") else name


def candidates(graph: torch._C.Graph, excluded_ops: Sequence[str],
               float_layers: Sequence[str], summary: "Int8Summary") -> List[LinearLayer]:
    """The linear layers to quantize; the summary gets the ones kept float."""
    chosen: List[LinearLayer] = []
    kept = summary.float_layers
    if "aten::linear" in excluded_ops:
        return chosen
    for node in _linears(graph):
        name = weight_name(node)
        weight = _constant_tensor(node.inputsAt(1))
        bias_value = node.inputsAt(2)
        bias = _constant_tensor(bias_value)
        if weight is None:
            summary.computed_weights += 1
        elif weight.dtype != torch.float32 or weight.dim() != 2:
            kept[name] = "its weight is not a float32 matrix"
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
    """The graph's `aten::linear` nodes, branches and loops included, in an order that a
    copy of the graph repeats."""
    return graph.findAllNodes("aten::linear", True)


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
    originals = _linears(graph)
    copied = _linears(copy)
    first = next(iter(copy.nodes()))
    none = copy.insertConstant(None)
    none.node().moveBefore(first)
    tensors = torch._C.ListType(torch._C.TensorType.get())
    observed = []
    for layer in layers:
        linear = copied[originals.index(layer.node)]
        # A list at the top that the layer's block appends to (a branch's value cannot be
        # returned; a loop's appends each of its runs); a clone, since an in-place op
        # after the layer would change the value.
        record = copy.create("prim::ListConstruct")
        record.output().setType(tensors)
        record.insertBefore(first)
        clone = copy.create("aten::clone", [linear.inputsAt(0), none])
        clone.output().setType(linear.inputsAt(0).type())
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
    for inputs in run_inputs:
        # The plain interpreter: the profiling executor would optimize a graph run a few
        # times only.
        with torch.no_grad(), torch.jit.optimized_execution(False):
            results = function(module._c, *inputs)
        references.append(results[:len(outputs)])
        for layer, seen in zip(layers, results[len(outputs):]):
            for x in seen:
                x = x.detach().float().reshape(-1)
                if x.numel() == 0:
                    continue
                layer.low = min(layer.low, float(x.min()))
                layer.high = max(layer.high, float(x.max()))
                step = max(1, x.numel() // _SAMPLE)
                layer.samples.append(x[::step].clone())
    return references


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
    """Per output channel, symmetric: int8 values in [-127, 127] and float32 scales."""
    scale = weight.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(weight / scale.unsqueeze(1)), -127, 127).to(torch.int8)
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
                                  weight.untyped_storage().data_ptr())
    entry = weights[key]
    if entry.activation != activation:
        entry.activation = None  # layers with other ranges share the weight
    return _insert(graph, node, entry.values, entry.scales, layer.scale, layer.zero_point,
                   layer.name)


def _insert(graph, node, q, scale, x_scale_value: float, x_zero_point_value: int,
            name: str) -> torch._C.Node:
    with graph.insert_point_guard(node):
        q_value = graph.insertConstant(q)
        scale_value = graph.insertConstant(scale)
        input_range = graph.insertConstant(
            torch.tensor([float(x_scale_value), float(x_zero_point_value)]))
    q_value.setDebugName(f"{name}.weight_int8")
    scale_value.setDebugName(f"{name}.weight_scale")
    input_range.setDebugName(f"{name}.input_range")
    quantized = graph.create(QUANTIZED_LINEAR, [node.inputsAt(0), q_value, scale_value,
                                                node.inputsAt(2), input_range], 1)
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
    references = observe(module, graph, layers, calibration)
    summary.unreached = sum(not layer.samples for layer in layers)
    layers = [layer for layer in layers if layer.samples]
    if not layers:
        return summary
    for layer in layers:
        choose_range(layer)
    ends = [layers[0]] + ([layers[-1]] if len(layers) > 1 else [])
    middle = [layer for layer in layers if all(layer is not e for e in ends)]
    chosen, (summary.cosine, summary.max_abs_error) = _keep_ends_safe(
        module, graph, middle, ends, calibration, references, summary)
    for layer in chosen:
        rewrite(graph, layer, summary.weights)
        summary.layers.append(layer.name)
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
            if user.kind() == "aten::linear" and use.offset == 1:
                x_scale, x_zero_point = found.activation or (-1.0, 0)
                _insert(graph, user, found.values, found.scales, x_scale, x_zero_point,
                        weight_name(user))
                linears += 1
                continue
            with graph.insert_point_guard(user):
                values = graph.insertConstant(found.values)
                rows = graph.insertConstant(found.scales.unsqueeze(1))
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
                                               entry.scales[rows].contiguous(), None, storage)
            return weights[_key(tensor)]
    return None


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
    order = {node: k for k, node in enumerate(_linears(graph))}
    return sorted(chosen, key=lambda layer: order[layer.node]), agreement


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
