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
- its tensors have static shapes (but for SIZES_OF_FIRST_OPERAND's first operand and
  result) and dtypes Blade compiles (uint8 aside), and its other arguments are constants
  (a Generator only as None).

`spec` writes what the engine needs to make the call as one line of text, which the
importer attaches to the call's declaration (so it is part of the code's cache key) and
the code generator embeds in the engine's library (codegen/kernels/library_calls.py).
"""
import functools
from typing import List, Optional

import torch

from blade.partition.dtypes import SCALAR_TYPE_NAMES

# What the registry reports for a node compiled as a kernel call.
ORIGIN = "pytorch kernel"
# The attribute of the call's declaration in the imported module that holds its `spec`.
SPEC_ATTRIBUTE = "blade.kernel_call"
# Operands and results together: the RAL defines blade_ral_kernel_call_1 ... _12.
MAX_TENSORS = 12

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
BLADE_OPS = frozenset(("blade::quantized_linear", "blade::quantized_conv2d"))
# Ops whose one result has the sizes of their first operand but for the last dim, a
# constant: an engine with dynamic shapes allocates it from the operand's
# (codegen/kernels/declarations.define_returning), so they are kernel calls there too.
SIZES_OF_FIRST_OPERAND = frozenset(("blade::quantized_linear",))


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
    follows = node.kind() in SIZES_OF_FIRST_OPERAND
    if not static_shapes and not follows:
        return "a kernel call needs the static sizes of its results (Config.dynamic is on)"
    for value in list(node.inputs()) + list(node.outputs()):
        if isinstance(value.type(), torch._C.TensorType):
            # The first operand and the result may vary but in their last dim.
            varies = follows and (value == node.inputsAt(0) or value == node.output())
            why = _tensor_refusal(value, varies)
            if why is not None:
                return why
        elif _argument(value) is None:
            return (f"its argument %{value.debugName()} is neither a tensor nor a constant "
                    "the call can carry")
    return None


def _tensor_refusal(value: torch._C.Value, may_vary: bool = False) -> Optional[str]:
    t = value.type()
    if t.scalarType() not in SCALAR_TYPE_NAMES:
        return f"%{value.debugName()} has dtype {t.scalarType()}, which Blade does not compile"
    if t.scalarType() == "Byte":
        # The compiled code's uint8 values are unsigned, the RAL's call boundary signless
        # (codegen/stablehlo/unsigned.py converts only main's boundary).
        return f"%{value.debugName()} is uint8, which kernel calls do not take"
    if may_vary:  # symbolic dims (negative) but the last
        symbolic = t.symbolic_sizes()
        if symbolic and symbolic[-1] is not None and symbolic[-1] >= 0:
            return None
    sizes = t.sizes()
    if sizes is None or any(s is None or s < 0 for s in sizes):
        return f"the sizes of %{value.debugName()} are not known"
    return None


def spec(node: torch._C.Node) -> str:
    """The call as the RAL reads it (csrc/ral/kernel_calls.h): the overload, the dtypes of
    its tensor operands and of its results (Blade's names), then each argument in schema order, separated
    by spaces. An argument is `T<k>` (the k-th tensor operand), `N` (None), `b0`/`b1`,
    `i<int>`, `f<float.hex()>`, `s<UTF-8 bytes in hex>`, `D<device name in hex>`, or a list:
    `I`, `F` or `B` and its items joined by commas."""
    from blade.partition.registry import schema_name

    tensors = [v for v in node.inputs() if isinstance(v.type(), torch._C.TensorType)]
    arguments: List[str] = []
    for value in node.inputs():
        if isinstance(value.type(), torch._C.TensorType):
            arguments.append(f"T{tensors.index(value)}")
        else:
            encoded = _argument(value)
            if encoded is None:
                raise ValueError(f"{schema_name(node)}: argument %{value.debugName()} cannot "
                                 "be passed to a kernel call")
            arguments.append(encoded)

    def dtypes(values) -> str:
        return ",".join(SCALAR_TYPE_NAMES[v.type().scalarType()] for v in values) or "-"

    return " ".join([schema_name(node), dtypes(tensors), dtypes(node.outputs()), *arguments])


def _argument(value: torch._C.Value) -> Optional[str]:
    """`value` encoded for `spec`, or None when it is not a constant of a kind it carries."""
    producer = value.node()
    if producer.kind() == "prim::ListConstruct":
        items = list(producer.inputs())
        if not all(v.node().kind() == "prim::Constant" for v in items):
            return None
        return _list(value.type().getElementType(), [v.toIValue() for v in items])
    if producer.kind() != "prim::Constant":
        return None
    ivalue = value.toIValue()
    if ivalue is None:
        return "N"
    if isinstance(ivalue, bool):
        return f"b{int(ivalue)}"
    if isinstance(ivalue, int):
        return f"i{ivalue}"
    if isinstance(ivalue, float):
        return "f" + ivalue.hex()
    if isinstance(ivalue, str):
        return "s" + ivalue.encode().hex()
    if isinstance(ivalue, torch.device):
        return "D" + str(ivalue).encode().hex()
    if isinstance(ivalue, (list, tuple)) and isinstance(value.type(), torch._C.ListType):
        return _list(value.type().getElementType(), list(ivalue))
    return None


def _list(element, items) -> Optional[str]:
    if any(v is None for v in items):
        return None
    if isinstance(element, torch._C.BoolType):
        return "B" + ",".join(str(int(v)) for v in items)
    if isinstance(element, torch._C.IntType):
        return "I" + ",".join(str(int(v)) for v in items)
    if isinstance(element, torch._C.FloatType):
        return "F" + ",".join(float(v).hex() for v in items)
    return None
