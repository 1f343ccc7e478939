"""The launchers and trampolines of parallel tasks (blade.codegen.loops.parallel), built in
the LLVM dialect once main is lowered.

Main calls `blade_launch_N` with a task's memrefs as the lowering passes them (each memref
as its descriptor's words, `abi.descriptor_words`); the lowering leaves that function
declared. Its body, written here, stores every word in an array on its stack and calls
`blade_ral_parallel_for(extent, grain, trampoline, array)` (csrc/ral/ral_parallel.cpp):
extent is loop 0's size, and grain the rows per chunk, so that a chunk runs at least
MIN_TASK_ITERATIONS iterations of the loops inside it (constants where sizes are static,
else read from the descriptors' size words). With dynamic sizes, a call of fewer than
MIN_ITERATIONS iterations in all gets the whole extent as its grain, so it runs on the
calling thread, as the static rule (blade.codegen.loops.parallel) leaves such loops serial:
waking the pool for a short sequence's loops costs more than they take.
`blade_trampoline_N(begin, end, array)` loads the words back and calls the task on rows
[begin, end).
"""
from typing import List

from torch_mlir import ir
from torch_mlir.dialects import llvm

from blade.codegen.llvm.abi import descriptor_word_types

PARALLEL_FOR = "blade_ral_parallel_for"


def define_launchers(module, tasks: List[dict], min_task_iterations: int,
                     min_iterations: int) -> None:
    """Defines each task's launcher (declared by the lowering) and its trampoline, and
    declares blade_ral_parallel_for. `tasks` are what parallel.outline returned."""
    if not tasks:
        return
    i64 = ir.IntegerType.get_signless(64)
    ptr = llvm.PointerType.get()
    # By name, looked up once: a scan of the module per task was quadratic in the tasks.
    functions = {ir.StringAttr(op.attributes["sym_name"]).value: op
                 for op in module.body.operations if op.operation.name == "llvm.func"}

    def launcher_of(n: int):
        launcher = functions.get(f"blade_launch_{n}")
        if launcher is None:
            raise KeyError(f"the module has no function @blade_launch_{n}")
        return launcher

    # What the lowering declared the launchers to return (LLVM's void).
    first = launcher_of(tasks[0]["index"])
    void = llvm.FunctionType(ir.TypeAttr(first.attributes["function_type"]).value).return_type
    with ir.InsertionPoint(module.body):
        llvm.LLVMFuncOp(PARALLEL_FOR, ir.TypeAttr.get(
            llvm.FunctionType.get(void, [i64, i64, ptr, ptr])))
    for task in tasks:
        n = task["index"]
        types = descriptor_word_types(task["ranks"])
        launcher = launcher_of(n)
        with ir.InsertionPoint(module.body):
            trampoline = llvm.LLVMFuncOp(f"blade_trampoline_{n}", ir.TypeAttr.get(
                llvm.FunctionType.get(void, [i64, i64, ptr])))
        _launcher_body(launcher, task, types, n, min_task_iterations, min_iterations)
        _trampoline_body(trampoline, types, n)


def _constant(value: int):
    i64 = ir.IntegerType.get_signless(64)
    return llvm.ConstantOp(i64, ir.IntegerAttr.get(i64, value)).result


def _slot(base, index: int):
    """The address of word `index` of an i64 array at `base`."""
    i64 = ir.IntegerType.get_signless(64)
    return llvm.GEPOp(llvm.PointerType.get(), base, [], [index], i64, 0).result


def _launcher_body(launcher, task: dict, types, n: int, min_task_iterations: int,
                   min_iterations: int) -> None:
    i64 = ir.IntegerType.get_signless(64)
    ptr = llvm.PointerType.get()
    block = launcher.regions[0].blocks.append(*types)
    words = list(block.arguments)
    with ir.InsertionPoint(block):
        one = _constant(1)
        array = llvm.AllocaOp(ptr, one, llvm.ArrayType.get(i64, len(types))).result
        for index, word in enumerate(words):
            llvm.StoreOp(word, _slot(array, index))
        sizes = []
        for operand, position, size in task["bounds"]:
            if size == ir.ShapedType.get_dynamic_size():
                # The operand's words: allocated and aligned pointers, offset, sizes...
                first = len(descriptor_word_types(task["ranks"][:operand]))
                sizes.append(words[first + 3 + position])
            else:
                sizes.append(_constant(size))
        extent = sizes[0]
        inner = one
        for size in sizes[1:]:
            inner = llvm.MulOp(inner, size, 0).result
        if "grain" in task:
            grain = _constant(task["grain"])
        else:
            # ceil(min_task_iterations / iterations per row), one row at least.
            empty = llvm.ICmpOp(llvm.ICmpPredicate.slt, inner, one).result
            per_row = llvm.SelectOp(empty, one, inner).result
            wanted = llvm.AddOp(_constant(min_task_iterations - 1), per_row, 0).result
            grain = llvm.SDivOp(wanted, per_row).result
            # Too few iterations in all: the whole extent (one row at least) in one chunk.
            total = llvm.MulOp(extent, inner, 0).result
            few = llvm.ICmpOp(llvm.ICmpPredicate.slt, total, _constant(min_iterations)).result
            no_rows = llvm.ICmpOp(llvm.ICmpPredicate.slt, extent, one).result
            whole = llvm.SelectOp(no_rows, one, extent).result
            grain = llvm.SelectOp(few, whole, grain).result
        function = llvm.AddressOfOp(ptr, f"blade_trampoline_{n}").result
        llvm.CallOp(None, [extent, grain, function, array], [], [], callee=PARALLEL_FOR)
        llvm.ReturnOp()


def _trampoline_body(trampoline, types, n: int) -> None:
    i64 = ir.IntegerType.get_signless(64)
    ptr = llvm.PointerType.get()
    block = trampoline.regions[0].blocks.append(i64, i64, ptr)
    begin, end, array = block.arguments
    with ir.InsertionPoint(block):
        words = [llvm.LoadOp(t, _slot(array, index)).result for index, t in enumerate(types)]
        llvm.CallOp(None, [begin, end, *words], [], [], callee=f"blade_task_{n}")
        llvm.ReturnOp()
