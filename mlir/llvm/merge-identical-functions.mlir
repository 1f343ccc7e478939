// RUN: blade-opt --pass merge-identical-functions %s | FileCheck %s
// Two parallel tasks of the same code (a task, its launcher and its trampoline each), a
// third whose task adds instead, and two library-call wrappers of the same body; main
// calls every launcher and wrapper. The repeated task and wrapper merge into the first.

llvm.func @blade_ral_parallel_for(i64, i64, !llvm.ptr, !llvm.ptr)
llvm.func @blade_ral_matmul(!llvm.ptr, !llvm.ptr)

llvm.func @blade_task_0(%b: i64, %e: i64, %p: !llvm.ptr, %x: f32) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fmul %v, %x : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_trampoline_0(%b: i64, %e: i64, %a: !llvm.ptr) {
  %p = llvm.load %a : !llvm.ptr -> !llvm.ptr
  %x = llvm.mlir.constant(1.0 : f32) : f32
  llvm.call @blade_task_0(%b, %e, %p, %x) : (i64, i64, !llvm.ptr, f32) -> ()
  llvm.return
}
llvm.func @blade_launch_0(%p: !llvm.ptr, %x: f32) {
  %one = llvm.mlir.constant(1 : i64) : i64
  %n = llvm.mlir.constant(64 : i64) : i64
  %a = llvm.alloca %one x !llvm.ptr : (i64) -> !llvm.ptr
  llvm.store %p, %a : !llvm.ptr, !llvm.ptr
  %f = llvm.mlir.addressof @blade_trampoline_0 : !llvm.ptr
  llvm.call @blade_ral_parallel_for(%n, %one, %f, %a) : (i64, i64, !llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}

llvm.func @blade_task_1(%b: i64, %e: i64, %p: !llvm.ptr, %x: f32) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fmul %v, %x : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_trampoline_1(%b: i64, %e: i64, %a: !llvm.ptr) {
  %p = llvm.load %a : !llvm.ptr -> !llvm.ptr
  %x = llvm.mlir.constant(1.0 : f32) : f32
  llvm.call @blade_task_1(%b, %e, %p, %x) : (i64, i64, !llvm.ptr, f32) -> ()
  llvm.return
}
llvm.func @blade_launch_1(%p: !llvm.ptr, %x: f32) {
  %one = llvm.mlir.constant(1 : i64) : i64
  %n = llvm.mlir.constant(64 : i64) : i64
  %a = llvm.alloca %one x !llvm.ptr : (i64) -> !llvm.ptr
  llvm.store %p, %a : !llvm.ptr, !llvm.ptr
  %f = llvm.mlir.addressof @blade_trampoline_1 : !llvm.ptr
  llvm.call @blade_ral_parallel_for(%n, %one, %f, %a) : (i64, i64, !llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}

llvm.func @blade_task_2(%b: i64, %e: i64, %p: !llvm.ptr, %x: f32) {
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.fadd %v, %x : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}
llvm.func @blade_trampoline_2(%b: i64, %e: i64, %a: !llvm.ptr) {
  %p = llvm.load %a : !llvm.ptr -> !llvm.ptr
  %x = llvm.mlir.constant(1.0 : f32) : f32
  llvm.call @blade_task_2(%b, %e, %p, %x) : (i64, i64, !llvm.ptr, f32) -> ()
  llvm.return
}
llvm.func @blade_launch_2(%p: !llvm.ptr, %x: f32) {
  %one = llvm.mlir.constant(1 : i64) : i64
  %n = llvm.mlir.constant(64 : i64) : i64
  %a = llvm.alloca %one x !llvm.ptr : (i64) -> !llvm.ptr
  llvm.store %p, %a : !llvm.ptr, !llvm.ptr
  %f = llvm.mlir.addressof @blade_trampoline_2 : !llvm.ptr
  llvm.call @blade_ral_parallel_for(%n, %one, %f, %a) : (i64, i64, !llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}

llvm.func @blade_library_call_0(%a: !llvm.ptr, %b: !llvm.ptr)
    attributes {sym_visibility = "private"} {
  llvm.call @blade_ral_matmul(%a, %b) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}
llvm.func @blade_library_call_1(%a: !llvm.ptr, %b: !llvm.ptr)
    attributes {sym_visibility = "private"} {
  llvm.call @blade_ral_matmul(%a, %b) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}
llvm.func @main(%p: !llvm.ptr, %x: f32) {
  llvm.call @blade_launch_0(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_launch_1(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_launch_2(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_library_call_0(%p, %p) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.call @blade_library_call_1(%p, %p) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}

// CHECK-NOT: @blade_task_1(
// CHECK-NOT: @blade_launch_1(
// CHECK-NOT: @blade_library_call_1(
// CHECK: llvm.func @blade_task_0(
// CHECK: llvm.fmul
// CHECK: llvm.func @blade_trampoline_0(
// CHECK: llvm.call @blade_task_0(
// CHECK: llvm.func @blade_launch_0(
// CHECK: llvm.mlir.addressof @blade_trampoline_0
// CHECK: llvm.func @blade_task_2(
// CHECK: llvm.fadd
// CHECK: llvm.func @blade_launch_2(
// CHECK: llvm.mlir.addressof @blade_trampoline_2
// CHECK: llvm.func @blade_library_call_0(
// CHECK: llvm.func @main(
// CHECK-NEXT: llvm.call @blade_launch_0(
// CHECK-NEXT: llvm.call @blade_launch_0(
// CHECK-NEXT: llvm.call @blade_launch_2(
// CHECK-NEXT: llvm.call @blade_library_call_0(
// CHECK-NEXT: llvm.call @blade_library_call_0(
