"""2-d convolutions that the RAL runs as PyTorch's (`blade_ral_conv2d[_nhwc]_<type>`): the
`stablehlo.convolution` forms the kernels take, OIHW weights on NCHW data or NHWC data
(channels_last, see codegen/stablehlo/layouts.py), and an NHWC convolution's epilogue: a
per-channel bias add, a tensor of the result's shape added (a residual connection:
`conv2d_nhwc_bias_add`) and a ReLU, SiLU or hardswish, which the kernel applies itself
(`conv2d_nhwc_bias`) instead of a pass of loops over its result; and its input's scale
per image and channel (a squeeze-excitation's: `conv2d_nhwc_bias_scaled[_add]`), which the
kernel applies as it reads the input instead of a pass of loops writing a scaled copy.
"""
import struct
from typing import List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.ir_queries import (SHAPE_QUERIES, as_operation, defining_op, i64_array,
                                      only_data_user, producer, rank_of)
from blade.codegen.kernels.library_calls import element_suffix
from blade.codegen.stablehlo.folding import splat_value


def conv_form(op) -> Optional[dict]:
    """The attributes of a 2-d convolution the RAL runs, or None: OIHW weights, and NCHW
    data and result (`conv2d`) or NHWC ones (`conv2d_nhwc`, see layouts.py).

    Example:
        >>> conv_form(conv)["kind"]   # NHWC data, OIHW weights: after channels-last
        'conv2d_nhwc'
    """
    dims = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    if element_suffix(op.operands[0]) is None or rank_of(op.operands[0]) != 4:
        return None
    data = (dims.input_batch_dimension, dims.input_feature_dimension,
            list(dims.input_spatial_dimensions))
    result = (dims.output_batch_dimension, dims.output_feature_dimension,
              list(dims.output_spatial_dimensions))
    oihw = (dims.kernel_output_feature_dimension, dims.kernel_input_feature_dimension,
            list(dims.kernel_spatial_dimensions)) == (0, 1, [2, 3])
    if not oihw or data != result or data not in ((0, 1, [2, 3]), (0, 3, [1, 2])):
        return None
    kind = "conv2d" if data == (0, 1, [2, 3]) else "conv2d_nhwc"
    attrs = op.attributes

    def ints(name, default):
        return i64_array(attrs[name]) if name in attrs else default

    if ints("lhs_dilation", [1, 1]) != [1, 1]:
        return None
    if "batch_group_count" in attrs and ir.IntegerAttr(attrs["batch_group_count"]).value != 1:
        return None
    if "window_reversal" in attrs:
        return None
    padding = [0, 0, 0, 0]
    if "padding" in attrs:
        pad = ir.DenseIntElementsAttr(attrs["padding"])
        padding = [pad[i] for i in range(len(pad))]
    if min(padding) < 0:
        return None
    stride = ints("window_strides", [1, 1])
    dilation = ints("rhs_dilation", [1, 1])
    groups = ir.IntegerAttr(attrs["feature_group_count"]).value \
        if "feature_group_count" in attrs else 1
    return {"kind": kind, "stride_h": stride[0], "stride_w": stride[1],
            "pad_top": padding[0], "pad_bottom": padding[1], "pad_left": padding[2],
            "pad_right": padding[3], "dilation_h": dilation[0], "dilation_w": dilation[1],
            "groups": groups}


def _channel_bias(value, channels: int) -> Optional[Tuple[object, List]]:
    """(the source, the ops peeled) of a per-channel vector that `value` broadcasts over an
    NHWC tensor's last dim: a broadcast_in_dim of a tensor whose one non-unit dim holds
    the `channels` values, through reshapes and transposes that only move unit dims."""
    broadcast = producer(value, "stablehlo.broadcast_in_dim") or \
        producer(value, "stablehlo.dynamic_broadcast_in_dim")
    if broadcast is None or channels < 2:
        return None
    source = broadcast.operands[0]
    shape = ir.ShapedType(source.type).shape
    dims = i64_array(broadcast.attributes["broadcast_dimensions"])
    non_unit = [i for i, size in enumerate(shape) if size != 1]
    if non_unit != [i for i, size in enumerate(shape) if size == channels] or \
            len(non_unit) != 1 or dims[non_unit[0]] != rank_of(value) - 1:
        return None
    peeled = [broadcast]
    while True:
        move = producer(source, "stablehlo.reshape") or producer(source, "stablehlo.transpose")
        if move is None or [size for size in ir.ShapedType(move.operands[0].type).shape
                            if size != 1] != [channels]:
            return source, peeled
        peeled.insert(0, move)
        source = move.operands[0]


def _splat(value, number: float) -> Optional[List]:
    """The ops (a constant, then broadcasts of it) that make `value` a splat of `number`
    (as float32 rounds it), in block order; None when it is anything else."""
    ops = []
    while True:
        op = producer(value, "stablehlo.broadcast_in_dim") or \
            producer(value, "stablehlo.dynamic_broadcast_in_dim") or \
            producer(value, "stablehlo.constant")
        if op is None:
            return None
        ops.insert(0, op)
        if op.name == "stablehlo.constant":
            attr = op.attributes["value"]
            held = splat_value(attr) if isinstance(attr, ir.DenseFPElementsAttr) else None
            return ops if isinstance(held, float) and held == _float32(number) else None
        value = op.operands[0]


def _float32(number: float) -> float:
    """`number` rounded to float32."""
    return struct.unpack("f", struct.pack("f", number))[0]


# The kernel's `activation` argument (csrc/ral/conv_activation.h).
NO_ACTIVATION, RELU, SILU, HARDSWISH = 0, 1, 2, 3


def _silu_of(value) -> Optional[Tuple[object, object]]:
    """(logistic, multiply) where `value` is read by exactly `logistic(value)` and
    `multiply(logistic, value)` (either order), the logistic read by the multiply alone:
    SiLU as torch.nn.SiLU decomposes. None otherwise."""
    users = [as_operation(use.owner) for use in value.uses
             if as_operation(use.owner).name not in SHAPE_QUERIES]
    logistic = next((u for u in users if u.name == "stablehlo.logistic"), None)
    if len(users) != 2 or logistic is None:
        return None
    multiply = only_data_user(logistic.result)
    if multiply is None or multiply.name != "stablehlo.multiply" or \
            {multiply.operands[0], multiply.operands[1]} != {logistic.result, value} or \
            not any(u == multiply for u in users):
        return None
    return logistic, multiply


def _other_operand(op, value):
    """The operand of the binary `op` that is not `value` (None when neither or both are)."""
    first, second = op.operands[0], op.operands[1]
    if (first == value) == (second == value):
        return None
    return second if first == value else first


def _hardswish_of(value) -> Optional[Tuple[List, object]]:
    """(the ops, the last) where `value` is read by exactly hardswish as PyTorch's
    decomposes it, value * (min(max(value + 3, 0), 6) / 6) (the division, or a multiply
    by 1/6), each step's result read by the next alone; the splat constants' ops among
    the ops. None otherwise."""
    users = [as_operation(use.owner) for use in value.uses
             if as_operation(use.owner).name not in SHAPE_QUERIES]
    if len(users) != 2:
        return None
    step = next((u for u in users if u.name == "stablehlo.add"), None)
    ops, current = [], value
    for name, number in (("stablehlo.add", 3.0), ("stablehlo.maximum", 0.0),
                         ("stablehlo.minimum", 6.0), ("stablehlo.divide", 6.0)):
        if step is not None and name == "stablehlo.divide" and step.name == "stablehlo.multiply":
            name, number = step.name, 1.0 / 6.0
        if step is None or step.name != name or \
                (name == "stablehlo.divide" and step.operands[0] != current):
            return None
        other = _other_operand(step, current)
        constant = _splat(other, number) if other is not None else None
        if constant is None:
            return None
        ops += constant + [step]
        current, step = step.result, only_data_user(step.result)
    if step is None or step.name != "stablehlo.multiply" or \
            _other_operand(step, current) != value or not any(u == step for u in users):
        return None
    return ops, step


def _residual_add(value) -> Optional[Tuple[object, object]]:
    """(the add, its other operand) where `value` is read only by an add of a tensor of its
    own type that no broadcast makes (a residual connection: a broadcast of a smaller
    tensor, a splat or a channel vector, would be materialized in full for the kernel);
    None otherwise."""
    add = only_data_user(value)
    other = _other_operand(add, value) if add is not None and add.name == "stablehlo.add" \
        else None
    if other is None or other.type != value.type or \
            producer(other, "stablehlo.broadcast_in_dim") is not None or \
            producer(other, "stablehlo.dynamic_broadcast_in_dim") is not None:
        return None
    return add, other


def _reads_shape_of(values, ops) -> bool:
    """Whether any of `values` is computed from a shape query of one of `ops`' results:
    once those are the call's, such a value would come after the call that reads it."""
    results = [op.result for op in ops]
    seen, pending = set(), [v for v in values if v is not None]
    while pending:
        op = defining_op(pending.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        if op.name in SHAPE_QUERIES and any(op.operands[0] == r for r in results):
            return True
        pending.extend(op.operands)
    return False


def _epilogue(conv) -> Optional[Tuple[object, Optional[object], List, object, int]]:
    """For an NHWC convolution followed by a per-channel bias add (then maybe the add of a
    tensor of the result's shape, and a ReLU, or a float32 SiLU or hardswish) that nothing
    else reads in between: (the bias source, the tensor added or None, the ops between,
    the last op, the activation), which the kernel runs as the convolution's own bias and
    post-op (the tensor added and ReLU NaN-preserving in its registers; SiLU and hardswish
    over each block of results while it is in cache) instead of a pass of loops over its
    result. None otherwise."""
    add = only_data_user(conv.result)
    if add is None or add.name != "stablehlo.add":
        return None
    other = add.operands[1] if add.operands[0] == conv.result else add.operands[0]
    bias = _channel_bias(other, ir.ShapedType(conv.result.type).shape[-1])
    if bias is None:
        return None
    source, peeled = bias
    added = None
    residual = _residual_add(add.result)
    if residual is not None:
        peeled, (add, added) = peeled + [add], residual
    relu = only_data_user(add.result)
    if relu is not None and relu.name == "stablehlo.maximum":
        zero = _splat(relu.operands[1] if relu.operands[0] == add.result else
                      relu.operands[0], 0.0)
        if zero is not None:
            return source, added, peeled + zero + [add], relu, RELU
    silu = _silu_of(add.result)
    if silu is not None and isinstance(ir.ShapedType(add.result.type).element_type, ir.F32Type):
        logistic, multiply = silu
        return source, added, peeled + [add, logistic], multiply, SILU
    hardswish = _hardswish_of(add.result)
    if hardswish is not None and \
            isinstance(ir.ShapedType(add.result.type).element_type, ir.F32Type):
        steps, multiply = hardswish
        return source, added, peeled + [add] + steps, multiply, HARDSWISH
    return source, added, peeled, add, NO_ACTIVATION


def _input_scale(conv) -> Optional[Tuple[object, object, List]]:
    """(the data, the scale, the ops between) where the NHWC convolution's input is read by
    it alone and is the product of a tensor and a broadcast of one value per image and
    channel ([N or 1, 1, 1, C]) over its pixels: a squeeze-excitation's scaling, which the
    kernel applies as it reads its input. None otherwise."""
    multiply = producer(conv.operands[0], "stablehlo.multiply")
    if multiply is None or only_data_user(multiply.result) != conv:
        return None
    shape = ir.ShapedType(multiply.result.type).shape
    for data, other in ((multiply.operands[0], multiply.operands[1]),
                        (multiply.operands[1], multiply.operands[0])):
        broadcast = producer(other, "stablehlo.broadcast_in_dim") or \
            producer(other, "stablehlo.dynamic_broadcast_in_dim")
        if broadcast is None:
            continue
        source = broadcast.operands[0]
        scale = ir.ShapedType(source.type).shape
        # (A broadcast's source dim is 1 or the result's: the images' count or one.)
        if i64_array(broadcast.attributes["broadcast_dimensions"]) == [0, 1, 2, 3] and \
                len(scale) == 4 and scale[1:3] == [1, 1] and scale[3] == shape[3] >= 0:
            return data, source, [broadcast, multiply]
    return None


def convolution_with_epilogue(main, op) -> Optional[Tuple[object, List, List, dict, List]]:
    """What outlining takes for an NHWC convolution `op` of `main` with its epilogue
    (`_epilogue`) and, for a 1x1 of one group, its input's scale (`_input_scale`), as one
    call of `conv2d_nhwc_bias[_scaled][_add]`: (the epilogue's last op; the sources: data,
    weight, bias, the scale and the tensor added; the ops from the scaling to the last, in
    block order; the kernel's attributes; the chain's ops whose shape the call's result
    has). None for any other op, and where the scale or the tensor added is computed from
    a shape query of the chain.

    Example:
        >>> convolution_with_epilogue(main, conv)   # maximum(conv + broadcast(%b), 0)
        (maximum, [%x, %w, %b], [conv, broadcast, add], {..., 'activation': 1}, [conv])
    """
    if op.name != "stablehlo.convolution":
        return None
    attributes = conv_form(op)
    epilogue = _epilogue(op) if attributes and attributes["kind"] == "conv2d_nhwc" \
        else None
    if epilogue is None:
        return None
    bias, added, between, last, activation = epilogue
    one_by_one = ir.ShapedType(op.operands[1].type).shape[2:] == [1, 1]
    scaled = _input_scale(op) if one_by_one and attributes["groups"] == 1 else None
    data, scale, before = scaled if scaled is not None else (op.operands[0], None, [])
    chain = _in_block_order(main, before + [op] + between)
    if _reads_shape_of([scale, added], chain + [last]):
        return None
    kind = "conv2d_nhwc_bias" + ("" if scale is None else "_scaled") + \
        ("" if added is None else "_add")
    # Shape queries of the chain's ops of the result's type ask the call's result instead.
    same_shape = [o for o in [op] + between if o.result.type == op.result.type]
    return (last, [data, op.operands[1], bias] + [v for v in (scale, added) if v is not None],
            chain, {**attributes, "kind": kind, "activation": activation}, same_shape)


def _in_block_order(main, ops) -> List:
    """`ops`, ops of main's block, in the block's order."""
    listed = [as_operation(o) for o in ops]
    return [o for o in map(as_operation, main.regions[0].blocks[0].operations)
            if any(o == m for m in listed)]
