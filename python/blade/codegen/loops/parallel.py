"""Parallel loops on PyTorch's intra-op thread pool.

After bufferization, consecutive loop nests of `main` over the same rows (the passes of a
softmax or a LayerNorm, and the fills between them) become one task that runs all of them
on a block of rows at a time (`_outline_row_groups`). Then each remaining large
`linalg.generic` whose outermost loop is parallel, and which every output indexes by that
loop first, is split along it:

    main:  linalg.generic ins(%a, %b) outs(%c)       main:  call @blade_launch_N(%a, %b, %c)
                                                ==>
                                                     @blade_task_N(%begin, %end, %a, %b, %c):
                                                        the same generic on rows [begin, end)
                                                        of every operand indexed by that loop

`@blade_launch_N` and a trampoline are built in the LLVM dialect once main is lowered
(blade.codegen.llvm.launchers): the launcher gathers the descriptor words into an array and
calls
`blade_ral_parallel_for(extent, grain, trampoline, array)` (csrc/ral/ral_parallel.cpp),
which runs `at::parallel_for` (torch.get_num_threads() threads, PyTorch's own pool); the
trampoline unpacks the array and calls the task's C interface. Tasks never allocate and
write disjoint rows, so they need no synchronization.
"""
from typing import List, Optional

from torch_mlir import ir
from torch_mlir.dialects import arith, func, memref, scf

from blade.codegen.loops import unit_loops
from blade.codegen.ir_queries import (as_operation, dims_used, identity_layout, loop_bounds,
                                      ops_named, output_count, parallel_loops,
                                      remap_operands, root_buffer, strides_of)

PARALLEL_TASK = "blade.parallel_task"
MIN_ITERATIONS = 32768   # smaller loops are not worth waking threads for
MIN_TASK_ITERATIONS = 16384


def _plan(op):
    """(where each loop's extent is read, per operand the position of its dim that d0
    indexes or None) if `op` can be split along d0."""
    if op.name != "linalg.generic":
        return None
    loops = parallel_loops(op)
    if not loops or not loops[0]:
        return None
    maps = list(ir.ArrayAttr(op.attributes["indexing_maps"]))
    if len(maps) != len(op.operands):
        return None
    for operand in op.operands:
        if not isinstance(operand.type, ir.MemRefType) or strides_of(operand.type) is None:
            return None  # a layout other than strided: no row view of it can be written
    split = []
    outputs = output_count(op)
    for index, map_attr in enumerate(maps):
        results = list(ir.AffineMapAttr(map_attr).value.results)
        uses_d0 = [j for j, r in enumerate(results) if 0 in dims_used(r)]
        if len(uses_d0) > 1 or (uses_d0 and dims_used(results[uses_d0[0]]) != [0]) or \
                (uses_d0 and not isinstance(results[uses_d0[0]], ir.AffineDimExpr)):
            return None   # d0 in an expression, or twice: no one dim to take rows of
        if index >= len(maps) - outputs and not uses_d0:
            return None  # an output not split by the loop would be written by every task
        # Usually the first dim; a batch-1 transpose's (unit_loops.py dropped N) reads
        # its input with d0 (H) second: a C x [rows of H] x W view of NCHW data.
        split.append(uses_d0[0] if uses_d0 else None)
    bounds = loop_bounds(op, maps)
    if any(b is None for b in bounds):
        return None
    sizes = [b[2] for b in bounds]
    if all(size != ir.ShapedType.get_dynamic_size() for size in sizes):
        inner = 1
        for size in sizes[1:]:
            inner *= size
        if sizes[0] < 2 or sizes[0] * inner < MIN_ITERATIONS:
            return None
    # With dynamic sizes the launcher applies the same rule at run time: a call of fewer
    # than MIN_ITERATIONS iterations gets its whole extent as the grain, and
    # at::parallel_for runs a range no longer than the grain on the calling thread.
    return bounds, split


def _captured(op, buffers=None):
    """Values the generic's body uses from outside it: (value, defining op) pairs of
    constants, or None if one is neither a constant nor, when `buffers` (a list) is given,
    a buffer the body only loads from (a gather's table); those are appended to `buffers`.
    """
    inside = []

    def visit(inner):
        if inner != op:           # the walk ends with the generic itself
            inside.append(inner)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    found = []
    for inner in inside:
        for position, operand in enumerate(inner.operands):
            owner = operand.owner
            if isinstance(owner, ir.Block):
                parent = owner.owner
                parent = parent.operation if hasattr(parent, "operation") else parent
                if parent == op or any(parent == o for o in inside):
                    continue      # the body's own arguments
                owner_op = None   # an argument of an enclosing block (main's, say)
            else:
                owner_op = owner.operation if hasattr(owner, "operation") else owner
                if any(owner_op == o for o in inside):
                    continue
            if owner_op is not None and owner_op.name == "arith.constant":
                if not any(operand == v for v, _ in found):
                    found.append((operand, owner_op))
                continue
            loaded = inner.name == "memref.load" and position == 0
            if buffers is None or not loaded:
                return None
            if not any(operand == b for b in buffers):
                buffers.append(operand)
    return found


def _shift_split_index(op, offset) -> None:
    """In a loop nest cloned onto a view of rows that starts at row `offset`, the position
    of the split (outermost) loop, `linalg.index 0`, counts from the view's start: it
    becomes offset + that, the row of the whole buffer (tril compares it with the column,
    a gather's body reads its indices at it)."""
    found = [index for index in ops_named(op, "linalg.index")
             if ir.IntegerAttr(index.attributes["dim"]).value == 0]
    for index in found:
        with ir.InsertionPoint(index):
            local = index.clone()
            shifted = arith.AddIOp(local.results[0], offset).result
        index.results[0].replace_all_uses_with(shifted)
        index.erase()


def _distinct_buffers(operands) -> bool:
    roots = []
    for value in operands:
        root = root_buffer(value)
        if any(root == r for r in roots):
            return False
        roots.append(root)
    return True


def _identity_strides(shape) -> List[int]:
    """The strides of a row-major buffer of `shape` (dynamic after a dynamic size)."""
    dynamic = ir.ShapedType.get_dynamic_size()
    dynamic_stride = ir.ShapedType.get_dynamic_stride_or_offset()
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = dynamic_stride if shape[i + 1] == dynamic or \
            strides[i + 1] == dynamic_stride else strides[i + 1] * shape[i + 1]
    return strides


def _rows_type(t, strides, dim: int = 0):
    """`t` with a dynamic extent along `dim` and the given strides, at a dynamic offset."""
    layout = ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), strides)
    shape = list(t.shape)
    shape[dim] = ir.ShapedType.get_dynamic_size()
    return ir.MemRefType.get(shape, t.element_type, layout)


def _row_view(value, begin, size, dim: int = 0):
    """Rows [begin, begin + size) along `dim` of a memref (identity or strided layout), as
    a strided subview with the memref's own strides."""
    t = ir.MemRefType(value.type)
    shape = list(t.shape)
    dynamic = ir.ShapedType.get_dynamic_size()
    result = _rows_type(t, strides_of(t), dim)
    index = ir.IndexType.get()
    sizes = [size if d == dim else memref.DimOp(value, arith.ConstantOp(index, d).result).result
             for d in range(len(shape)) if d == dim or shape[d] == dynamic]
    static_sizes = [dynamic if d == dim else shape[d] for d in range(len(shape))]
    static_offsets = [dynamic if d == dim else 0 for d in range(len(shape))]
    return memref.SubViewOp(result, value, [begin], sizes, [], static_offsets,
                            static_sizes, [1] * len(shape)).result


_NEUTRAL = ("memref.alloc", "memref.expand_shape", "memref.collapse_shape", "arith.constant")
ROW_BLOCK_BYTES = 512 * 1024   # the rows a group works on at a time stay in L2


def _rows_layout(t) -> Optional[int]:
    """For memref type `t` of identity layout whose dims are static but perhaps its first
    one past leading size-1 dims (which unit_loops.py collapses away), that dim's index;
    None for any other type."""
    t = ir.MemRefType(t)
    if t.rank == 0 or not identity_layout(t):
        return None
    shape = list(t.shape)
    lead = 0
    while lead < len(shape) - 1 and shape[lead] == 1:
        lead += 1
    dynamic = ir.ShapedType.get_dynamic_size()
    return lead if all(size != dynamic for size in shape[lead + 1:]) else None


def _row_elements(t) -> int:
    """The elements of one row of a type _rows_layout takes (the dims after its rows')."""
    shape = list(ir.MemRefType(t).shape)
    count = 1
    for size in shape[_rows_layout(t) + 1:]:
        count *= size
    return count


def _rows_key(root):
    """What names the rows of buffer `root` (of a type _rows_layout takes): their number
    where static, else the value that sizes them (loops over buffers sized by one value
    run over the same rows): a memref.alloc's one dynamic size, or for a buffer a library
    call returned, main's query of its rows (`memref.dim`), which the buffers computed
    from it are sized by; else None."""
    t = ir.MemRefType(root.type)
    lead = _rows_layout(t)
    if t.shape[lead] != ir.ShapedType.get_dynamic_size():
        return t.shape[lead]
    if isinstance(root.owner, ir.Block):
        return None
    owner = as_operation(root.owner)
    if owner.name == "memref.alloc":
        return owner.operands[0] if len(owner.operands) == 1 else None
    for use in root.uses:
        query = as_operation(use.owner)
        if query.name == "memref.dim" and use.operand_number == 0:
            index = query.operands[1].owner
            if not isinstance(index, ir.Block) and as_operation(index).name == "arith.constant" \
                    and ir.IntegerAttr(as_operation(index).attributes["value"]).value == lead:
                return query.results[0]
    return None


def _row_op(op):
    """(rows, [(operand index, value, root, split)], captured constants) for a fill or a
    splittable generic whose operands are row-aligned views of their buffers (of static
    shapes, or with rows of dynamic number: `rows` is then the value that sizes them),
    else None."""
    if op.name == "linalg.fill":
        scalar = op.operands[0].owner
        if isinstance(scalar, ir.Block) or not isinstance(op.operands[1].type, ir.MemRefType):
            return None
        scalar = scalar.operation if hasattr(scalar, "operation") else scalar
        if scalar.name != "arith.constant":
            return None
        uses = [(1, op.operands[1], True)]
        captured = [(op.operands[0], scalar)]    # the fill's value, a constant of main
    else:
        plan = _plan(op)
        captured = _captured(op)
        if plan is None or captured is None:
            return None
        bounds, split = plan
        if any(at not in (None, 0) for at in split):
            return None   # row groups take rows of the first dim only
        uses = [(i, value, at == 0) for i, (value, at) in enumerate(zip(op.operands, split))]
    rows = None
    found = []
    for position, value, split in uses:
        root = root_buffer(value)
        owner = root.owner
        if not isinstance(owner, ir.Block):
            owner = as_operation(owner)
            if owner.name not in ("memref.alloc", "func.call"):
                return None   # a buffer of main's own, or one a library call returned
        if _rows_layout(root.type) is None or _rows_layout(value.type) != 0:
            return None
        if split:
            key = _rows_key(root)
            if key is None or (rows is not None and not _same_rows(key, rows)) or \
                    ir.MemRefType(value.type).shape[0] != \
                    ir.MemRefType(root.type).shape[_rows_layout(root.type)] or \
                    _row_elements(value.type) != _row_elements(root.type):
                return None  # not the same rows as its buffer's, or as the others'
            rows = key
        elif not value == root:
            return None
        found.append((position, value, root, split))
    if rows is None or (isinstance(rows, int) and rows < 2):
        return None
    return rows, found, captured


def _same_rows(a, b) -> bool:
    """Whether two _rows_key answers name the same rows (a count and a value never do)."""
    return isinstance(a, int) == isinstance(b, int) and a == b


def _outline_row_groups(main, tasks) -> None:
    """Consecutive loop nests over the same rows (a softmax's or a LayerNorm's passes, the
    fills between them) become one task: each thread runs all of them on a block of rows
    that fits in L2 before going on to the next, instead of each pass streaming the whole
    tensor through memory. Each buffer is one argument, and each loop sees it through a
    view of the block's rows."""
    block = main.regions[0].blocks[0]
    groups, current, rows = [], [], None
    for op in list(block.operations):
        if op.name in _NEUTRAL:
            continue
        row_op = _row_op(op)
        if row_op is not None and (not current or _same_rows(row_op[0], rows)):
            current.append((op,) + row_op[1:])
            rows = row_op[0]
            continue
        groups.append((rows, current))
        current, rows = ([(op,) + row_op[1:]], row_op[0]) if row_op is not None else \
            ([], None)
    groups.append((rows, current))
    index = ir.IndexType.get()
    for rows, members in groups:
        if len([m for m in members if m[0].name == "linalg.generic"]) < 2:
            continue
        roots, split_of = [], []
        consistent = True
        for _, uses, _ in members:
            for _, value, root, split in uses:
                found = [k for k, r in enumerate(roots) if r == root]
                if found:
                    consistent = consistent and split_of[found[0]] == split
                else:
                    roots.append(root)
                    split_of.append(split)
        if not consistent:
            continue
        n = len(tasks)
        types = [r.type for r in roots]
        # Sized as float32: only how many rows make a block depends on it.
        row_bytes = sum(_row_elements(t) * 4 for t, split in zip(types, split_of) if split)
        block_rows = max(1, ROW_BLOCK_BYTES // max(row_bytes, 1))
        if isinstance(rows, int):
            block_rows = min(rows, block_rows)
        body = _task_function(main, n, types)
        with ir.InsertionPoint(body):
            begin, end = body.arguments[0], body.arguments[1]
            step = arith.ConstantOp(index, block_rows).result
            loop = scf.ForOp(begin, end, step)
        with ir.InsertionPoint(loop.body):
            row = loop.induction_variable
            count = arith.MinSIOp(arith.SubIOp(end, row).result, step).result
            args = list(body.arguments)[2:]
            for op, uses, captured in members:
                new_operands = []
                for i, value, root, split in uses:
                    arg = args[[k for k, r in enumerate(roots) if r == root][0]]
                    new_operands.append(
                        (i, _rows_of(arg, value.type, row, count) if split else arg))
                constants = [(value, c.clone()) for value, c in captured]
                clone = op.clone()
                for i, value in new_operands:
                    clone.operands[i] = value
                remap_operands(clone, {value: copy.results[0] for value, copy in constants})
                _shift_split_index(clone, row)
            scf.YieldOp([])
        with ir.InsertionPoint(body):
            func.ReturnOp([])
        _launch(main, n, members[-1][0], roots)
        for member in members:
            member[0].erase()
        # A dynamic number of rows is read from the first split buffer's descriptor.
        first = split_of.index(True)
        extent = rows if isinstance(rows, int) else ir.ShapedType.get_dynamic_size()
        tasks.append({"index": n, "ranks": [ir.MemRefType(t).rank for t in types],
                      "bounds": [(first, _rows_layout(types[first]), extent)],
                      "grain": block_rows})


def _launch(main, n: int, anchor, buffers) -> None:
    """Declares `blade_launch_<n>` (defined by blade.codegen.llvm.launchers) and calls it
    with `buffers`
    just before `anchor`."""
    with ir.InsertionPoint(main):
        func.FuncOp(f"blade_launch_{n}", ([b.type for b in buffers], []), visibility="private")
    with ir.InsertionPoint(anchor):
        func.CallOp([], ir.FlatSymbolRefAttr.get(f"blade_launch_{n}"), buffers)


def _task_function(main, n: int, types):
    """The entry block of a new `blade_task_<n>(begin, end, buffers...)`. As for main
    (blade.codegen.buffers.arguments.mark_arguments), written buffers are reachable through one
    argument only (noalias), so LLVM may vectorize without runtime checks."""
    index = ir.IndexType.get()
    with ir.InsertionPoint(main):
        task = func.FuncOp(f"blade_task_{n}", ([index, index] + types, []),
                           visibility="private")
    task.attributes[PARALLEL_TASK] = ir.UnitAttr.get()
    noalias = ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()})
    task.attributes["arg_attrs"] = ir.ArrayAttr.get(
        [ir.DictAttr.get({})] * 2 + [noalias] * len(types))
    return task.add_entry_block()


def _rows_of(buffer, view_type, row, count):
    """Rows [row, row + count) of `buffer`, seen with the shape of `view_type` (a reshape
    of the buffer that keeps its rows)."""
    t = ir.MemRefType(view_type)
    shape = list(t.shape)
    strides = _identity_strides(shape)    # static: only the rows' number may be dynamic
    dynamic = ir.ShapedType.get_dynamic_size()
    result = _rows_type(t, strides)
    index = ir.IndexType.get()
    offset = arith.MulIOp(row, arith.ConstantOp(index, strides[0]).result).result
    return memref.ReinterpretCastOp(result, buffer, [offset], [count], [],
                                    [dynamic], [dynamic] + shape[1:], strides).result


def outline(module, main) -> List[dict]:
    """Moves loop nests of `main` into tasks (groups over the same rows first, then each
    splittable generic left), after dropping their leading unit loops (unit_loops.py);
    returns what their launchers need (blade.codegen.llvm.launchers)."""
    tasks = []
    block = main.regions[0].blocks[0]
    with module.context, ir.Location.unknown():
        unit_loops.drop_unit_loops(main)
        _outline_row_groups(main, tasks)
        for op in list(block.operations):
            plan = _plan(op)
            if plan is None:
                continue
            bounds, split = plan
            read_whole = []       # buffers the body loads from at computed positions
            captured = _captured(op, read_whole)
            # A loop that updates a buffer in place names it twice (input and output, with
            # one indexing map); the task takes it once. Beyond that, each argument must be
            # its own buffer, as the task marks its arguments noalias: a loop reading and
            # writing one buffer through two views of it stays serial in main (outlined
            # without noalias, LLVM stops vectorizing it).
            operands, position = [], []
            for value in op.operands:
                found = [k for k, u in enumerate(operands) if u == value]
                position.append(found[0] if found else len(operands))
                if not found:
                    operands.append(value)
            if any(split[i] != split[position.index(position[i])]
                   for i in range(len(split))):
                continue  # one buffer split by rows in one use and not in another
            if captured is None or any(any(b == v for v in operands) for b in read_whole):
                continue
            own = len(operands)
            operands += read_whole  # passed whole, after the generic's own operands
            if not _distinct_buffers(operands):
                continue
            first_of = [split[position.index(k)] for k in range(own)] + \
                [None] * len(read_whole)
            bounds = [(position[operand], at, size) for operand, at, size in bounds]
            n = len(tasks)
            types = [v.type for v in operands]
            body = _task_function(main, n, types)
            with ir.InsertionPoint(body):
                begin, end = body.arguments[0], body.arguments[1]
                size = arith.SubIOp(end, begin).result
                views = [_row_view(arg, begin, size, at) if at is not None else arg
                         for arg, at in zip(list(body.arguments)[2:], first_of)]
                constants = [(value, c.clone()) for value, c in captured]
                clone = op.clone()
                for i, k in enumerate(position):
                    clone.operands[i] = views[k]
                inside = {value: copy.results[0] for value, copy in constants}
                inside.update(zip(read_whole, views[own:]))
                remap_operands(clone, inside)
                _shift_split_index(clone, begin)
                func.ReturnOp([])
            _launch(main, n, op, operands)
            op.erase()
            ranks = [ir.MemRefType(t).rank for t in types]
            tasks.append({"index": n, "ranks": ranks, "bounds": bounds})
    return tasks
