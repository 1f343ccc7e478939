"""Transposing loop nests as vector tiles: rows read along one side's contiguous dim,
transposed in registers, written along the other's.

A `linalg.generic` whose outputs are contiguous along one loop (`a`) and one of whose
inputs is contiguous along another (`b`) makes every scalar loop order bad for one of
them: the loop vectorizer turns the strided side into gathers or scatters. On the
benchmark's convnet, NHWC + NHWC -> NCHW at the end of the channels-last stack ran at a
quarter of a plain elementwise loop's speed. `tile_transposes` rewrites such a nest into
loops over 8 x 8 tiles of (a, b):

    for the other loops, for a0 in 0..A step 8, for b0 in 0..B step 8:
        each input contiguous along the other side: 8 row loads, one vector.transpose
        per j < 8: the 8-lane rows of every input, the generic's body on vectors, then
        one store per output row (or, computed along b, one transpose per output tile)

Vectors run along whichever loop transposes fewer tiles: x.permute(...) + y into an
output laid out like y transposes x's tiles; (x + y).permute(...) computes along x and y
and transposes the sum's. convert-vector-to-llvm lowers the transposes into shuffles.
Only all-parallel nests are rewritten whose extents along `a` and `b` are static
multiples of 8, whose body is arith ops (and math ops LLVM has vector forms of) on 32-
or 64-bit floats or integers of 8 bits or more, and whose every other operand is
contiguous along `a` or indexes neither loop; the rest stay loops (loop_order.py orders
them).
"""
from typing import Dict

from torch_mlir import ir
from torch_mlir.dialects import arith, memref, scf, vector

from blade.codegen.ir_queries import (all_parallel, contiguous_loop, map_dims, ops_named,
                                      output_count, root_buffer, strides_of)
from blade.codegen.loops.parallel import PARALLEL_TASK

# 8 x 8 tiles of float32 (8 ymm rows): larger tiles (16 x 16 through the shuffle16x16
# lowering, 16 x 8) measured slower on NCHW <-> NHWC transposes, spilling with two tiles
# live.
TILE = 8
# math ops convert-math-to-llvm lowers to LLVM intrinsics that take vectors
VECTOR_MATH = {"math.absf", "math.fma", "math.sqrt", "math.copysign", "math.floor",
               "math.ceil", "math.roundeven", "math.trunc"}


def _tiles(extent: int) -> bool:
    return extent != ir.ShapedType.get_dynamic_size() and extent % TILE == 0


def _loadable(t) -> bool:
    """Element types a vector load reads as it is laid out: not i1 (a byte per element in a
    buffer, a bit per lane in a vector) nor 16-bit floats (no arithmetic on their vectors
    before AVX512-FP16)."""
    if isinstance(t, ir.FloatType):
        return t.width in (32, 64)
    return isinstance(t, ir.IntegerType) and t.width >= 8


def _vectorizable_body(op) -> bool:
    block = op.regions[0].blocks[0]
    if not all(_loadable(arg.type) for arg in block.arguments):
        return False
    for inner in block.operations:
        name = inner.operation.name
        if name == "linalg.yield":
            continue
        if not (name.startswith("arith.") or name in VECTOR_MATH) or \
                inner.operation.regions:
            return False
        for result in inner.operation.results:
            if not isinstance(result.type, (ir.FloatType, ir.IntegerType)):
                return False
        for operand in inner.operation.operands:
            if not isinstance(operand.type, (ir.FloatType, ir.IntegerType)):
                return False
    return True


def _plan(op):
    """(a, b, per operand its kind, per operand its map_dims) when `op` is a transposing nest
    this module rewrites; kinds: "transposed" (contiguous along b), "aligned" (contiguous
    along a), "scalar" (indexes neither)."""
    if op.name != "linalg.generic" or not all_parallel(op) or ops_named(op, "linalg.index"):
        return None
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    if len(maps) != len(op.operands) or not _vectorizable_body(op):
        return None
    loops = len(ir.ArrayAttr(op.attributes["iterator_types"]))
    outputs = output_count(op)
    results = [map_dims(m) for m in maps]
    if any(r is None for r in results) or \
            any(not isinstance(v.type, ir.MemRefType) or strides_of(v.type) is None
                for v in op.operands):
        return None
    out_loops = [contiguous_loop(v, r) for v, r in
                 zip(op.operands[-outputs:], results[-outputs:])]
    if out_loops[0] is None or any(loop != out_loops[0] for loop in out_loops):
        return None
    for r in results[-outputs:]:
        if sorted(d for d in r if d is not None) != list(range(loops)):
            return None   # outputs index every loop once
    a = out_loops[0]
    contiguous = [contiguous_loop(v, r) for v, r in zip(op.operands, results)]
    across = {loop for loop, r in zip(contiguous, results)
              if loop is not None and loop != a and a in r}
    if len(across) != 1:
        return None
    b = across.pop()
    kinds = []
    for loop, r in zip(contiguous, results):
        if loop == a:
            kinds.append("aligned")
        elif loop == b and a in r:
            kinds.append("transposed")
        elif a not in r and b not in r:
            kinds.append("scalar")    # one value per tile
        else:
            return None
    shape = ir.MemRefType(op.operands[-1].type).shape
    out_results = results[-1]
    extent = {d: shape[position] for position, d in enumerate(out_results)}
    if not (_tiles(extent[a]) and _tiles(extent[b])):
        return None
    roots = [root_buffer(v) for v in op.operands[-outputs:]]
    if any(kind == "transposed" and any(root_buffer(value) == root for root in roots)
           for kind, value in zip(kinds, op.operands)):
        return None   # a transpose in place: tiles would overwrite what others read
    return a, b, kinds, results


def _index(value: int):
    return arith.ConstantOp(ir.IndexType.get(), value).result


def _rewrite(op, plan) -> None:
    a, b, kinds, maps = plan
    out = op.operands[-1]
    out_dims = maps[-1]
    shape = ir.MemRefType(out.type).shape
    ivs: Dict[int, ir.Value] = {}
    with op.location:
        ip = ir.InsertionPoint(op)
        # the other loops in the output's dim order (outer to inner), then a, then b; each
        # loop's body ends in its yield, and the next goes before it
        for d in [d for d in out_dims if d not in (a, b)] + [a, b]:
            position = out_dims.index(d)
            with ip:
                extent = _index(shape[position]) \
                    if shape[position] != ir.ShapedType.get_dynamic_size() \
                    else memref.DimOp(out, _index(position)).result
                loop = scf.ForOp(_index(0), extent, _index(TILE if d in (a, b) else 1))
            with ir.InsertionPoint(loop.body):
                ip = ir.InsertionPoint(scf.YieldOp([]))
            ivs[d] = loop.induction_variable
        with ip:
            _tile_body(op, maps, kinds, ivs, a, b)
    op.operation.erase()


def _tile_body(op, maps, kinds, ivs, a, b) -> None:
    block = op.regions[0].blocks[0]
    operands = list(op.operands)
    outputs = output_count(op)
    constants = [[expr.value if isinstance(expr, ir.AffineConstantExpr) else 0
                  for expr in ir.AffineMapAttr(m).value.results]
                 for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    offsets: Dict[tuple, ir.Value] = {}

    def shifted(d, k):
        if k == 0:
            return ivs[d]
        if (d, k) not in offsets:
            offsets[(d, k)] = arith.AddIOp(ivs[d], _index(k)).result
        return offsets[(d, k)]

    def indices(k, shift):
        return [_index(constant) if d is None else shifted(d, shift.get(d, 0))
                for d, constant in zip(maps[k], constants[k])]

    arguments = list(block.arguments)
    used = [bool(list(arg.uses)) for arg in arguments]
    element = [arg.type for arg in arguments]
    inputs = len(operands) - outputs
    # Vectors run along `along` (a: the outputs' contiguous loop, or b), one per position
    # `step` of the other loop in the TILE. An operand contiguous along `step` is read as
    # a TILE of rows along `step` and transposed; outputs are contiguous along a, so with
    # vectors along b each output TILE is transposed before it is stored. Whichever
    # orientation transposes fewer tiles is taken (x.permute(...) + y.permute(...) into
    # one output: one transpose, of the result).
    across_a = sum(1 for k in range(inputs) if used[k] and kinds[k] == "transposed")
    across_b = sum(1 for k in range(inputs) if used[k] and kinds[k] == "aligned") + outputs
    reads_outputs = any(used[inputs:])   # loaded along a, as they are laid out
    along, step = (a, b) if across_a <= across_b or reads_outputs else (b, a)

    def read_tile(k):
        return _transposed([vector.load(ir.VectorType.get([TILE], element[k]), operands[k],
                                        indices(k, {along: i})) for i in range(TILE)])

    contiguous_along = {"aligned": a, "transposed": b}
    tiles, scalars = {}, {}
    for k in range(inputs):
        if not used[k]:
            continue
        if kinds[k] == "scalar":
            scalar = memref.LoadOp(operands[k], indices(k, {})).result
            scalars[k] = vector.broadcast(ir.VectorType.get([TILE], element[k]), scalar)
        elif contiguous_along[kinds[k]] == step:
            tiles[k] = read_tile(k)
    results = [[] for _ in range(outputs)]
    for j in range(TILE):
        values: Dict[ir.Value, ir.Value] = {}
        for k in range(len(operands)):
            if not used[k]:
                continue
            if k in scalars:
                values[arguments[k]] = scalars[k]
            elif k in tiles:
                values[arguments[k]] = vector.extract(tiles[k], [], [j])
            else:   # contiguous along `along`, an input or an output the body reads
                values[arguments[k]] = vector.load(ir.VectorType.get([TILE], element[k]),
                                                   operands[k], indices(k, {step: j}))
        for inner in block.operations:
            if inner.operation.name != "linalg.yield":
                _clone_on_vectors(inner.operation, values, TILE)
                continue
            for k, result in enumerate(inner.operation.operands):
                value = _vector_of(result, values, TILE)
                if along == a:
                    vector.store(value, operands[inputs + k], indices(inputs + k, {b: j}))
                else:
                    results[k].append(value)
    if along == a:
        return
    for k, rows in enumerate(results):
        packed = _transposed(rows)
        for i in range(TILE):
            vector.store(vector.extract(packed, [], [i]), operands[inputs + k],
                         indices(inputs + k, {b: i}))


def _transposed(rows):
    """The square tile whose columns are `rows` (1-d vectors as many as their lanes)."""
    element = rows[0].type.element_type
    vector_type = ir.VectorType.get([len(rows), len(rows)], element)
    tile = arith.ConstantOp(vector_type, ir.DenseElementsAttr.get_splat(
        vector_type, _zero_attr(element))).result
    for i, row in enumerate(rows):
        tile = vector.insert(row, tile, [], [i])
    return vector.transpose(vector_type, tile, [1, 0])


def _zero_attr(t):
    return ir.FloatAttr.get(t, 0.0) if isinstance(t, ir.FloatType) else ir.IntegerAttr.get(t, 0)


def _vector_of(value, values, width):
    """`value` of the body as a vector of `width` lanes: already vectorized, or a scalar
    defined outside the body (broadcast)."""
    if value in values:
        return values[value]
    values[value] = vector.broadcast(ir.VectorType.get([width], value.type), value)
    return values[value]


def _clone_on_vectors(inner, values, width) -> None:
    if inner.name == "arith.constant":
        t = inner.results[0].type
        splat = ir.DenseElementsAttr.get_splat(ir.VectorType.get([width], t),
                                               inner.attributes["value"])
        values[inner.results[0]] = arith.ConstantOp(ir.VectorType.get([width], t),
                                                    splat).result
        return
    new = ir.Operation.create(
        inner.name,
        results=[ir.VectorType.get([width], r.type) for r in inner.results],
        operands=[_vector_of(v, values, width) for v in inner.operands],
        attributes={name: inner.attributes[name] for name in inner.attributes})
    for old, result in zip(inner.results, new.results):
        values[old] = result


def tile_transposes(module) -> int:
    """Rewrites the transposing nests of `main` and of the parallel tasks into vector tiles
    (module docstring); returns how many.

    Example:
        >>> tile_transposes(module)  # out[n,c,h,w] = x[n,h,w,c]: 8 x 8 tiles over (w, c)
        1
    """
    count = 0
    for function in module.body.operations:
        if function.operation.name != "func.func" or not function.regions[0].blocks:
            continue
        name = ir.StringAttr(function.attributes["sym_name"]).value
        if name != "main" and PARALLEL_TASK not in function.attributes:
            continue
        for op in list(function.regions[0].blocks[0].operations):
            plan = _plan(op)
            if plan is not None:
                _rewrite(op, plan)
                count += 1
    return count
