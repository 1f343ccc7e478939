"""Where Blade's int8 layers meet (Config(precision="int8"), after frontend/quantize).

Two rewrites keep data in uint8 between layers, as a quantized ResNet needs:

- `fuse_residual_adds` (in quantize, on the calibrated graph): `relu?(conv + other)`,
  where the convolution is int8 and its result is read by the add alone, becomes one
  `blade::quantized_conv2d_add` (oneDNN's "sum" post-op, csrc/ral/int8_kernels.h). The
  other operand's range was measured by the calibration runs (`residual_adds`), as a
  layer's input is: it is what the operand is rounded to when the sum is uint8.
- `hand_on_uint8` (a pipeline pass, once the shapes are simplified and the rank checks
  of folded batch norms are gone): an int8 layer's result, after a ReLU (or GELU, for
  linears; hardswish, for convolutions without an add) or not, whose every reader is an
  int8 layer of the same family reading it with one range (as its input, or as the
  tensor a convolution adds) is rounded to uint8 with that range by the layer itself; the
  readers take those bytes (convolutions: NHWC) instead of float32 they would round and
  lay out again. One rounding to uint8, as each
  reader would have done, but for float32 rounding of the value before it. A max pooling
  between a convolution and its readers (ResNet's stem) pools the uint8 bytes
  (`blade::quantized_max_pool2d`): rounding keeps order, so that is the same answer.
  In the same pass, `round_in_code` has the graph round a float activation that int8
  layers read (a layer norm's result, a squeeze-excitation's scaling) with graph ops, so
  that the engine's loop making the activation writes its uint8 bytes and the layers take
  those.

A layer whose float32 result only an activation reads (MobileNetV3's depthwise layers
before a squeeze-excitation, which reads float32) applies that activation itself
(`activate_float_results`, after hand_on_uint8): one pass over the tensor less.
"""
import functools
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from blade.graph_queries import insert_op

QUANTIZED_LINEAR = "blade::quantized_linear"
QUANTIZED_CONV2D = "blade::quantized_conv2d"
QUANTIZED_CONV2D_ADD = "blade::quantized_conv2d_add"
QUANTIZED_MAX_POOL2D = "blade::quantized_max_pool2d"
_ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
# Operand positions: (input_range, output_range, post_op) of each op (int8_error reads
# them too), and quantized_conv2d_add's accum and accum_range.
RANGE_OPERANDS = {QUANTIZED_LINEAR: (4, 5, 6), QUANTIZED_CONV2D: (8, 9, 10),
                  QUANTIZED_CONV2D_ADD: (8, 11, 12)}
_ACCUM, _ACCUM_RANGE = 9, 10
_CONVOLUTIONS = (QUANTIZED_CONV2D, QUANTIZED_CONV2D_ADD)


class ResidualAdd(NamedTuple):
    """An add of a convolution's result (its only reader) and another tensor, `other`
    (the add's operand position), with the range calibration chose for that tensor."""
    node: torch._C.Node
    other: int
    name: str  # the convolution's
    scale: float = 1.0
    zero_point: int = 0


def residual_adds(graph: torch._C.Graph,
                  convolutions: Dict[torch._C.Node, str]) -> List[ResidualAdd]:
    """The adds that `fuse_residual_adds` may fold into one of `convolutions` (float
    `aten::conv2d` nodes by name), for the calibration to measure their other operand."""
    found = []
    for add in graph.findAllNodes("aten::add", True):
        if add.schema() != _ADD or constant_value(add.inputsAt(2)) != 1 or \
                add.inputsAt(0) is add.inputsAt(1):
            continue
        for position in (0, 1):
            name = convolutions.get(add.inputsAt(position).node())
            if name is not None and len(add.inputsAt(position).uses()) == 1:
                found.append(ResidualAdd(add, 1 - position, name))
                break
    return found


def fuse_residual_adds(graph: torch._C.Graph, adds: Sequence[ResidualAdd]) -> int:
    """Folds each of `adds` whose convolution became `blade::quantized_conv2d` (float32
    result, no post-op), and the ReLU that alone reads the add, into one
    `blade::quantized_conv2d_add` with the add's calibrated range. Returns how many."""
    count = 0
    for tap in adds:
        add = tap.node
        conv = add.inputsAt(1 - tap.other).node()
        other = add.inputsAt(tap.other)
        if conv.kind() != QUANTIZED_CONV2D or not tap.scale > 0 or \
                constant_value(conv.inputsAt(9)) is not None or \
                constant_value(conv.inputsAt(10)) != "none" or \
                not _same_sizes(add.output(), other):
            continue
        result = add.output()
        uses = result.uses()
        relu = uses[0].user if len(uses) == 1 and \
            uses[0].user.kind() in ("aten::relu", "aten::relu_") else None
        with graph.insert_point_guard(add):
            accum_range = graph.insertConstant(
                torch.tensor([float(tap.scale), float(tap.zero_point)]))
            operands = list(conv.inputs())[:9] + [other, accum_range,
                                                  graph.insertConstant(None),
                                                  graph.insertConstant("relu" if relu else
                                                                       "none")]
        fused = graph.create(QUANTIZED_CONV2D_ADD, operands, 1)
        fused.insertBefore(add)
        accum_range.setDebugName(f"{tap.name}.accum_range")
        last = relu or add
        fused.output().setType(last.output().type())
        last.output().replaceAllUsesWith(fused.output())
        for node in (relu, add, conv):
            if node is not None:
                node.destroy()
        count += 1
    return count


def _same_sizes(a: torch._C.Value, b: torch._C.Value) -> bool:
    """Whether the add's result has its other operand's sizes, as far as the types say
    (an operand broadcast to the result cannot be the sum's accum); the kernel checks it
    again on every call."""
    ta, tb = a.type(), b.type()
    if not isinstance(tb, torch._C.TensorType):
        return False
    if not isinstance(ta, torch._C.TensorType) or ta.sizes() is None or tb.sizes() is None:
        return tb.dim() is None or tb.dim() == 4
    return ta.sizes() == tb.sizes()


def hand_on_uint8(graph: torch._C.Graph) -> int:
    """Rewrites, as the module's docstring says, every int8 layer whose result may stay
    uint8. Returns how many layers hand on uint8."""
    count = 0
    for kind in (QUANTIZED_CONV2D, QUANTIZED_CONV2D_ADD, QUANTIZED_LINEAR):
        for producer in graph.findAllNodes(kind, True):
            count += _hand_on(graph, producer)
    return count


def activate_float_results(graph: torch._C.Graph) -> int:
    """Moves the activation (as _post_op takes them) that alone reads an int8 layer's
    float32 result into the layer's post-op. Returns how many it moved."""
    moved = 0
    for kind in (QUANTIZED_CONV2D, QUANTIZED_LINEAR):
        for producer in graph.findAllNodes(kind, True):
            reading = _reading_activation(producer)
            if reading is None or _hands_on_uint8(producer) or \
                    reading[0].owningBlock() != producer.owningBlock():
                continue
            _apply_in_layer(graph, producer, *reading)
            moved += 1
    return moved


def _reading_activation(producer: torch._C.Node) -> Optional[Tuple[torch._C.Node, str]]:
    """The activation node that alone reads int8 layer `producer`'s result (as its input),
    and the post-op that applies it in the layer, where the layer applies none yet."""
    kind = producer.kind()
    uses = producer.output().uses()
    if constant_value(producer.inputsAt(RANGE_OPERANDS[kind][2])) != "none" or \
            len(uses) != 1 or uses[0].offset != 0:
        return None
    post_op = _post_op(uses[0].user, kind)
    return (uses[0].user, post_op) if post_op is not None else None


def _apply_in_layer(graph: torch._C.Graph, producer: torch._C.Node,
                    activation: torch._C.Node, post_op: str) -> None:
    """`activation`, which alone reads `producer`'s result, becomes its post-op."""
    with graph.insert_point_guard(producer):
        producer.replaceInput(RANGE_OPERANDS[producer.kind()][2],
                              graph.insertConstant(post_op))
    activation.output().replaceAllUsesWith(producer.output())
    activation.destroy()


# What makes a value that round_in_code leaves to its readers: a graph input, an int8 op.
_NOT_ROUNDED = ("prim::Param", QUANTIZED_MAX_POOL2D, *RANGE_OPERANDS)


def round_in_code(graph: torch._C.Graph) -> int:
    """Each float32 value that the graph computes and int8 layers read with one constant
    range is rounded to uint8 by graph ops (the bytes as int8, as a layer hands them on)
    that its readers then take: the engine's loop that makes the value (a layer norm, a
    residual add, a squeeze-excitation's scaling) writes the bytes too, instead of each
    layer reading the float32 tensor back and rounding it itself. The rounding is the
    kernel's: clamp(x * (1 / scale) + zero_point, 0, 255) to nearest, ties to even. A
    convolution takes the bytes as NHWC, so only a value stored channels-last is rounded
    for one (the permutation to NHWC is then a view). Graph inputs and int8 layers' float
    results (no loop makes them: their reader rounds them as well as a loop would), uint8
    handed on by a layer, and layers with ranges measured per call are left as they are.
    Returns how many values it rounds."""
    readers: Dict[tuple, List[torch._C.Node]] = {}
    for kind in (QUANTIZED_LINEAR,) + _CONVOLUTIONS:
        for layer in graph.findAllNodes(kind, True):
            value = layer.inputsAt(0)
            value_type = value.type()
            value_range = _range(layer.inputsAt(RANGE_OPERANDS[kind][0]))
            if value.node().kind() in _NOT_ROUNDED or \
                    value_range is None or not value_range[0] > 0 or \
                    not isinstance(value_type, torch._C.TensorType) or \
                    value_type.scalarType() != "Float" or \
                    layer.owningBlock() != value.node().owningBlock():
                continue
            nhwc = kind != QUANTIZED_LINEAR
            if nhwc and not _channels_last(value_type):
                continue
            readers.setdefault((value, value_range, nhwc), []).append(layer)
    for (value, (scale, zero_point), nhwc), layers in readers.items():
        first = min(layers, key=functools.cmp_to_key(
            lambda a, b: -1 if a.isBefore(b) else 1 if b.isBefore(a) else 0))
        with graph.insert_point_guard(first):
            inverse = float(torch.tensor(1.0 / scale, dtype=torch.float32))
            scaled = insert_op(graph, "aten::mul", value, inverse)
            steps = insert_op(graph, "aten::clamp",
                              insert_op(graph, "aten::add", scaled, float(zero_point)), 0.0, 255.0)
            # 0..255 as int32, then the low byte (integer narrowing wraps): uint8's bits.
            wide = insert_op(graph, "aten::to", insert_op(graph, "aten::round", steps),
                             torch.int32)
            rounded = insert_op(graph, "aten::to", wide, torch.int8)
            if nhwc:
                rounded = insert_op(graph, "aten::permute", rounded, [0, 2, 3, 1])
            shared = graph.insertConstant(torch.tensor([scale, zero_point]))
        for layer in layers:
            layer.replaceInput(0, rounded)
            layer.replaceInput(RANGE_OPERANDS[layer.kind()][0], shared)
    return len(readers)


def _channels_last(value_type: torch._C.TensorType) -> bool:
    """Whether a tensor type is of a 4-d tensor stored channels-last (NHWC in memory)."""
    sizes, strides = value_type.sizes(), value_type.strides()
    if sizes is None or strides is None or len(sizes) != 4 or None in sizes or \
            None in strides:
        return False
    n, c, h, w = sizes
    return (c == 1 or strides[1] == 1) and (w == 1 or strides[3] == c) and \
        (h == 1 or strides[2] == w * c) and (n == 1 or strides[0] == h * w * c)


# The ops round_in_code writes, from its result back to the float activation.
_ROUNDING_CHAIN = ("aten::to", "aten::to", "aten::round", "aten::clamp", "aten::add",
                   "aten::mul")


def rounded_in_code(value: torch._C.Value) -> Optional[torch._C.Value]:
    """The float activation that `value` is round_in_code's rounding of (None if not)."""
    if value.node().kind() == "aten::permute":   # a convolution's NHWC view of the bytes
        value = value.node().inputsAt(0)
    for kind in _ROUNDING_CHAIN:
        if value.node().kind() != kind:
            return None
        value = value.node().inputsAt(0)
    return value


def _hand_on(graph: torch._C.Graph, producer: torch._C.Node) -> bool:
    kind = producer.kind()
    output_at = RANGE_OPERANDS[kind][1]
    if constant_value(producer.inputsAt(output_at)) is not None:
        return False
    reading = _reading_activation(producer)
    value = reading[0].output() if reading is not None else producer.output()
    # A convolution's result max-pooled (ResNet's stem) is pooled as uint8 instead.
    pool = _max_pool(value) if kind != QUANTIZED_LINEAR else None
    readers = pool.output().uses() if pool is not None else value.uses()
    family = (QUANTIZED_LINEAR,) if kind == QUANTIZED_LINEAR else _CONVOLUTIONS
    inputs, accums = [], []
    for use in readers:
        user = use.user
        if user.kind() not in family or user.owningBlock() != producer.owningBlock():
            return False
        if use.offset == 0:
            inputs.append(user)
        elif user.kind() == QUANTIZED_CONV2D_ADD and use.offset == _ACCUM:
            accums.append(user)
        else:
            return False
    ranges = [_range(user.inputsAt(RANGE_OPERANDS[user.kind()][0])) for user in inputs] or \
        [_range(user.inputsAt(_ACCUM_RANGE)) for user in accums]
    if not ranges or any(r is None or not r[0] > 0 or r != ranges[0] for r in ranges):
        return False  # no reader, a range measured per call, or readers that differ
    with graph.insert_point_guard(producer):  # the readers' constants come later
        shared = graph.insertConstant(torch.tensor(list(ranges[0])))
        producer.replaceInput(output_at, shared)
    for user in accums:
        user.replaceInput(_ACCUM_RANGE, shared)
    if reading is not None:
        _apply_in_layer(graph, producer, *reading)
    if pool is not None:
        pooled = graph.create(QUANTIZED_MAX_POOL2D, list(pool.inputs()), 1)
        pooled.insertBefore(pool)
        pool.output().replaceAllUsesWith(pooled.output())
        pool.destroy()
    return True


def _hands_on_uint8(node: torch._C.Node) -> bool:
    """Whether `node` is an int8 op whose result is uint8 (its value's type may still say
    float32 until the types are recorded again)."""
    if node.kind() == QUANTIZED_MAX_POOL2D:
        return True
    return node.kind() in RANGE_OPERANDS and \
        constant_value(node.inputsAt(RANGE_OPERANDS[node.kind()][1])) is not None


def _max_pool(value: torch._C.Value) -> Optional[torch._C.Node]:
    """The `aten::max_pool2d` that alone reads `value`, with constant window arguments of
    two values each (an explicit stride) and a constant ceil_mode (None if not so)."""
    uses = value.uses()
    if len(uses) != 1 or uses[0].user.kind() != "aten::max_pool2d" or \
            uses[0].offset != 0 or len(list(uses[0].user.inputs())) != 6:
        return None
    pool = uses[0].user
    *window, ceil_mode = [constant_value(v) for v in list(pool.inputs())[1:]]
    if not isinstance(ceil_mode, bool) or \
            any(not isinstance(a, list) or len(a) != 2 for a in window):
        return None
    return pool


def _range(value: torch._C.Value) -> Optional[tuple]:
    """A constant range operand as (scale, zero point), or None."""
    values = constant_value(value)
    if not isinstance(values, torch.Tensor) or values.numel() != 2:
        return None
    return float(values[0]), float(values[1])


def constant_value(value: torch._C.Value):
    """A constant's value (None for a value no constant makes)."""
    return value.toIValue() if value.node().kind() == "prim::Constant" else None


def _post_op(node: torch._C.Node, kind: str) -> Optional[str]:
    """The post-op the int8 op of `kind` applies for `node` (None: not one): a ReLU, for
    linear layers a GELU (exact or tanh), for convolutions without an add a hardswish
    (MobileNetV3's)."""
    if node.kind() in ("aten::relu", "aten::relu_"):
        return "relu"
    if kind == QUANTIZED_CONV2D and node.kind() in ("aten::hardswish", "aten::hardswish_"):
        return "hardswish"
    if kind == QUANTIZED_LINEAR and node.kind() == "aten::gelu":
        approximate = constant_value(node.inputsAt(1))
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    return None
