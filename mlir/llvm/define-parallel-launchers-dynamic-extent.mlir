// RUN: blade-opt --pass define-parallel-launchers --handed-on "parallel_tasks=[{'index': 0, 'ranks': [1], 'bounds': [(0, 0, -9223372036854775808)]}]" %s | FileCheck %s
// A dynamic extent is read from the descriptor's size word: word 3 of the memref (after
// two pointers and the offset). The grain asks for 16384 iterations a chunk, unless the
// call has fewer than 32768 in all: then the whole extent (one row at least) is one chunk.

llvm.func @blade_launch_0(!llvm.ptr, !llvm.ptr, i64, i64, i64)
llvm.func @blade_task_0(%b: i64, %e: i64, %p0: !llvm.ptr, %p1: !llvm.ptr, %o: i64, %n: i64,
                        %s: i64) {
  llvm.return
}

// CHECK: llvm.func @blade_launch_0(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64, %arg3: i64, %arg4: i64)
// CHECK: %[[ROWS_GRAIN:.*]] = llvm.sdiv
// CHECK: %[[TOTAL:.*]] = llvm.mul %arg3,
// CHECK: %[[MIN:.*]] = llvm.mlir.constant(32768 : i64)
// CHECK: %[[FEW:.*]] = llvm.icmp "slt" %[[TOTAL]], %[[MIN]] : i64
// CHECK: %[[WHOLE:.*]] = llvm.select %{{.*}}, %{{.*}}, %arg3
// CHECK: %[[GRAIN:.*]] = llvm.select %[[FEW]], %[[WHOLE]], %[[ROWS_GRAIN]]
// CHECK: llvm.call @blade_ral_parallel_for(%arg3, %[[GRAIN]],
