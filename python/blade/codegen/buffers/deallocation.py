"""Intermediates freed after their last use, not at the end of main.

MLIR's ownership-based deallocation (the `buffer-deallocation-pipeline`) frees a block's
buffers before the block's terminator. Main is one block of calls (library calls and
outlined loops) by then, so every intermediate of a call stayed allocated until the call
ended: a ResNet-50 engine held all 59 of its intermediates (49 MB at batch 1, as much as
the model's weights) at once, and the runtime's buffer cache kept them all
(csrc/ral/ral_abi.cpp). `free_after_last_use` moves each `memref.dealloc` of a buffer
that main allocated up to just after the last op of main's block that uses the buffer or
a view of it, so that the next allocations reuse its memory.
"""
from torch_mlir import ir

# Ops whose memref result views their first operand's memory.
VIEW_OPS = frozenset(("memref.collapse_shape", "memref.expand_shape", "memref.subview",
                      "memref.reinterpret_cast", "memref.cast", "memref.transpose",
                      "memref.view"))
# Ops with results that hold nothing of the buffer's memory (its values or its sizes).
READ_OPS = frozenset(("memref.load", "memref.dim", "memref.rank", "vector.load",
                      "vector.transfer_read", "affine.load", "affine.vector_load"))


def _top_level(op, block):
    """The op of `block` that holds `op` (itself when it is in `block`)."""
    op = op.operation
    while op.block != block:
        op = op.parent.operation
    return op


def free_after_last_use(main) -> int:
    """Moves the deallocations of main's own buffers to after their last use (see the
    module's docstring); a buffer main returns, or that an op other than a view or a load
    turns into values (which might hold it: a call's memref, a pointer), is left where it
    is. Returns how many moved."""
    block = main.regions[0].blocks[0]
    ops = list(block.operations)
    position = {op.operation: i for i, op in enumerate(ops)}
    moved = 0
    for dealloc in [op for op in ops if op.name == "memref.dealloc"]:
        buffer = dealloc.operands[0]
        owner = buffer.owner
        if isinstance(owner, ir.Block) or owner.operation.name != "memref.alloc" or \
                owner.operation.block != block:
            continue
        aliases, pending, last, safe = {buffer}, [buffer], position[owner.operation], True
        while pending and safe:
            value = pending.pop()
            for use in value.uses:
                user = use.owner.operation
                if user == dealloc.operation:
                    continue
                if user.name == "func.return":
                    safe = False
                    break
                if user.name in VIEW_OPS:
                    for result in user.results:
                        if result not in aliases:
                            aliases.add(result)
                            pending.append(result)
                elif len(user.results) > 0 and user.name not in READ_OPS:
                    safe = False  # its results may hold the buffer (a pointer, a view)
                    break
                last = max(last, position[_top_level(user, block)])
        if not safe or last + 1 >= position[dealloc.operation]:
            continue
        dealloc.operation.move_after(ops[last])
        moved += 1
    return moved
