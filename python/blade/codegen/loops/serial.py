"""The loop nests left in `main` moved into functions of their own.

After the parallel tasks are outlined (parallel.py), main still holds a few loop nests that
run on the calling thread (a max-pool's window, the padding fill before it, an average
pool's reduction, copies into views). Each becomes a function, `blade_loop_N`, called where
it was:

    main:  linalg.fill ins(%cst) outs(%a)      main:  call @blade_loop_0(%a)
                                         ==>
                                               @blade_loop_0(%a): the same fill, its
                                                                  constants cloned in

main is then nothing but calls, allocations and views (and, where main allocates its
outputs, the conditional frees after them), loop-free code that LLVM
compiles at -O0 in half the time -O2 takes (ResNet-50's main, 190 calls: 0.48 s at -O2,
0.23 s at -O0), and which optimization could not make faster: the time is in the callees.
`compile_straight_line_main_unoptimized` marks such a main `optnone`, and
native.partition gives it a partition of its own at -O0; the loops, each a function group
of its own (native.function_group), are compiled at -O2 with the tasks.

A loop nest is outlined only when its function can mark every buffer `llvm.noalias`, as
main's own accesses let LLVM assume (every buffer it touches has a root of its own, as
parallel tasks require: outlined without the mark, LLVM stops vectorizing a loop that reads
one buffer and writes another); one that cannot stays in main, which then keeps -O2.
"""
from torch_mlir import ir
from torch_mlir.dialects import func

from blade.codegen.ir_queries import as_operation, remap_operands, root_buffer

SERIAL_LOOP = "blade.serial_loop"
PREFIX = "blade_loop_"

# Ops whose lowering is a loop nest over their buffers.
_LOOP_OPS = ("memref.copy", "scf.for", "scf.parallel", "scf.while", "scf.if")
# Nothing that allocates, frees or calls moves out of main: main's allocations are freed by
# the deallocation pass that follows, and calls are main's to make.
_KEPT_IN_MAIN = ("memref.alloc", "memref.alloca", "memref.dealloc", "memref.realloc",
                 "func.call", "func.return", "bufferization.dealloc")


def _is_loop_nest(op) -> bool:
    if len(op.results) > 0:
        return False
    if not (op.name.startswith("linalg.") or op.name in _LOOP_OPS):
        return False
    kept = []

    def visit(inner):
        if inner.name in _KEPT_IN_MAIN:
            kept.append(inner)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return not kept


def _inside(value, op) -> bool:
    """Whether `value` is defined within `op` (by an op nested in it, or as an argument of
    one of its blocks)."""
    owner = value.owner
    current = owner.owner if isinstance(owner, ir.Block) else owner
    current = as_operation(current)
    while current is not None:
        if current == op:
            return True
        parent = current.parent
        current = as_operation(parent) if parent is not None else None
    return False


def _uses_from_outside(op):
    """(constants, values): the constants defined outside `op` that it reads (cloned into
    its function) and the other values (its arguments), each once, in order of use."""
    constants, values = {}, {}

    def visit(inner):
        for operand in inner.operands:
            if operand in constants or operand in values or _inside(operand, op):
                continue
            owner = operand.owner
            if not isinstance(owner, ir.Block) and \
                    as_operation(owner).name == "arith.constant":
                constants[operand] = None
            else:
                values[operand] = None
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return list(constants), list(values)


# What a buffer may come from for its root to be known: its own storage (main's argument,
# an allocation, a global, a callee's result); root_buffer sees through views. A memref
# made by any other op (a transpose, a select of two buffers, ...) may alias one of these.
_KNOWN_ROOTS = ("memref.alloc", "memref.alloca", "memref.get_global", "func.call")


def _distinct_roots(values) -> bool:
    roots = []
    for value in values:
        if not isinstance(value.type, ir.MemRefType):
            continue
        root = root_buffer(value)
        owner = root.owner
        if not isinstance(owner, ir.Block) and as_operation(owner).name not in _KNOWN_ROOTS:
            return False
        if any(root == r for r in roots):
            return False
        roots.append(root)
    return True


def outline(module, main) -> int:
    """Moves each loop nest of main's block that can be into a function of its own (see
    the module's docstring); returns how many were."""
    block = main.regions[0].blocks[0]
    count = 0
    noalias = ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()})
    with module.context, ir.Location.unknown():
        for op in list(block.operations):
            op = as_operation(op)
            if not _is_loop_nest(op):
                continue
            constants, values = _uses_from_outside(op)
            if not _distinct_roots(values):
                continue
            name = f"{PREFIX}{count}"
            with ir.InsertionPoint(main):
                function = func.FuncOp(name, ([v.type for v in values], []),
                                       visibility="private")
            function.attributes[SERIAL_LOOP] = ir.UnitAttr.get()
            function.attributes["arg_attrs"] = ir.ArrayAttr.get(
                [noalias if isinstance(v.type, ir.MemRefType) else ir.DictAttr.get({})
                 for v in values])
            body = function.add_entry_block()
            with ir.InsertionPoint(body):
                mapping = {c: as_operation(c.owner).clone().results[0] for c in constants}
                mapping.update(zip(values, body.arguments))
                clone = op.clone()
                remap_operands(clone, mapping)
                func.ReturnOp([])
            with ir.InsertionPoint(op):
                func.CallOp([], ir.FlatSymbolRefAttr.get(name), values)
            op.erase()
            count += 1
    return count



def compile_straight_line_main_unoptimized(module) -> bool:
    """Marks the lowered (LLVM-dialect) main `optnone` (and `noinline`, which LLVM requires
    with it) when it has no loop: every branch goes to a later block. Such branches are
    the conditional frees of a main that allocates its outputs (a dynamic engine's); a loop
    nest that stayed in main keeps it optimized. Returns whether it was marked."""
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and \
                ir.StringAttr(op.attributes["sym_name"]).value == "main":
            if not _branches_only_forward(op.regions[0]):
                return False
            op.attributes["passthrough"] = ir.ArrayAttr.get(
                [ir.StringAttr.get("optnone"), ir.StringAttr.get("noinline")])
            return True
    return False


def _branches_only_forward(region) -> bool:
    """Whether each block of `region` branches only to blocks after it (no cycle)."""
    blocks = list(region.blocks)
    position = {block: i for i, block in enumerate(blocks)}
    for i, block in enumerate(blocks):
        operations = block.operations
        terminator = operations[len(operations) - 1].operation
        if any(position[successor] <= i for successor in terminator.successors):
            return False
    return True
