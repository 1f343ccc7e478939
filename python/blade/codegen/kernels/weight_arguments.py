"""The weight-argument analysis: which of main's params the code reads only as the weight of a
matmul or convolution library call. The engine may give back the memory of such a param
and read it through its prepared copy alone (csrc/ral/prepared_weights.h);
`lowering.lower` exports the list with the code (`embed_weight_arguments`), for
csrc/ral/compiled_code.h to read.
"""
from typing import Dict, List

from torch_mlir import ir

from blade.codegen.kernels import kernel_calls
from blade.codegen.kernels.library_calls import LIBRARY_CALL

# Library calls whose operand 1 is a float32 weight the RAL kernel may read only through
# the engine's prepared copy of it (csrc/ral/prepared_weights.h).
WEIGHT_KINDS = ("matmul", "conv2d", "conv2d_nhwc", "conv2d_nhwc_bias", "conv2d_nhwc_bias_add",
                "conv2d_nhwc_bias_scaled", "conv2d_nhwc_bias_scaled_add")
# The exported function that returns main's weight-only arguments, as decimal indices
# separated by spaces; code that has none has no such function.
WEIGHT_ARGUMENTS_SYMBOL = "blade_weight_arguments"


def weight_arguments(module) -> List[int]:
    """Main's float32 memref arguments that nothing reads but library calls of
    WEIGHT_KINDS, each as its operand 1 (the weight): after its first calls, the engine
    may give back the memory of such a param it alone holds, read from then on through
    its prepared copy (Engine, csrc/ral/engine.h). Anything else that reads an argument
    (a loop, a view, another operand, another kind of call) keeps it.

    Example:
        >>> weight_arguments(module)   # main(%x, %w, %out) calls a matmul of (%x, %w)
        [1]
    """
    kinds = {}
    main = None
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        if name == "main":
            main = op
        elif LIBRARY_CALL in op.attributes:
            kinds[name] = ir.StringAttr(op.attributes[LIBRARY_CALL]).value
    if main is None:
        return []
    found = []
    for index, arg in enumerate(main.regions[0].blocks[0].arguments):
        if not isinstance(arg.type, ir.MemRefType) or \
                not isinstance(ir.MemRefType(arg.type).element_type, ir.F32Type):
            continue
        uses = list(arg.uses)
        if uses and all(_is_weight_use(use, kinds) for use in uses):
            found.append(index)
    return found


def _is_weight_use(use, kinds: Dict[str, str]) -> bool:
    op = use.owner.operation
    if op.name != "func.call" or use.operand_number != 1:
        return False
    # (an argument that is also another operand of the call has a use of its own there)
    return kinds.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value) in WEIGHT_KINDS


def embed_weight_arguments(module) -> None:
    """Exports `weight_arguments(module)`, when there are any, as WEIGHT_ARGUMENTS_SYMBOL
    returns them (see the module docstring)."""
    found = weight_arguments(module)
    if found:
        kernel_calls.embed_string(module, WEIGHT_ARGUMENTS_SYMBOL,
                                  " ".join(str(i) for i in found).encode())
