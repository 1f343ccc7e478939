"""codegen/llvm/identical.py: function groups defined twice are compiled once."""
from ir_runner import check_pass, run_pass

# Two parallel tasks of the same code (a task, its launcher and its trampoline each), a
# third whose task adds instead, and two library-call wrappers of the same body; main
# calls every launcher and wrapper.
MODULE = """
llvm.func @blade_ral_parallel_for(i64, i64, !llvm.ptr, !llvm.ptr)
llvm.func @blade_ral_matmul(!llvm.ptr, !llvm.ptr)
{tasks}
llvm.func @blade_library_call_0(%a: !llvm.ptr, %b: !llvm.ptr)
    attributes {{sym_visibility = "private"}} {{
  llvm.call @blade_ral_matmul(%a, %b) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}}
llvm.func @blade_library_call_1(%a: !llvm.ptr, %b: !llvm.ptr)
    attributes {{sym_visibility = "private"}} {{
  llvm.call @blade_ral_matmul(%a, %b) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}}
llvm.func @main(%p: !llvm.ptr, %x: f32) {{
  llvm.call @blade_launch_0(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_launch_1(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_launch_2(%p, %x) : (!llvm.ptr, f32) -> ()
  llvm.call @blade_library_call_0(%p, %p) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.call @blade_library_call_1(%p, %p) : (!llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}}
"""

TASK = """
llvm.func @blade_task_{n}(%b: i64, %e: i64, %p: !llvm.ptr, %x: f32) {{
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.{op} %v, %x : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}}
llvm.func @blade_trampoline_{n}(%b: i64, %e: i64, %a: !llvm.ptr) {{
  %p = llvm.load %a : !llvm.ptr -> !llvm.ptr
  %x = llvm.mlir.constant(1.0 : f32) : f32
  llvm.call @blade_task_{n}(%b, %e, %p, %x) : (i64, i64, !llvm.ptr, f32) -> ()
  llvm.return
}}
llvm.func @blade_launch_{n}(%p: !llvm.ptr, %x: f32) {{
  %one = llvm.mlir.constant(1 : i64) : i64
  %n = llvm.mlir.constant({extent} : i64) : i64
  %a = llvm.alloca %one x !llvm.ptr : (i64) -> !llvm.ptr
  llvm.store %p, %a : !llvm.ptr, !llvm.ptr
  %f = llvm.mlir.addressof @blade_trampoline_{n} : !llvm.ptr
  llvm.call @blade_ral_parallel_for(%n, %one, %f, %a) : (i64, i64, !llvm.ptr, !llvm.ptr) -> ()
  llvm.return
}}
"""


def module(extents=(64, 64, 64), ops=("fmul", "fmul", "fadd")):
    tasks = "".join(TASK.format(n=n, op=op, extent=extent)
                    for n, (op, extent) in enumerate(zip(ops, extents)))
    return MODULE.format(tasks=tasks)


def test_a_repeated_task_and_wrapper_are_merged_into_the_first():
    check_pass(module() + """
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
    """, "merge-identical-functions")


def test_groups_differing_in_a_constant_are_kept():
    # The second task's launcher runs over another extent: same task, other group.
    result, _ = run_pass(module(extents=(64, 128, 64)), "merge-identical-functions")
    for n in (0, 1, 2):
        assert f"llvm.func @blade_task_{n}(" in result
        assert f"llvm.call @blade_launch_{n}(" in result
    assert "llvm.func @blade_library_call_1(" not in result


def test_repeated_serial_loops_are_merged_and_other_loops_kept():
    # codegen/loops/serial.py's functions: each loop a group of its own.
    loops = "".join(f"""
llvm.func @blade_loop_{n}(%p: !llvm.ptr) {{
  %v = llvm.load %p : !llvm.ptr -> f32
  %r = llvm.{op} %v, %v : f32
  llvm.store %r, %p : f32, !llvm.ptr
  llvm.return
}}""" for n, op in enumerate(("fmul", "fadd", "fmul")))
    text = loops + """
llvm.func @main(%p: !llvm.ptr) {
  llvm.call @blade_loop_0(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_loop_1(%p) : (!llvm.ptr) -> ()
  llvm.call @blade_loop_2(%p) : (!llvm.ptr) -> ()
  llvm.return
}
    // CHECK: llvm.func @blade_loop_0(
    // CHECK: llvm.func @blade_loop_1(
    // CHECK: llvm.func @main(
    // CHECK-NEXT: llvm.call @blade_loop_0(
    // CHECK-NEXT: llvm.call @blade_loop_1(
    // CHECK-NEXT: llvm.call @blade_loop_0(
    """
    check_pass(text, "merge-identical-functions")
    result, _ = run_pass(text, "merge-identical-functions")
    assert "@blade_loop_2" not in result, result
