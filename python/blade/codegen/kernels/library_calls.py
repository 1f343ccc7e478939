"""Library calls: ops that run as calls into PyTorch's own CPU kernels through the RAL
(csrc/ral/ral_kernels.h) instead of as generated loops, which cannot match MKL or oneDNN
(and nothing else in the pipeline lowers a sort).

`outline-library-calls` (outlining.py) moves each such op into a function of its own,
marked LIBRARY_CALL with the kernel's kind and the kernel's KERNEL_ARGUMENTS as attributes;
`lower-library-calls` (lowering.py) replaces the function's body with the kernel's call.
This module holds what the two share (those attributes, the kernels' arguments and element
types) and the forms of convolutions and sorts that the kernels take; matmuls are
recognized in matmul.py, attention chains in attention.py, kernel calls in kernel_calls.py.
"""
from typing import List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.ir_queries import as_operation, i64_array, only_data_user, producer, rank_of

LIBRARY_CALL = "blade.library_call"
# Element types the kernels take, each with its kernel symbols' suffix.
KERNEL_ELEMENT_TYPES = ((ir.F32Type, "f32"), (ir.F64Type, "f64"), (ir.F16Type, "f16"),
                        (ir.BF16Type, "bf16"))


def element_suffix(value) -> Optional[str]:
    """The kernel symbols' suffix for the element type of `value`, or None when the kernels
    take no such type.

    Example:
        >>> element_suffix(dot.operands[0])   # tensor<4x16xbf16>
        'bf16'
    """
    element = ir.ShapedType(value.type).element_type
    for kind, suffix in KERNEL_ELEMENT_TYPES:
        if isinstance(element, kind):
            return suffix
    return None


def conv_form(op) -> Optional[dict]:
    """The attributes of a 2-d convolution the RAL runs, or None: OIHW weights, and NCHW
    data and result (`conv2d`) or NHWC ones (`conv2d_nhwc`, see layouts.py)."""
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


def _zero_splat(value) -> Optional[List]:
    """The ops (a constant, then broadcasts of it) that make `value` a splat of 0.0, in
    block order; None when it is anything else."""
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
            zero = isinstance(attr, ir.DenseFPElementsAttr) and attr.is_splat and \
                float(ir.FloatAttr(attr.get_splat_value()).value) == 0.0
            return ops if zero else None
        value = op.operands[0]


def conv_epilogue(conv) -> Optional[Tuple[object, List, object, bool]]:
    """For an NHWC convolution followed by a per-channel bias add (and a ReLU) that nothing
    else reads in between: (the bias source, the ops between, the last op, relu?), which
    the kernel runs as the convolution's own bias and an in-place ReLU (NaN-preserving)
    instead of a pass of loops over its result. None otherwise."""
    add = only_data_user(conv.result)
    if add is None or add.name != "stablehlo.add":
        return None
    other = add.operands[1] if add.operands[0] == conv.result else add.operands[0]
    bias = _channel_bias(other, ir.ShapedType(conv.result.type).shape[-1])
    if bias is None:
        return None
    source, peeled = bias
    relu = only_data_user(add.result)
    if relu is not None and relu.name == "stablehlo.maximum":
        zero = _zero_splat(relu.operands[1] if relu.operands[0] == add.result else
                           relu.operands[0])
        if zero is not None:
            return source, peeled + zero + [add], relu, True
    return source, peeled, add, False


# The integer arguments each kernel takes after its memrefs, in order.
KERNEL_ARGUMENTS = {
    "matmul": ["transpose_b"],
    "conv2d": ["stride_h", "stride_w", "pad_top", "pad_bottom", "pad_left", "pad_right",
               "dilation_h", "dilation_w", "groups"],
}
KERNEL_ARGUMENTS["conv2d_nhwc"] = KERNEL_ARGUMENTS["conv2d"]
KERNEL_ARGUMENTS["conv2d_nhwc_bias"] = KERNEL_ARGUMENTS["conv2d"] + ["relu"]
KERNEL_ARGUMENTS["attention"] = ["transpose_k", "transpose_v", "scale",  # scale: f64
                                  "zero_masked_rows"]
KERNEL_ARGUMENTS["attention_masked"] = KERNEL_ARGUMENTS["attention"]
KERNEL_ARGUMENTS["sort"] = ["dimension", "descending", "stable", "k"]  # k: 0, or topk's
# The element types sort takes (its values' type names the kernel, as for the others).
SORT_ELEMENT_TYPES = ("f32", "f64", "f16", "bf16", "i32", "i64")
# A kernel that writes its result through strides (attention) may take the transpose that
# follows it into its function: the function returns the transposed tensor, and
# `lowering.lower` hands the kernel a view of that buffer in the kernel's own dim order (see
# `outlining._output_permutation`).
OUT_PERMUTATION = "blade.out_permutation"
# An attention scale computed at run time (attention._run_time_scalar): the function's
# operand at this index is a one-element tensor holding it, which `lowering.lower` reads and
# passes as the kernel's scale (its reciprocal when SCALE_DIVIDES is 1) instead of a memref.
SCALE_OPERAND = "blade.scale_operand"
SCALE_DIVIDES = "blade.scale_divides"


def sort_form(op) -> Optional[dict]:
    """The kernel's attributes when `op` is a stablehlo.sort as Torch-MLIR lowers
    aten::sort (argsort and topk too): the values and an iota along the sorted dim, the
    comparator one `compare LT` (ascending) or `GT` (descending) of the values; else None.
    The kernel is PyTorch's own sort, so ties and NaN come out as eager orders them."""
    if len(op.operands) != 2 or len(op.results) != 2:
        return None
    dimension = ir.IntegerAttr(op.attributes["dimension"]).value
    iota = producer(op.operands[1], "stablehlo.iota") or \
        producer(op.operands[1], "stablehlo.dynamic_iota")
    values = ir.ShapedType(op.operands[0].type)
    indices = ir.ShapedType(op.operands[1].type)
    if iota is None or ir.IntegerAttr(iota.attributes["iota_dimension"]).value != dimension \
            or str(values.element_type) not in SORT_ELEMENT_TYPES \
            or str(indices.element_type) != "i64":
        return None
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name != "stablehlo.compare" or \
            body[1].name != "stablehlo.return" or \
            list(body[0].operands) != list(block.arguments)[:2] or \
            list(body[1].operands) != [body[0].result]:
        return None
    direction = str(body[0].attributes["comparison_direction"])
    if direction.endswith("LT>"):
        descending = 0
    elif direction.endswith("GT>"):
        descending = 1
    else:
        return None
    stable = "is_stable" in op.attributes and ir.BoolAttr(op.attributes["is_stable"]).value
    return {"kind": "sort", "dimension": dimension, "descending": descending,
            "stable": int(stable), "k": _top_k(op, dimension) if not stable else 0}


def _top_k(sort, dimension: int) -> int:
    """k when every use of the sort's results is a slice of its first k along the sorted
    dim (aten::topk, as Torch-MLIR lowers it), else 0. The kernel then runs PyTorch's
    topk, which picks among equal values as eager's topk does (an unstable sort may order
    them any way)."""
    shape = ir.RankedTensorType(sort.operands[0].type)
    if not shape.has_static_shape:
        return 0
    found = set()
    for result in sort.results:
        for use in result.uses:
            user = as_operation(use.owner)
            if user.name != "stablehlo.slice":
                return 0
            start = i64_array(user.attributes["start_indices"])
            limit = i64_array(user.attributes["limit_indices"])
            strides = i64_array(user.attributes["strides"])
            if any(start) or any(s != 1 for s in strides) or \
                    any(limit[d] != shape.shape[d] for d in range(shape.rank) if d != dimension):
                return 0
            found.add(limit[dimension])
    if len(found) != 1:
        return 0
    k = found.pop()
    return k if 0 < k < shape.shape[dimension] else 0
