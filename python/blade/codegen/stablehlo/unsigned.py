"""Unsigned integers (uint8 images) at main's boundary.

Torch-MLIR gives a uint8 tensor the element type `ui8`, and StableHLO's ops compute on it
with unsigned semantics (a convert to float is `uitofp`, a compare unsigned).
StableHLO's lowering to linalg turns every `ui8` into the signless `i8` that linalg and
the LLVM level take, remembering per op what was unsigned, but it leaves a function's own
signature alone: main's `ui8` arguments and results would meet the converted ops through
casts that nothing removes, and bufferization fails on them. `signless_boundaries` gives
main signless arguments and results instead, each converted to and from the unsigned type
by a `stablehlo.bitcast_convert` (the same bits), which the lowering drops; inside, every
op keeps its unsigned type until the lowering.
"""
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo  # noqa: F401  (the dialect's Python types)
from torch_mlir.dialects import func

from blade.codegen.ir_queries import as_operation


def _signless(t):
    """`t` (a ranked tensor type) with a signless element type of the same width when its
    element type is an unsigned integer, else None."""
    if not isinstance(t, ir.RankedTensorType):
        return None
    element = t.element_type
    if not isinstance(element, ir.IntegerType) or not element.is_unsigned:
        return None
    return ir.RankedTensorType.get(t.shape, ir.IntegerType.get_signless(element.width),
                                   t.encoding)


def _bitcast(value, to_type):
    return ir.Operation.create("stablehlo.bitcast_convert", results=[to_type],
                               operands=[value]).result


def signless_boundaries(module, main) -> int:
    """Rewrites main's unsigned arguments and results as signless ones (see the module
    docstring); returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        block = main.regions[0].blocks[0]
        function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        inputs, results = list(function_type.inputs), list(function_type.results)
        first = block.operations[0]
        for i, argument in enumerate(block.arguments):
            signless = _signless(argument.type)
            if signless is None:
                continue
            unsigned = argument.type
            argument.set_type(signless)
            with ir.InsertionPoint(first):
                converted = _bitcast(argument, unsigned)
            cast = as_operation(converted.owner)
            for use in list(argument.uses):
                owner = as_operation(use.owner)
                if owner != cast:
                    owner.operands[use.operand_number] = converted
            inputs[i] = signless
            rewritten += 1
        terminator = block.operations[len(block.operations) - 1]
        for i, value in enumerate(list(terminator.operands)):
            signless = _signless(value.type)
            if signless is None:
                continue
            with ir.InsertionPoint(terminator):
                terminator.operands[i] = _bitcast(value, signless)
            results[i] = signless
            rewritten += 1
        if rewritten:
            main.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(inputs, results))
    return rewritten
