"""Library calls: ops that run as calls into PyTorch's own CPU kernels through the RAL
(csrc/ral/ral_kernels.h) instead of as generated loops, which cannot match MKL or oneDNN
(and nothing else in the pipeline lowers a sort).

`outline-library-calls` (outlining.py) moves each such op into a function of its own,
marked LIBRARY_CALL with the kernel's kind and the kernel's KERNEL_ARGUMENTS as attributes;
`lower-library-calls` (lowering.py) replaces the function's body with the kernel's call.
This module holds what the two share (those attributes, the kernels' arguments and element
types) and the forms of sorts that the kernel takes; matmuls are recognized in matmul.py,
convolutions in convolution.py, attention chains in attention.py, kernel calls in
kernel_calls.py.
"""
from typing import Optional

from torch_mlir import ir

from blade.codegen.ir_queries import as_operation, i64_array, producer

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
