"""codegen/llvm/native.partition: a main that compile-main-unoptimized marked
(mlir/loops/compile-main-unoptimized.mlir) is a partition of its own, compiled at -O0;
unmarked, it shares the -O2 partitions like any function."""
from torch_mlir import ir

from blade.codegen.llvm import native

# main marked unoptimized, calling two loops and a library call.
PARTS = """
llvm.func @blade_ral_matmul(!llvm.ptr)
llvm.func @blade_loop_0(%p: !llvm.ptr) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fadd %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_loop_1(%p: !llvm.ptr) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fmul %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_library_call_0(%p: !llvm.ptr) {
  llvm.call @blade_ral_matmul(%p) : (!llvm.ptr) -> ()
  llvm.return
}
llvm.func @main(%p: !llvm.ptr) attributes {passthrough = [%s]} {
  llvm.call @blade_loop_0(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_loop_1(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_library_call_0(%p) : (!llvm.ptr) -> ()
  llvm.return
}
"""


def _partitions(text, count):
    """(opt_level, functions defined) per partition of `text`."""
    with ir.Context():
        parts = native.partition(ir.Module.parse(text), count)
        found = []
        for part in parts:
            module = ir.Module.parse(part["bytecode"])
            found.append((part["opt_level"], sorted(
                native.function_name(op) for op in module.body.operations
                if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0)))
    return found


def test_an_unoptimized_main_is_a_partition_of_its_own_at_O0():
    # Main's besides the 2 asked for: the -O2 work still in 2.
    parts = _partitions(PARTS.replace("%s", '"optnone", "noinline"'), 2)
    assert (native.STRAIGHT_LINE_MAIN_OPT_LEVEL, ["main"]) in parts, parts
    others = [p for p in parts if p[1] != ["main"]]
    assert len(others) == 2 and all(level == native.LLVM_OPT_LEVEL for level, _ in others)
    assert sorted(f for _, functions in others for f in functions) == \
        ["blade_library_call_0", "blade_loop_0", "blade_loop_1"]
    # Not marked: main shares the -O2 partitions like any group.
    parts = _partitions(PARTS.replace("%s", '"noinline"'), 3)
    assert len(parts) == 3 and all(level == native.LLVM_OPT_LEVEL for level, _ in parts), parts
