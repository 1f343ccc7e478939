"""Integer division and remainder as loop nests Blade writes itself: exact, never trapping,
and with PyTorch's error for a zero divisor.

StableHLO defines an integer division by zero (x / 0 = -1, x % 0 = x) and its linalg
lowering selects those values; PyTorch raises ZeroDivisionError instead, so the compiled
code gave a wrong answer where eager raises. And Torch-MLIR lowers an integer floor
division (`a // b`, `div(..., rounding_mode="floor")`) through float64:
`convert(floor(convert(a) / convert(b)))`, which divides by zero silently too, and rounds
int64 values beyond 2**53.

`lower_integer_divisions` rewrites, on signless integers,
  - `stablehlo.divide` (truncating) and `stablehlo.remainder` (C's %), and
  - that float64 floor-division chain of same-typed integers,
as an elementwise linalg.generic (which fuses with its neighbours like StableHLO's own):

    if b == 0: report it to the RAL        (the engine call then runs its fallback, whose
                                            op raises PyTorch's error)
    s = select(b == 0 or b == -1, 1, b)    (a division that never traps)
    q = a / s; r = a % s
    trunc: select(b == -1, -a, q)           (a / -1 is -a, wrapping at INT_MIN, where
    rem:   select(b == -1, 0, r)             PyTorch's own kernel traps)
    floor: trunc - (r != 0 and (r < 0) != (b < 0))

The floor form computes in integers what the float chain approximates: the two agree
wherever float64 holds the operands exactly (every int32, int64 up to 2**53), and beyond
that it gives PyTorch's exact integer floor division.
"""
from typing import Optional, Tuple

from torch_mlir import ir
from torch_mlir.dialects import arith, func, scf, tensor

from blade.codegen import linalg_ops as linalg

from blade.codegen.ir_queries import defining_op, ops_named

# The RAL function a zero divisor calls (csrc/ral/ral_kernels.h).
DIVISION_BY_ZERO = "blade_ral_division_by_zero"


def _signless_integer(t) -> Optional[ir.IntegerType]:
    if not isinstance(t, ir.RankedTensorType):
        return None
    element = t.element_type
    if not isinstance(element, ir.IntegerType):
        return None
    return element if element.is_signless and element.width > 1 else None


def _floor_division(op) -> Optional[Tuple]:
    """(a, b, result) when `op`, a convert to integer, ends the chain
    convert(floor(convert(a) / convert(b))) of one integer type; else None."""
    if _signless_integer(op.results[0].type) is None:
        return None
    floor = defining_op(op.operands[0])
    if floor is None or floor.name != "stablehlo.floor":
        return None
    divide = defining_op(floor.operands[0])
    if divide is None or divide.name != "stablehlo.divide":
        return None
    converts = [defining_op(v) for v in divide.operands]
    if any(c is None or c.name != "stablehlo.convert" for c in converts):
        return None
    a, b = converts[0].operands[0], converts[1].operands[0]
    if not (a.type == b.type == op.results[0].type):
        return None
    return a, b, op.results[0]


def _elementwise(kind: str, a, b, result, location) -> None:
    """Builds the loop nest of `kind` (trunc, rem, floor) before `result`'s op and makes
    `result`'s uses read it."""
    t = ir.RankedTensorType(result.type)
    element = t.element_type
    index = ir.IndexType.get()
    with ir.InsertionPoint(result.owner), location:
        sizes = [tensor.DimOp(a, arith.ConstantOp(index, d).result).result
                 if t.is_dynamic_dim(d) else t.shape[d] for d in range(t.rank)]
        empty = tensor.EmptyOp(sizes, element).result
        identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(t.rank))
        generic = linalg.GenericOp(
            [t], [a, b], [empty], ir.ArrayAttr.get([identity] * 3),
            ir.ArrayAttr.get([linalg.iterator_attribute(linalg.IteratorType.parallel,
                                                 location.context)] * t.rank))
        block = generic.regions[0].blocks.append(element, element, element)
        with ir.InsertionPoint(block):
            x, y = block.arguments[0], block.arguments[1]
            zero = arith.ConstantOp(element, 0).result
            one = arith.ConstantOp(element, 1).result
            is_zero = arith.CmpIOp(arith.CmpIPredicate.eq, y, zero).result
            report = scf.IfOp(is_zero)
            with ir.InsertionPoint(report.then_block):
                func.CallOp([], ir.FlatSymbolRefAttr.get(DIVISION_BY_ZERO), [])
                scf.YieldOp([])
            is_minus_one = arith.CmpIOp(arith.CmpIPredicate.eq, y,
                                        arith.ConstantOp(element, -1).result).result
            safe = arith.SelectOp(arith.OrIOp(is_zero, is_minus_one).result, one, y).result
            if kind == "rem":
                value = arith.SelectOp(is_minus_one, zero, arith.RemSIOp(x, safe).result).result
            else:
                value = arith.SelectOp(is_minus_one, arith.SubIOp(zero, x).result,
                                       arith.DivSIOp(x, safe).result).result
            if kind == "floor":
                rest = arith.RemSIOp(x, safe).result
                inexact = arith.CmpIOp(arith.CmpIPredicate.ne, rest, zero).result
                signs_differ = arith.XOrIOp(
                    arith.CmpIOp(arith.CmpIPredicate.slt, rest, zero).result,
                    arith.CmpIOp(arith.CmpIPredicate.slt, y, zero).result).result
                down = arith.AndIOp(inexact, signs_differ).result
                value = arith.SubIOp(value, arith.ExtUIOp(element, down).result).result
            linalg.YieldOp([value])
    result.replace_all_uses_with(generic.result)


def lower_integer_divisions(module) -> int:
    """Rewrites each integer division, remainder and floor division of `module` (see the
    docstring); returns how many were rewritten."""
    rewritten = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "stablehlo.convert"):
            found = _floor_division(op)
            if found is not None:
                _elementwise("floor", *found, op.location)
                rewritten += 1
        for name, kind in (("stablehlo.divide", "trunc"), ("stablehlo.remainder", "rem")):
            for op in ops_named(module, name):
                if _signless_integer(op.results[0].type) is not None:
                    _elementwise(kind, op.operands[0], op.operands[1], op.results[0],
                                 op.location)
                    rewritten += 1
        if rewritten and DIVISION_BY_ZERO not in ir.SymbolTable(module.operation):
            with ir.InsertionPoint(module.body):
                func.FuncOp(DIVISION_BY_ZERO, ([], []), visibility="private")
    return rewritten
