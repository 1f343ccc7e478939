"""Models quantized with PyTorch's PT2E flow (torchao's `prepare_pt2e` / calibrate /
`convert_pt2e`), as Blade traces them: QuantFusion on the TorchScript graph.

PT2E writes int8 as float ops between `quantized_decomposed` pairs: the activation
`quantize_per_tensor` (uint8, a scale and zero point: constants from calibration, or
`choose_qparams` of the activation itself in the dynamic config) then
`dequantize_per_tensor`, the weight an int8 constant read through `dequantize_per_channel`
(one scale per output channel, zero points 0), and the layer (`aten::linear`,
`aten::_convolution`) in float32 on the dequantized values. `fuse` replaces each such
pattern by Blade's int8 layer on the float activation and the int8 weight
(`blade::quantized_linear` / `blade::quantized_conv2d`, csrc/ral/int8_kernels.h), which
quantizes the activation with the same scale and zero point and multiplies in integers:
the layer PT2E describes, computed as the description says, with VNNI or AMX. Then `lower`
writes every `quantized_decomposed` op left (the quantize/dequantize pairs around adds and
pooling, say) as the aten ops it stands for, so that the graph needs no Python-defined op
to run or to load in C++.

It runs on the traced module's graph before freezing, where the int8 weights are still
attributes: freezing would fold `dequantize_per_channel` of a constant weight into a float
constant, losing the int8 values and their scales.
"""
from typing import Optional

import torch

from blade.graph_queries import all_nodes, schema_name
from blade.graph_queries import insert_op as _op
from blade.frontend.quantize import QUANTIZED_CONV2D, QUANTIZED_LINEAR

_PREFIX = "quantized_decomposed::"
# TorchScript's ScalarType numbers.
_UINT8, _INT8, _FLOAT32 = 0, 1, 6
_CONTIGUOUS = 0  # torch.contiguous_format


def has_quantized_ops(graph: torch._C.Graph) -> bool:
    return any(n.kind().startswith(_PREFIX) for n in all_nodes(graph))


def fuse(module, graph: torch._C.Graph) -> int:
    """Replaces each dequantize -> linear / 2-d convolution <- dequantize(int8 weight)
    pattern of `graph` (the forward of `module`, inlined, not frozen) by Blade's int8 layer;
    returns how many."""
    count = 0
    for node in list(all_nodes(graph)):
        if node.kind() not in ("aten::linear", "aten::_convolution"):
            continue
        activation = _activation(node.inputsAt(0))
        weight = _weight(module, graph, node.inputsAt(1))
        if activation is None or weight is None:
            continue
        if node.kind() == "aten::_convolution" and not _plain_conv2d(node, weight[0]):
            continue
        x, input_range = activation
        values, scales = weight
        with graph.insert_point_guard(node):
            if not isinstance(input_range, torch._C.Value):
                input_range = graph.insertConstant(torch.tensor(input_range,
                                                                dtype=torch.float32))
            scales = graph.insert("aten::to", [scales, graph.insertConstant(_FLOAT32)])
        operands = [x, values, scales, node.inputsAt(2)]
        kind = QUANTIZED_LINEAR
        if node.kind() == "aten::_convolution":
            kind = QUANTIZED_CONV2D
            operands += [node.inputsAt(3), node.inputsAt(4), node.inputsAt(5),
                         node.inputsAt(8)]
        operands.append(input_range)
        with graph.insert_point_guard(node):  # a float result, no post-op
            operands += [graph.insertConstant(None), graph.insertConstant("none")]
        fused = graph.create(kind, operands, 1)
        fused.insertBefore(node)
        fused.output().setType(node.output().type())
        node.output().replaceAllUsesWith(fused.output())
        node.destroy()
        count += 1
    torch._C._jit_pass_dce(graph)
    return count


def _activation(value: torch._C.Value):
    """(the float activation, its [scale, zero point] or a graph value holding it) when
    `value` is dequantize_per_tensor(quantize_per_tensor(x)) to uint8 with the same scale
    and zero point, constants or choose_qparams(x) (then measured on each call: [-1, 0])."""
    dq = value.node()
    if dq.kind() != _PREFIX + "dequantize_per_tensor":
        return None
    q = dq.inputsAt(0).node()
    if q.kind() != _PREFIX + "quantize_per_tensor" or \
            not all(_same(q.inputsAt(i), dq.inputsAt(i)) for i in range(1, 6)):
        return None
    if _constant(q.inputsAt(3)) != 0 or _constant(q.inputsAt(4)) != 255 or \
            _constant(q.inputsAt(5)) != _UINT8:
        return None
    x, scale, zero_point = q.inputsAt(0), q.inputsAt(1), q.inputsAt(2)
    if scale.node().kind() == "prim::Constant" and zero_point.node().kind() == "prim::Constant":
        return x, [float(scale.toIValue()), float(zero_point.toIValue())]
    chosen = scale.node()
    if chosen.kind() == _PREFIX + "choose_qparams" and chosen.inputsAt(0) == x and \
            zero_point.node() == chosen:
        return x, [-1.0, 0.0]
    return None


def _weight(module, graph, value: torch._C.Value):
    """(the int8 weight value, its scales value) when `value` is dequantize_per_channel of
    an int8 attribute along dim 0 with zero points 0 over [-128, 127]."""
    dq = value.node()
    if dq.kind() != _PREFIX + "dequantize_per_channel":
        return None
    values, scales, zero_points = (_attribute(module, graph, dq.inputsAt(i)) for i in range(3))
    if not all(isinstance(t, torch.Tensor) for t in (values, scales, zero_points)):
        return None
    if values.dtype != torch.int8 or _constant(dq.inputsAt(3)) != 0 or \
            _constant(dq.inputsAt(4)) != -128 or _constant(dq.inputsAt(5)) != 127 or \
            bool((zero_points != 0).any()) or scales.numel() != values.shape[0]:
        return None
    return dq.inputsAt(0), dq.inputsAt(1)


def _plain_conv2d(node: torch._C.Node, weight: torch._C.Value) -> bool:
    """An aten::_convolution that is conv2d: not transposed, no output padding, 4-d."""
    transposed, output_padding = _constant(node.inputsAt(6)), _list(node.inputsAt(7))
    return transposed is False and output_padding is not None and \
        not any(output_padding) and len(output_padding) == 2 and \
        all(_list(node.inputsAt(i)) is not None for i in (3, 4, 5)) and \
        _constant(node.inputsAt(8)) is not None


def _same(a: torch._C.Value, b: torch._C.Value) -> bool:
    if a == b:
        return True
    return a.node().kind() == "prim::Constant" and b.node().kind() == "prim::Constant" and \
        a.toIValue() == b.toIValue()


def _constant(value: torch._C.Value):
    return value.toIValue() if value.node().kind() == "prim::Constant" else None


def _list(value: torch._C.Value) -> Optional[list]:
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        items = [_constant(v) for v in node.inputs()]
        return None if any(i is None for i in items) else items
    constant = _constant(value)
    return list(constant) if isinstance(constant, (list, tuple)) else None


def _attribute(module, graph, value: torch._C.Value):
    """The module attribute `value` reads (a chain of prim::GetAttr from forward's self),
    or the constant it is; None otherwise."""
    node = value.node()
    if node.kind() == "prim::Constant":
        return value.toIValue()
    names = []
    while node.kind() == "prim::GetAttr":
        names.append(node.s("name"))
        source = node.inputsAt(0)
        if source == next(iter(graph.inputs())):
            owner = module._c
            for name in reversed(names):
                owner = owner.getattr(name)
            return owner
        node = source.node()
    return None


# --- what is left, as aten ops -------------------------------------------------------------

def lower(graph: torch._C.Graph) -> int:
    """Writes each quantized_decomposed op left in `graph` as aten ops (PT2E's own
    definitions: round half to even, clamp, the dtype cast); returns how many. An op of
    another overload is left as it is (the registry then reports it)."""
    count = 0
    for node in list(all_nodes(graph)):
        lowering = _LOWERINGS.get(node.kind()[len(_PREFIX):]) \
            if node.kind().startswith(_PREFIX) else None
        if lowering is None:
            continue
        with graph.insert_point_guard(node):
            results = lowering(graph, list(node.inputs()))
        if results is None:
            continue
        for old, new in zip(node.outputs(), results):
            new.setType(old.type())
            old.replaceAllUsesWith(new)
        node.destroy()
        count += 1
    return count


def _float32_scale(graph, scale):
    """A scale the `.tensor` overloads take as a (float64) tensor, in float32: PT2E reads
    it with .item(), so the math stays in the activation's float32."""
    if isinstance(scale.type(), torch._C.TensorType):
        return _op(graph, "aten::to", scale, _FLOAT32)
    return scale


def _quantize(graph, inputs):
    # clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max).to(dtype)
    x, scale, zero_point, low, high, dtype = inputs[:6]
    scale = _float32_scale(graph, scale)
    inverse = _op(graph, "aten::reciprocal", scale) \
        if isinstance(scale.type(), torch._C.TensorType) else \
        _op(graph, "aten::div", 1.0, scale)
    rounded = _op(graph, "aten::round", _op(graph, "aten::mul", x, inverse))
    shifted = _op(graph, "aten::add", rounded, zero_point)
    clamped = _op(graph, "aten::clamp", shifted, low, high)
    return [_op(graph, "aten::to", clamped, dtype)]


def _dequantize(graph, inputs):
    # (x.to(float32) - zero_point) * scale, in out_dtype when given
    x, scale, zero_point = inputs[:3]
    scale = _float32_scale(graph, scale)
    out_dtype = _constant(inputs[6]) if len(inputs) > 6 else None
    widened = _op(graph, "aten::to", x, _FLOAT32)
    result = _op(graph, "aten::mul", _op(graph, "aten::sub", widened, zero_point), scale)
    if out_dtype is not None and out_dtype != _FLOAT32:
        result = _op(graph, "aten::to", result, out_dtype)
    return [result]


def _dequantize_per_channel(graph, inputs):
    # (x.to(float32) - zero_points[c]) * scales[c] along `axis`
    x, scales, zero_points, axis = inputs[:4]
    axis = _constant(axis)
    rank = x.type().dim() if isinstance(x.type(), torch._C.TensorType) else None
    if axis is None or rank is None:
        return None
    shape = [1] * rank
    shape[axis] = -1

    def along(v):
        return _op(graph, "aten::view", _op(graph, "aten::to", v, _FLOAT32), shape)

    widened = _op(graph, "aten::to", x, _FLOAT32)
    return [_op(graph, "aten::mul", _op(graph, "aten::sub", widened, along(zero_points)),
                along(scales))]


def _choose_qparams(graph, inputs):
    # The scale and zero point covering [min(x, 0), max(x, 0)] (at least eps), as PT2E's
    # determine_qparams: float64 [1] and int64 [1].
    x, low, high, eps = inputs[:4]
    if _constant(low) is None or _constant(high) is None or _constant(eps) is None:
        return None
    low_value, high_value = _constant(low), _constant(high)
    lowest = _op(graph, "aten::clamp_max", _op(graph, "aten::min", x), 0.0)
    highest = _op(graph, "aten::clamp_min", _op(graph, "aten::max", x), 0.0)
    scale = _op(graph, "aten::div", _op(graph, "aten::sub", highest, lowest),
                float(high_value - low_value))
    scale = _op(graph, "aten::clamp_min", _op(graph, "aten::to", scale, 7), _constant(eps))
    zero_point = _op(graph, "aten::sub", _op(graph, "aten::neg", _op(graph, "aten::to", _op(
        graph, "aten::round", _op(graph, "aten::div", lowest, scale)), 4)), -low_value)
    zero_point = _op(graph, "aten::clamp", zero_point, low_value, high_value)
    return [_op(graph, "aten::reshape", scale, [1]),
            _op(graph, "aten::reshape", _op(graph, "aten::to", zero_point, 4), [1])]


_LOWERINGS = {
    "choose_qparams": _choose_qparams,
    "quantize_per_tensor": _quantize,
    "dequantize_per_tensor": _dequantize,
    "dequantize_per_channel": _dequantize_per_channel,
}


# --- aten's quantized tensors that do not escape -------------------------------------------

# A quantized dtype (TorchScript's ScalarType number) -> the integer dtype of its values
# and their range.
_QUANTIZED_DTYPES = {12: (1, -128, 127),      # qint8 -> int8
                     13: (0, 0, 255),         # quint8 -> uint8
                     # qint32 -> int32, clamped below 2**31 in float32 (2**31 - 1 is
                     # 2**31 there, which overflows); above, 2**31 - 1 as eager's
                     14: (3, -2**31, 2147483520)}
_READERS = ("aten::dequantize.self", "aten::int_repr")
_MAKERS = ("aten::quantize_per_tensor", "aten::_make_per_tensor_quantized_tensor",
           "aten::_make_per_channel_quantized_tensor")


def quantized_tensor_pairs(graph: torch._C.Graph) -> int:
    """aten's quantized tensors made and read within the graph, written as integer and
    float math: `quantize_per_tensor` (constant scale and zero point), and
    `_make_per_tensor_quantized_tensor` / `_make_per_channel_quantized_tensor` of integer
    values, each read only by `dequantize` (their float values) or `int_repr` (their
    integers). Engines hold no quantized dtype, so these pairs would stay TorchScript.
    Quantizing rounds `x * (1 / scale) + zero_point` half to even in float32, as eager's
    kernels do (PT2E's definition, `lower`'s, rounds before adding); where eager's vector
    code fuses the multiply and add, a value within a float rounding of a half may land a
    step apart. Every value is made where the quantized tensor was, and every read gets a
    tensor of its own. Returns how many quantized tensors were rewritten."""
    count = 0
    makers = [n for n in all_nodes(graph) if n.kind() in _MAKERS]  # before any is rewritten
    for node in makers:
        made = _quantized_tensor(node)
        if made is None:
            continue
        users = [use.user for use in node.output().uses()]
        if not users or not all(_reads_quantized(u) for u in users):
            continue
        # Everything is made where the quantized tensor was: its values are fixed then
        # (eager copies the integers it is made of), whatever writes come later.
        with graph.insert_point_guard(node):
            integers, fresh, dequantized = made(graph)
            values = dequantized(graph) if any(
                u.kind() == "aten::dequantize" for u in users) else None
            values_taken = False
            results = {}
            for user in users:
                # Each read returns a tensor of its own, as eager's do.
                if user.kind() == "aten::dequantize":
                    result = _clone(graph, values, None) if values_taken else values
                    values_taken = True
                elif fresh:
                    result, fresh = integers, False
                else:
                    result = _clone(graph, integers, None)
                results[user] = result
        for user in users:
            results[user].setType(user.output().type())
            user.output().replaceAllUsesWith(results[user])
            user.destroy()
        node.destroy()
        count += 1
    return count


def _reads_quantized(node: torch._C.Node) -> bool:
    """`dequantize(q)` or `int_repr(q)`, the reads `quantized_tensor_pairs` rewrites."""
    return schema_name(node) in _READERS


def _quantized_tensor(node: torch._C.Node):
    """For a node making a quantized tensor of a form `quantized_tensor_pairs` rewrites:
    a function inserting its integer values, returning them, whether they are a tensor of
    their own (not the node's input), and a function inserting its float values."""
    kind = node.kind()
    if kind == "aten::quantize_per_tensor" and node.schema() != "(no schema)":
        x, scale, zero_point, dtype = node.inputs()
        scale, zero_point = _scalar(scale), _scalar(zero_point)
        dtype = _constant(dtype)
        if scale is None or zero_point is None or dtype not in _QUANTIZED_DTYPES:
            return None
        code, low, high = _QUANTIZED_DTYPES[dtype]
        # float32's 1 / float32(scale): eager's reciprocal, exactly.
        inverse = float(torch.tensor(1.0) / torch.tensor(float(scale)))

        def quantized(graph):
            shifted = _op(graph, "aten::add", _op(graph, "aten::mul", x, inverse),
                          int(zero_point))
            rounded = _op(graph, "aten::round", shifted)
            clamped = _op(graph, "aten::clamp", rounded, low, high)
            integers = _op(graph, "aten::to", clamped, code)
            if code == 3:  # int32 saturates at 2**31 - 1, which float32 cannot hold
                integers = _op(graph, "aten::masked_fill", integers, _op(
                    graph, "aten::ge", rounded, 2.0 ** 31), 2**31 - 1)
            return integers, True, lambda g: _dequantize(g, [
                integers, g.insertConstant(float(scale)), g.insertConstant(int(zero_point))])[0]
        return quantized
    if kind == "aten::_make_per_tensor_quantized_tensor":
        x, scale, zero_point = node.inputs()
        if _constant(scale) is None or _constant(zero_point) is None:
            return None
        return lambda graph: (_clone(graph, x, None), True,
                              lambda g: _dequantize(g, [x, scale, zero_point])[0])
    if kind == "aten::_make_per_channel_quantized_tensor":
        x, scales, zero_points, axis = node.inputs()
        if _constant(axis) is None:
            return None

        def dequantized(g):
            # Along the last dim and back: the channel broadcasts without knowing the rank.
            last = _op(g, "aten::to", _op(g, "aten::movedim", x, axis, -1), _FLOAT32)
            shifted = _op(g, "aten::sub", last, _op(g, "aten::to", zero_points, _FLOAT32))
            scaled = _op(g, "aten::mul", shifted, _op(g, "aten::to", scales, _FLOAT32))
            back = _op(g, "aten::movedim", scaled, -1, axis)
            return _clone(g, back, _CONTIGUOUS)  # a tensor of its own, as eager's
        return lambda graph: (_clone(graph, x, None), True, dequantized)
    return None


def _clone(graph, value: torch._C.Value, memory_format) -> torch._C.Value:
    # graph.insert cannot pass clone's keyword-only memory_format.
    node = graph.create("aten::clone", [value, graph.insertConstant(memory_format)], 1)
    graph.insertNode(node)
    node.output().setType(value.type())
    return node.output()


def _scalar(value: torch._C.Value):
    """A constant number, or the one element of a constant tensor (`.tensor_qparams`)."""
    constant = _constant(value)
    if isinstance(constant, torch.Tensor):
        return constant.item() if constant.numel() == 1 else None
    return constant if isinstance(constant, (int, float)) else None
