// RUN: blade-opt --pass mark-noalias-pointers --handed-on "noalias={'task': [(5, False), (5, True)]}" %s | FileCheck %s
// A rank-1 memref argument is 5 words: allocated and aligned pointers, offset, size,
// stride; the second memref is noalias.

llvm.func @task(%a0: !llvm.ptr, %a1: !llvm.ptr, %a2: i64, %a3: i64, %a4: i64,
                %b0: !llvm.ptr, %b1: !llvm.ptr, %b2: i64, %b3: i64, %b4: i64) {
  llvm.return
}

// CHECK: llvm.func @task(%arg0: !llvm.ptr, %arg1: !llvm.ptr, %arg2: i64, %arg3: i64, %arg4: i64, %arg5: !llvm.ptr {llvm.noalias}, %arg6: !llvm.ptr {llvm.noalias}, %arg7: i64
