// RUN: blade-opt --pass define-parallel-launchers --handed-on "parallel_tasks=[{'index': 0, 'ranks': [1], 'bounds': [(0, 0, 100000)]}]" %s | FileCheck %s
// What the lowering leaves of one task over a rank-1 memref (the launcher declared, the
// task defined): the launcher hands the descriptor words to the runtime.

llvm.func @blade_launch_0(!llvm.ptr, !llvm.ptr, i64, i64, i64)
llvm.func @blade_task_0(%b: i64, %e: i64, %p0: !llvm.ptr, %p1: !llvm.ptr, %o: i64, %n: i64,
                        %s: i64) {
  llvm.return
}

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
