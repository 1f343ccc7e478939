"""Library calls: ops that run as calls into PyTorch's own CPU kernels through the RAL
(csrc/ral/ral_kernels.h) instead of as generated loops, which cannot match MKL or oneDNN
(and nothing else in the pipeline lowers a sort).

`outline-library-calls` (outlining.py) moves each such op into a function of its own,
marked LIBRARY_CALL with the kernel's kind and the kernel's KERNEL_ARGUMENTS as attributes;
`lower-library-calls` (lowering.py) replaces the function's body with the kernel's call.
This module holds what the two share (those attributes, the kernels' arguments and element
types). Which ops of which form each kernel takes is decided per op family: matmul.py,
convolution.py, attention.py and sort.py (and kernel_calls.py for the aten ops that
nothing lowers, called through PyTorch's dispatcher).
"""
from typing import Optional

from torch_mlir import ir

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
KERNEL_ARGUMENTS["conv2d_nhwc_bias"] = KERNEL_ARGUMENTS["conv2d"] + ["activation"]
for _kind in ("conv2d_nhwc_bias_add", "conv2d_nhwc_bias_scaled", "conv2d_nhwc_bias_scaled_add"):
    KERNEL_ARGUMENTS[_kind] = KERNEL_ARGUMENTS["conv2d_nhwc_bias"]
KERNEL_ARGUMENTS["attention"] = ["transpose_k", "transpose_v", "scale",  # scale: f64
                                  "zero_masked_rows"]
KERNEL_ARGUMENTS["attention_masked"] = KERNEL_ARGUMENTS["attention"]
KERNEL_ARGUMENTS["sort"] = ["dimension", "descending", "stable", "k"]  # k: 0, or topk's
# The element types sort takes (its values' type names the kernel, as for the others).
SORT_ELEMENT_TYPES = ("f32", "f64", "f16", "bf16", "i32", "i64")
# A kernel that writes its result through strides (attention) may take the transpose that
# follows it into its function: the function returns the transposed tensor, and
# `lowering.lower` hands the kernel a view of that buffer in the kernel's own dim order (see
# `attention.attention_chain`).
OUT_PERMUTATION = "blade.out_permutation"
# Attention operands read in place as heads of a wider value (attention.head_view): the
# function's q, k or v operand is that value, and `lowering.lower` hands the kernel a view
# of it, from [start, heads, head dim, *permutation].
HEAD_VIEWS = ("blade.q_view", "blade.k_view", "blade.v_view")
# An attention scale computed at run time (attention._run_time_scalar): the function's
# operand at this index is a one-element tensor holding it, which `lowering.lower` reads and
# passes as the kernel's scale (its reciprocal when SCALE_DIVIDES is 1) instead of a memref.
SCALE_OPERAND = "blade.scale_operand"
SCALE_DIVIDES = "blade.scale_divides"
