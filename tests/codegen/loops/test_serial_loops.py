"""codegen/loops/serial.py: the loop nests left in main become functions of their own, and
a main left straight-line is compiled unoptimized (in a partition of its own, at -O0)."""
import pytest

from ir_runner import check_pass, run_pass

# A padding fill, a copy into a view of the padded buffer and a max over rows: loop nests
# of main's own buffers, read through main's constant.
POOL = """
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
func.func @main(%arg0: memref<8x16xf32> {llvm.noalias}, %arg1: memref<10xf32> {llvm.noalias}) {
  %cst = arith.constant 0xFF800000 : f32
  %alloc = memref.alloc() : memref<10x16xf32>
  linalg.fill ins(%cst : f32) outs(%alloc : memref<10x16xf32>)
  %view = memref.subview %alloc[1, 0] [8, 16] [1, 1]
      : memref<10x16xf32> to memref<8x16xf32, strided<[16, 1], offset: 16>>
  memref.copy %arg0, %view : memref<8x16xf32> to memref<8x16xf32, strided<[16, 1], offset: 16>>
  linalg.fill ins(%cst : f32) outs(%arg1 : memref<10xf32>)
  linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]}
      ins(%alloc : memref<10x16xf32>) outs(%arg1 : memref<10xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.maximumf %in, %out : f32
    linalg.yield %0 : f32
  }
  memref.dealloc %alloc : memref<10x16xf32>
  return
}
"""


def test_loop_nests_of_main_become_functions_with_noalias_buffers():
    check_pass(POOL + """
    // CHECK: func.func private @blade_loop_0(%arg0: memref<10x16xf32> {llvm.noalias})
    // CHECK-NEXT: arith.constant 0xFF800000
    // CHECK-NEXT: linalg.fill
    // CHECK: func.func private @blade_loop_1(%arg0: memref<8x16xf32> {llvm.noalias},
    // CHECK-SAME: %arg1: memref<8x16xf32, strided<[16, 1], offset: 16>> {llvm.noalias})
    // CHECK-NEXT: memref.copy %arg0, %arg1
    // CHECK: func.func private @blade_loop_3(%arg0: memref<10x16xf32> {llvm.noalias},
    // CHECK-SAME: %arg1: memref<10xf32> {llvm.noalias})
    // CHECK: arith.maximumf
    // CHECK: func.func @main
    // CHECK: memref.alloc
    // CHECK-NEXT: call @blade_loop_0(%alloc)
    // CHECK-NEXT: memref.subview
    // CHECK-NEXT: call @blade_loop_1(%arg0, %subview)
    // CHECK-NEXT: call @blade_loop_2(%arg1)
    // CHECK-NEXT: call @blade_loop_3(%alloc, %arg1)
    // CHECK-NEXT: memref.dealloc
    // CHECK-NEXT: return
    """, "outline-serial-loops")


def test_a_loop_through_two_views_of_one_buffer_stays_in_main():
    # Its function could not mark the two noalias, and LLVM would stop vectorizing it.
    shift = """
    func.func @main(%arg0: memref<16xf32> {llvm.noalias}) {
      %a = memref.subview %arg0[0] [8] [1] : memref<16xf32> to memref<8xf32, strided<[1]>>
      %b = memref.subview %arg0[8] [8] [1]
          : memref<16xf32> to memref<8xf32, strided<[1], offset: 8>>
      memref.copy %a, %b : memref<8xf32, strided<[1]>> to memref<8xf32, strided<[1], offset: 8>>
      return
    }
    """
    result, _ = run_pass(shift, "outline-serial-loops")
    assert "blade_loop" not in result and "memref.copy %subview" in result, result


def test_a_loop_that_allocates_stays_in_main():
    loop = """
    func.func @main(%arg0: memref<4xf32> {llvm.noalias}) {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c4 = arith.constant 4 : index
      scf.for %i = %c0 to %c4 step %c1 {
        %tmp = memref.alloc() : memref<4xf32>
        memref.copy %arg0, %tmp : memref<4xf32> to memref<4xf32>
        memref.dealloc %tmp : memref<4xf32>
      }
      return
    }
    """
    result, _ = run_pass(loop, "outline-serial-loops")
    assert "blade_loop" not in result and "scf.for" in result, result


STRAIGHT = """
llvm.func @blade_loop_0(!llvm.ptr)
llvm.func @main(%p: !llvm.ptr) {
  llvm.call @blade_loop_0(%p) : (!llvm.ptr) -> ()
  llvm.return
}
"""

BRANCHING = """
llvm.func @main(%p: !llvm.ptr, %c: i1) {
  llvm.cond_br %c, ^bb1, ^bb2
^bb1:
  llvm.return
^bb2:
  llvm.return
}
"""


@pytest.mark.parametrize("text, unoptimized", [(STRAIGHT, True), (BRANCHING, False)])
def test_only_a_straight_line_main_is_compiled_unoptimized(text, unoptimized):
    result, _ = run_pass(text, "compile-main-unoptimized")
    assert ('passthrough = ["optnone", "noinline"]' in result) == unoptimized, result


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
    from torch_mlir import ir

    from blade.codegen.llvm import native

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
    from blade.codegen.llvm import native

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


def test_a_loop_over_a_buffer_of_unknown_origin_stays_in_main():
    # A transposed view is no view root_buffer sees through: it may alias what the loop
    # writes, so no function could mark the two noalias.
    transposed = """
    #map = affine_map<(d0, d1) -> (d0, d1)>
    func.func @main(%arg0: memref<4x4xf32> {llvm.noalias}) {
      %t = memref.transpose %arg0 (d0, d1) -> (d1, d0)
          : memref<4x4xf32> to memref<4x4xf32, strided<[1, 4]>>
      linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]}
          ins(%t : memref<4x4xf32, strided<[1, 4]>>) outs(%arg0 : memref<4x4xf32>) {
      ^bb0(%in: f32, %out: f32):
        linalg.yield %in : f32
      }
      return
    }
    """
    result, _ = run_pass(transposed, "outline-serial-loops")
    assert "blade_loop" not in result and "linalg.generic" in result, result
