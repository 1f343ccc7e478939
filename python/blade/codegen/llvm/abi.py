"""The LLVM-dialect module as the runtime calls it: `blade_entry`, the `llvm.noalias` marks
the lowering drops, function attributes for the host, and the LLVM IR it translates to.

The library exports `blade_entry(void** args)`: one pointer per memref descriptor, the
cluster's inputs, then its params, then its outputs (written in place).
"""
import ctypes
from typing import Dict, List, Sequence, Tuple

from torch_mlir import ir
from torch_mlir.dialects import llvm

from blade.codegen.errors import CodegenError
from blade.codegen.llvm.native import capsule_pointer, mlir_c_api


def noalias_buffers(module) -> Dict[str, List[Tuple[int, bool]]]:
    """Per function with marked arguments, per argument: how many values the LLVM lowering
    expands it into (a memref: `descriptor_words` of its rank) and whether it is
    a memref marked `llvm.noalias` (main's, see blade.codegen.buffers.arguments; a
    parallel task's, see parallel.py). The lowering drops the mark;
    mark_noalias_pointers puts it back."""
    found = {}
    for op in module.body.operations:
        if op.operation.name != "func.func" or "arg_attrs" not in op.attributes:
            continue
        args = []
        for arg, attrs in zip(op.regions[0].blocks[0].arguments,
                              ir.ArrayAttr(op.attributes["arg_attrs"])):
            if isinstance(arg.type, ir.MemRefType):
                args.append((descriptor_words(ir.MemRefType(arg.type).rank),
                             "llvm.noalias" in ir.DictAttr(attrs)))
            elif isinstance(arg.type, (ir.IndexType, ir.IntegerType, ir.FloatType)):
                args.append((1, False))
            else:
                break  # an argument whose expansion is not known here: leave it
        else:
            if any(marked for _, marked in args):
                found[ir.StringAttr(op.attributes["sym_name"]).value] = args
    return found


def mark_noalias_pointers(module, noalias: Dict[str, List[Tuple[int, bool]]]) -> None:
    """Marks the allocated and aligned pointers of each noalias memref argument on the
    lowered llvm.func: without it LLVM must assume that a store into an output may change
    any input, so it cannot hoist a row's mean out of the loop over the row's elements."""
    for op in module.body.operations:
        if op.operation.name != "llvm.func" or not op.regions[0].blocks:
            continue
        args = noalias.get(ir.StringAttr(op.attributes["sym_name"]).value)
        count = len(op.regions[0].blocks[0].arguments)
        if args is None or sum(width for width, _ in args) != count:
            continue
        marked, position = set(), 0
        for width, is_noalias in args:
            if is_noalias:
                marked.update((position, position + 1))
            position += width
        op.attributes["arg_attrs"] = ir.ArrayAttr.get([
            ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()} if k in marked else {})
            for k in range(count)])


def tune_for_host(module, avx512: bool) -> None:
    """Function attributes for LLVM's code generation. LLVM tunes for 256-bit vectors on
    CPUs with AVX-512 (to avoid frequency drops on old Xeons); generated loops are long,
    streaming and FMA-bound, so full-width vectors pay: each function is told to use 512
    bits where the host has them. And f32 divisions that may use a reciprocal (`arcp`,
    approximations.allow_reciprocal) use the hardware estimate refined by one Newton step
    (relative error about 2**-28, under float32's ulp) instead of a vector division."""
    estimates = ir.StringAttr.get("divf:1,vec-divf:1")
    width = ir.StringAttr.get("512")
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0:
            op.attributes["reciprocal_estimates"] = estimates
            if avx512:
                op.attributes["prefer_vector_width"] = width


def define_entry_point(module, num_args: int, returns_outputs: bool = False) -> None:
    """`blade_entry(void** args)`, which loads one descriptor pointer per argument from
    `args` and calls main's C interface with them. With `returns_outputs`, args[0] is where
    main's C interface writes the descriptors of the outputs it returns, and `num_args`
    pointers follow."""
    ptr = llvm.PointerType.get()
    interface = function_named(module, "_mlir_ciface_main")
    void = llvm.FunctionType(ir.TypeAttr(interface.attributes["function_type"]).value).return_type
    with ir.InsertionPoint(module.body):
        entry = llvm.LLVMFuncOp("blade_entry",
                                ir.TypeAttr.get(llvm.FunctionType.get(void, [ptr])))
    block = entry.regions[0].blocks.append(ptr)
    with ir.InsertionPoint(block):
        pointers = []
        for index in range(num_args + (1 if returns_outputs else 0)):
            slot = llvm.GEPOp(ptr, block.arguments[0], [], [index], ptr, 0).result
            pointers.append(llvm.LoadOp(ptr, slot).result)
        llvm.CallOp(None, pointers, [], [], callee="_mlir_ciface_main")
        llvm.ReturnOp()


def descriptor_words(rank: int) -> int:
    """How many values the LLVM lowering passes a memref of `rank` as: its descriptor's
    allocated and aligned pointers, offset, sizes and strides (the runtime builds the
    same, csrc/ral/engine.cpp)."""
    return 3 + 2 * rank


def descriptor_word_types(ranks: Sequence[int]) -> List:
    """The LLVM types of the words of memrefs of `ranks`, in order."""
    ptr = llvm.PointerType.get()
    i64 = ir.IntegerType.get_signless(64)
    types = []
    for rank in ranks:
        types += [ptr, ptr] + [i64] * (descriptor_words(rank) - 2)
    return types


def function_named(module, name: str):
    for op in module.body.operations:
        if op.operation.name in ("llvm.func", "func.func") and \
                ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise KeyError(f"the module has no function @{name}")


def llvm_ir(module) -> str:
    """The LLVM IR an LLVM-dialect module translates to (what native.emit_object
    compiles)."""
    lib = mlir_c_api()
    lib.mlirRegisterAllLLVMTranslations(capsule_pointer(module.context._CAPIPtr))
    llvm_context = lib.LLVMContextCreate()
    try:
        llvm_module = lib.mlirTranslateModuleToLLVMIR(
            capsule_pointer(module.operation._CAPIPtr), llvm_context)
        if not llvm_module:
            raise CodegenError("the LLVM-dialect module does not translate to LLVM IR")
        try:
            message = lib.LLVMPrintModuleToString(llvm_module)
            try:
                return ctypes.string_at(message).decode()
            finally:
                lib.LLVMDisposeMessage(message)
        finally:
            lib.LLVMDisposeModule(llvm_module)
    finally:
        lib.LLVMContextDispose(llvm_context)
