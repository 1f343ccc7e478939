"""The LLVM-dialect module as the runtime calls it: `blade_entry`, the `llvm.noalias` marks
the lowering drops, function attributes for the host, and the LLVM IR it translates to.

The library exports `blade_entry(void** args)`: one pointer per memref descriptor, the
cluster's inputs, then its params, then its outputs (written in place).
"""
import ctypes
from typing import Dict, List, Tuple

from torch_mlir import ir

from blade.codegen.errors import CodegenError
from blade.codegen.llvm.native import capsule_pointer, mlir_c_api


def noalias_buffers(module) -> Dict[str, List[Tuple[int, bool]]]:
    """Per function with marked arguments, per argument: how many values the LLVM lowering
    expands it into (a memref of rank r: its descriptor's 3 + 2r fields) and whether it is
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
                args.append((3 + 2 * ir.MemRefType(arg.type).rank,
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
    attributes = ['["reciprocal-estimates", "divf:1,vec-divf:1"]']
    if avx512:
        attributes.append('["prefer-vector-width", "512"]')
    with module.context:
        passthrough = ir.Attribute.parse(f"[{', '.join(attributes)}]")
        for op in module.body.operations:
            if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0:
                op.attributes["passthrough"] = passthrough


def entry_wrapper(num_args: int, returns_outputs: bool = False) -> str:
    """LLVM-dialect `blade_entry(args)`, which unpacks `args` and calls the C interface.
    With `returns_outputs`, args[0] is where main's C interface writes the descriptors of
    the outputs it returns, and `num_args` pointers follow."""
    lines = ["  llvm.func @blade_entry(%args: !llvm.ptr) {"]
    names = []
    for i in range(num_args + (1 if returns_outputs else 0)):
        lines.append(f"    %p{i} = llvm.getelementptr %args[{i}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr")
        lines.append(f"    %a{i} = llvm.load %p{i} : !llvm.ptr -> !llvm.ptr")
        names.append(f"%a{i}")
    types = ", ".join(["!llvm.ptr"] * len(names))
    lines.append(f"    llvm.call @_mlir_ciface_main({', '.join(names)}) : ({types}) -> ()")
    lines.append("    llvm.return")
    lines.append("  }")
    return "\n".join(lines)


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
