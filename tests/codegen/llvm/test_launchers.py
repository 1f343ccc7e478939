"""codegen/llvm/launchers.py: each parallel task's launcher and trampoline."""
from torch_mlir import ir

from ir_runner import check_pass

# What the lowering leaves of one task over a rank-1 memref: the launcher declared, the
# task defined (rows begin..end, then the memref's 5 descriptor words).
LOWERED = """
llvm.func @blade_launch_0(!llvm.ptr, !llvm.ptr, i64, i64, i64)
llvm.func @blade_task_0(%b: i64, %e: i64, %p0: !llvm.ptr, %p1: !llvm.ptr, %o: i64, %n: i64,
                        %s: i64) {
  llvm.return
}
"""


def task(size):
    return {"parallel_tasks": [{"index": 0, "ranks": [1], "bounds": [(0, 0, size)]}]}


def test_the_launcher_hands_the_descriptor_words_to_the_runtime():
    check_pass(LOWERED + """
    // CHECK: llvm.func @blade_launch_0([[W0:%arg[0-9]+]]: !llvm.ptr
    // CHECK: [[ARRAY:%[0-9]+]] = llvm.alloca {{%[0-9]+}} x !llvm.array<5 x i64>
    // CHECK-COUNT-5: llvm.store
    // CHECK: [[EXTENT:%[0-9]+]] = llvm.mlir.constant(100000 : i64)
    // CHECK: [[FN:%[0-9]+]] = llvm.mlir.addressof @blade_trampoline_0
    // CHECK: llvm.call @blade_ral_parallel_for([[EXTENT]], {{%[0-9]+}}, [[FN]], [[ARRAY]])
    // CHECK: llvm.func @blade_ral_parallel_for(i64, i64, !llvm.ptr, !llvm.ptr)
    // CHECK: llvm.func @blade_trampoline_0([[BEGIN:%arg[0-9]+]]: i64, [[END:%arg[0-9]+]]: i64, {{%arg[0-9]+}}: !llvm.ptr)
    // CHECK-COUNT-5: llvm.load
    // CHECK: llvm.call @blade_task_0([[BEGIN]], [[END]],
    """, "define-parallel-launchers", handed_on=task(100000))


def test_a_dynamic_extent_is_read_from_the_descriptors_size_word():
    # Word 3 of the memref (after two pointers and the offset) is its size.
    check_pass(LOWERED + """
    // CHECK: llvm.func @blade_launch_0(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64, %arg3: i64, %arg4: i64)
    // CHECK: llvm.call @blade_ral_parallel_for(%arg3,
    """, "define-parallel-launchers", handed_on=task(ir.ShapedType.get_dynamic_size()))
