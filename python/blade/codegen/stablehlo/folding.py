"""Two rewrites that keep a normalization's loop nests one group of rows (parallel.py).

LayerNorm lowers to two row reductions and the elementwise passes around them. parallel.py
runs such consecutive loops over the same rows as one task, a block of rows at a time
in L2, but only when nothing else sits between them. Two things did:

- The element count and the epsilon come from the importer as `arith.constant` tensors
  converted to float (`stablehlo.convert`), reshaped to 0-d and broadcast to [rows..., 1],
  which nothing folds: each became a loop writing a 1-element buffer and another writing
  the broadcast on every call. `fold_splat_constants` turns each such op of a splat
  constant into a splat constant, which the elementwise fusion then reads as a scalar
  inside the loop that uses it.
- Both reductions start from one zero-filled accumulator; bufferization gives the second
  its own buffer by copying the filled one (`memref.copy`). `fill_per_use` gives each
  reduction a fill of its own, which bufferizes in place.

`fold_splat_constants` also folds float math of splat constants (GELU's decomposition
computes rsqrt(2) over the whole activation; CSE shares it between a stage's blocks, so no
loop fused it and it became a buffer written and read on every call).
"""
import math

from torch_mlir import ir

from blade.codegen.ir_queries import as_operation

_CONSTANTS = ("arith.constant", "stablehlo.constant")


def _converted(value, element):
    """A Python scalar cast the way `stablehlo.convert` casts it to `element`, or None
    where the cast is not a plain value (NaN, infinity or a number out of the integer
    type's range, which the convert is left to handle at run time)."""
    if isinstance(element, ir.FloatType):
        return float(value)
    if not isinstance(element, ir.IntegerType):
        return None
    if element.width == 1:
        return bool(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    converted = int(value)          # float -> integer rounds toward zero
    if element.is_unsigned:
        low, high = 0, 2 ** element.width - 1
    else:
        low, high = -2 ** (element.width - 1), 2 ** (element.width - 1) - 1
    return converted if low <= converted <= high else None


def splat_value(attr):
    """The number every element of a splat dense attribute holds, or None."""
    dense = ir.DenseElementsAttr(attr)
    if not dense.is_splat:
        return None
    scalar = dense.get_splat_value()
    if isinstance(scalar, ir.FloatAttr):
        return ir.FloatAttr(scalar).value
    if isinstance(scalar, ir.IntegerAttr):
        return ir.IntegerAttr(scalar).value
    return None


def splat_constant(result_type, value):
    """A `stablehlo.constant` of `result_type` (a static shape) holding `value` in every
    element, built at the current insertion point."""
    element = ir.RankedTensorType(result_type).element_type
    scalar = ir.FloatAttr.get(element, value) if isinstance(element, ir.FloatType) else \
        ir.IntegerAttr.get(element, int(value))
    return ir.Operation.create("stablehlo.constant", results=[result_type], attributes={
        "value": ir.DenseElementsAttr.get_splat(result_type, scalar)})


# Ops whose result, given a splat operand, is a splat of the same value (converted).
_SPLAT_PRESERVING = ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim",
                     "stablehlo.transpose")


def _rsqrt(v: float) -> float:
    return 1.0 / math.sqrt(v) if v > 0 else math.inf if v == 0 else math.nan


def _exp(v: float) -> float:
    return math.exp(v) if v < 710.0 else math.inf


def _log(v: float) -> float:
    return math.log(v) if v > 0 else -math.inf if v == 0 else math.nan


def _logistic(v: float) -> float:
    return 1.0 / (1.0 + _exp(-v)) if not math.isnan(v) else math.nan


def _divide(a: float, b: float) -> float:
    if b != 0:
        return a / b
    return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * \
        math.copysign(1.0, b)


# Float math on splats, each result rounded to the element type as the op rounds it: a
# decomposition's constant subexpressions (GELU's rsqrt(2) over the whole activation, which
# CSE shares between the blocks of a stage so that no loop fused it: a 4.8 MB buffer written
# and read on each call of ConvNeXt's first stage) become splat constants.
_UNARY = {"stablehlo.rsqrt": _rsqrt, "stablehlo.sqrt":
          lambda v: math.sqrt(v) if v >= 0 else math.nan,
          "stablehlo.negate": lambda v: -v, "stablehlo.abs": abs,
          "stablehlo.exponential": _exp, "stablehlo.log": _log, "stablehlo.tanh": math.tanh,
          "stablehlo.logistic": _logistic}
_BINARY = {"stablehlo.add": lambda a, b: a + b, "stablehlo.subtract": lambda a, b: a - b,
           "stablehlo.multiply": lambda a, b: a * b, "stablehlo.divide": _divide}


def _splat_of(value):
    """The number every element of `value` holds where a splat constant defines it, or
    None."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    source = as_operation(owner)
    if source.name not in _CONSTANTS:
        return None
    return splat_value(source.attributes["value"])


def _folded(op):
    """The splat value `op`'s result holds where its operands are splat constants and its
    result has a static shape: a splat-preserving op's operand converted to its element
    type, or the value of float math (_UNARY, _BINARY); None otherwise."""
    result = ir.RankedTensorType(op.results[0].type)
    if not result.has_static_shape:
        return None
    values = [_splat_of(operand) for operand in op.operands]
    if any(v is None for v in values):
        return None
    if op.name in _SPLAT_PRESERVING:
        return _converted(values[0], result.element_type)
    if not isinstance(result.element_type, ir.FloatType) or \
            not all(isinstance(v, float) for v in values):
        return None
    try:
        return _UNARY[op.name](*values) if op.name in _UNARY else _BINARY[op.name](*values)
    except OverflowError:
        return None


def fold_splat_constants(module) -> int:
    """Each convert, reshape, broadcast or transpose of a splat constant (float or
    integer, static shape), and each float math op of splat constants (_UNARY, _BINARY),
    becomes a `stablehlo.constant` splat of its result type, in order, so chains fold
    whole; returns how many ops were folded.

    Example:
        >>> fold_splat_constants(module)   # broadcast(reshape(convert(dense<768> : i64)))
        3
    """
    candidates = []

    def visit(op):
        if op.name in _SPLAT_PRESERVING or op.name in _UNARY or op.name in _BINARY:
            candidates.append(op)
        return ir.WalkResult.ADVANCE

    folded = 0
    with module.context:
        module.operation.walk(visit)
        for op in candidates:
            value = _folded(op)
            if value is None:
                continue
            with ir.InsertionPoint(op), op.location:
                constant = splat_constant(op.results[0].type, value)
            op.results[0].replace_all_uses_with(constant.results[0])
            op.erase()
            folded += 1
    return folded


def fill_per_use(main) -> int:
    """A `linalg.fill` (on tensors, in `main`) whose result initializes several ops gets a
    copy of itself per further use, placed before that user; returns how many copies."""
    copies = 0
    block = main.regions[0].blocks[0]
    for op in list(block.operations):
        if op.name != "linalg.fill":
            continue
        uses = [(as_operation(use.owner), use.operand_number) for use in op.results[0].uses]
        for user, position in uses[1:]:
            copy = op.clone(ir.InsertionPoint(user))
            user.operands[position] = copy.results[0]
            copies += 1
    return copies
