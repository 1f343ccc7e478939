"""Unsigned integers (uint8 images): main's boundary, and the identities of max and min.

Torch-MLIR gives a uint8 tensor the element type `ui8`, and StableHLO's ops compute on it
with unsigned semantics (a convert to float is `uitofp`, a compare unsigned).
StableHLO's lowering to linalg turns every `ui8` into the signless `i8` that linalg and
the LLVM level take, remembering per op what was unsigned, but it leaves a function's own
signature alone: main's `ui8` arguments and results would meet the converted ops through
casts that nothing removes, and bufferization fails on them. `signless_boundaries` gives
main signless arguments and results instead, each converted to and from the unsigned type
by a `stablehlo.bitcast_convert` (the same bits), which the lowering drops; inside, every
op keeps its unsigned type until the lowering.

Torch-MLIR starts a max reduction (amax, max.dim, max pooling) of unsigned integers from the
signed minimum and a min reduction from the signed maximum, as bits: 128 and 127 for uint8,
so the max of a row of values under 128 came out 128. `unsigned_reduction_identities` starts
them from 0 and from the type's largest value instead.
"""
from torch_mlir import ir

from blade.codegen.ir_queries import as_operation, producer
from blade.codegen.stablehlo.folding import splat_constant, splat_value


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


def _unsigned_element(value):
    element = ir.ShapedType(value.type).element_type
    return element if isinstance(element, ir.IntegerType) and element.is_unsigned else None


def unsigned_reduction_identities(module) -> int:
    """Gives each max or min reduction (`stablehlo.reduce`, `reduce_window`) of unsigned
    integers that starts from the signed extreme the identity of its type (see the module
    docstring); returns how many initial values were replaced."""
    found = []

    def visit(op):
        if op.name in ("stablehlo.reduce", "stablehlo.reduce_window"):
            found.append(op)
        return ir.WalkResult.ADVANCE

    replaced = 0
    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        for op in found:
            body = list(op.regions[0].blocks[0].operations)
            if len(body) != 2 or body[0].name not in ("stablehlo.maximum", "stablehlo.minimum"):
                continue
            count = len(op.operands) // 2    # the inputs, then their initial values
            for index in range(count, len(op.operands)):
                init = op.operands[index]
                element = _unsigned_element(init)
                constant = producer(init, "stablehlo.constant")
                if element is None or constant is None:
                    continue
                width = element.width
                signed_extreme, identity = (2 ** (width - 1), 0) \
                    if body[0].name == "stablehlo.maximum" else (2 ** (width - 1) - 1,
                                                                   2 ** width - 1)
                start = splat_value(constant.attributes["value"])
                # The attribute reads the bits back as a signed or an unsigned number.
                if start is None or start % 2 ** width != signed_extreme:
                    continue
                with ir.InsertionPoint(op):
                    op.operands[index] = splat_constant(init.type, identity).result
                replaced += 1
    return replaced
