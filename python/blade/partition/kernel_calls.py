"""Ops that nothing lowers to StableHLO, compiled as calls of PyTorch's own kernel.

An aten op that neither a converter of Blade's nor Torch-MLIR's lowering covers (random
numbers, median, histc, embedding_bag, ...) would split its cluster in two and leave
the op to TorchScript. Instead the engine's code calls the op itself, through the RAL
(csrc/ral/kernel_calls.h): the op's operands are passed without copies, PyTorch's
dispatcher runs the op's CPU kernel with the node's constant arguments, and the result is
copied into the buffer the compiled code allocated for it. The answer is eager's own, bit
for bit, random numbers included: the kernel draws from PyTorch's default generator, in
the graph's order (blade.partition.clustering keeps nodes that draw random numbers in order).

A node is called this way when

- it is an aten op (or one of Blade's int8 ops, BLADE_OPS) with a schema that neither
  writes into nor returns a view of an operand;
- its results are tensors whose sizes follow from its operands' sizes (not `nonzero`,
  `bincount`, ...) and whose values are defined (not `empty`);
- its tensors have static shapes (with Config.dynamic, SIZES_OF_FIRST_OPERAND's first
  operand and result may vary but in their last dim, a WINDOWED op's first operand and
  result, and quantized_conv2d_add's accum, but in their channels) and dtypes Blade
  compiles (uint8 aside), and its other arguments are constants (a Generator only as
  None).

`blade.kernel_call_spec.spec` writes what the engine needs to make the call as one line of
text, which the importer attaches to the call's declaration (so it is part of the code's
cache key) and the code generator embeds in the engine's library
(codegen/kernels/kernel_calls.py).
"""
import functools
from typing import Optional

import torch

from blade.dtypes import SCALAR_TYPE_NAMES
from blade.kernel_call_spec import (MAX_TENSORS, SIZES_OF_FIRST_OPERAND, WINDOWED,
                                     WINDOWED_LIKE_RESULT, channel_dim, encode_argument)

# What the registry reports for a node compiled as a kernel call.
ORIGIN = "pytorch kernel"

# Ops whose result sizes depend on the values of their operands, not only on their sizes.
VALUE_SIZED = frozenset((
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::bincount",
    "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::masked_select",
    "aten::repeat_interleave",
    # x[mask] with a bool mask (its Tensor?[] operand is not passed either way).
    "aten::index"))
# Ops whose results hold unspecified values, and ops that return a view of an operand
# without their schema saying so.
_NOT_FUNCTIONS = frozenset((
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
    "aten::new_empty", "aten::new_empty_strided", "aten::_unsafe_view"))


# Blade's own ops that engines call this way (csrc/ral/int8_kernels.h).
BLADE_OPS = frozenset(("blade::quantized_linear", "blade::quantized_conv2d",
                       "blade::quantized_conv2d_add", "blade::quantized_max_pool2d"))


def schema_refusal(node: torch._C.Node) -> Optional[str]:
    """Why the op of `node` cannot be a kernel call whatever its types (None: it may)."""
    if not (node.kind().startswith("aten::") or node.kind() in BLADE_OPS) or \
            node.schema() == "(no schema)":
        return "it is not an aten op with a schema"
    if node.kind() in VALUE_SIZED:
        return "its result sizes depend on the values of its operands"
    if node.kind() in _NOT_FUNCTIONS:
        return "its result is not a function of its operands' values"
    if _aliases(node.schema()):
        return "it writes into or returns a view of an operand"
    if not all(isinstance(v.type(), torch._C.TensorType) for v in node.outputs()):
        return "it has a result that is not a tensor"
    return None


@functools.lru_cache(maxsize=None)
def _aliases(schema: str) -> bool:
    # Parsed once per schema: the registry asks of most nodes.
    parsed = torch._C.parse_schema(schema)
    return any(a.alias_info is not None for a in list(parsed.arguments) + list(parsed.returns))


def refusal(node: torch._C.Node, static_shapes: bool) -> Optional[str]:
    """Why `node`, whose op `schema_refusal` accepts, cannot be compiled as a call of
    PyTorch's kernel (None: it can)."""
    tensors = [v for v in list(node.inputs()) + list(node.outputs())
               if isinstance(v.type(), torch._C.TensorType)]
    if len(tensors) > MAX_TENSORS:
        return f"it has {len(tensors)} tensors, and a kernel call takes at most {MAX_TENSORS}"
    varying = {} if static_shapes else _varying_dims(node)
    if varying is None:
        return "a kernel call needs the static sizes of its results (Config.dynamic is on)"
    for value in list(node.inputs()) + list(node.outputs()):
        if isinstance(value.type(), torch._C.TensorType):
            why = _tensor_refusal(value, varying.get(value))
            if why is not None:
                return why
        elif encode_argument(value) is None:
            return (f"its argument %{value.debugName()} is neither a tensor nor a constant "
                    "the call can carry")
    return None


def _varying_dims(node: torch._C.Node):
    """With dynamic shapes, the tensors of `node` that may have symbolic dims, each with
    the dim that must stay static (the rest must be static whole); None where the op's
    results need static sizes. SIZES_OF_FIRST_OPERAND's first operand and result keep
    their last dim; a WINDOWED op's first operand, result (and tensor of the result's
    sizes) their channels."""
    if node.kind() in SIZES_OF_FIRST_OPERAND:
        varying = [node.inputsAt(0), node.output()]
        return {v: v.type().dim() - 1 for v in varying if v.type().dim() is not None}
    if node.kind() in WINDOWED:
        varying = [node.inputsAt(0), node.output()]
        if node.kind() in WINDOWED_LIKE_RESULT:
            varying.append(node.inputsAt(WINDOWED_LIKE_RESULT[node.kind()]))
        return {v: channel_dim(SCALAR_TYPE_NAMES.get(v.type().scalarType(), ""))
                for v in varying}
    return None


def _tensor_refusal(value: torch._C.Value, static_dim: Optional[int] = None) -> Optional[str]:
    """Why `value` cannot be a tensor of a kernel call: an unknown size (or, with
    `static_dim`, symbolic dims but that one, which must be static), or a dtype it cannot
    take."""
    t = value.type()
    if t.scalarType() not in SCALAR_TYPE_NAMES:
        return f"%{value.debugName()} has dtype {t.scalarType()}, which Blade does not compile"
    if t.scalarType() == "Byte":
        # The compiled code's uint8 values are unsigned, the RAL's call boundary signless
        # (codegen/stablehlo/unsigned.py converts only main's boundary).
        return f"%{value.debugName()} is uint8, which kernel calls do not take"
    if static_dim is not None:  # symbolic dims (negative) but that one
        symbolic = t.symbolic_sizes()
        if symbolic and 0 <= static_dim < len(symbolic) and symbolic[static_dim] is not None \
                and symbolic[static_dim] >= 0:
            return None
    sizes = t.sizes()
    if sizes is None or any(s is None or s < 0 for s in sizes):
        return f"the sizes of %{value.debugName()} are not known"
    return None


