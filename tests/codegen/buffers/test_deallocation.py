"""codegen/buffers/deallocation.py: main's intermediates freed after their last use."""
from ir_runner import check_pass, run_pass

CHAIN = """
func.func private @step(memref<8xf32>, memref<8xf32>)
func.func private @make(memref<8xf32>) -> memref<8xf32>
func.func @main(%in: memref<8xf32>, %out: memref<8xf32>) {
  %a = memref.alloc() : memref<8xf32>
  call @step(%in, %a) : (memref<8xf32>, memref<8xf32>) -> ()
  %b = memref.alloc() : memref<8xf32>
  call @step(%a, %b) : (memref<8xf32>, memref<8xf32>) -> ()
  %v = memref.collapse_shape %b [[0]] : memref<8xf32> into memref<8xf32>
  %c = memref.alloc() : memref<8xf32>
  call @step(%v, %c) : (memref<8xf32>, memref<8xf32>) -> ()
  call @step(%c, %out) : (memref<8xf32>, memref<8xf32>) -> ()
  memref.dealloc %a : memref<8xf32>
  memref.dealloc %b : memref<8xf32>
  memref.dealloc %c : memref<8xf32>
  return
}
"""


def test_free_after_last_use_frees_each_buffer_once_it_is_read():
    # %b is last read through its view %v.
    check_pass(CHAIN + """
    // CHECK: call @step(%arg0, [[A:%[a-z_0-9]+]])
    // CHECK: call @step([[A]], [[B:%[a-z_0-9]+]])
    // CHECK-NEXT: memref.dealloc [[A]]
    // CHECK: call @step([[V:%[a-z_0-9]+]], [[C:%[a-z_0-9]+]])
    // CHECK-NEXT: memref.dealloc [[B]]
    // CHECK-NEXT: call @step([[C]], %arg1)
    // CHECK-NEXT: memref.dealloc [[C]]
    // CHECK-NEXT: return
    """, "free-after-last-use")


def test_free_after_last_use_leaves_a_buffer_another_value_may_hold():
    # @make's result may be %a itself: %a is freed where it was, at the end.
    text, _ = run_pass(CHAIN.replace(
        "  call @step(%c, %out) : (memref<8xf32>, memref<8xf32>) -> ()\n",
        "  %m = call @make(%a) : (memref<8xf32>) -> memref<8xf32>\n"
        "  call @step(%c, %out) : (memref<8xf32>, memref<8xf32>) -> ()\n"
        "  call @step(%m, %out) : (memref<8xf32>, memref<8xf32>) -> ()\n"),
        "free-after-last-use")
    body = text[text.index("func.func @main"):]
    lines = [line.strip() for line in body.splitlines()]
    assert lines.index("memref.dealloc %alloc : memref<8xf32>") > \
        max(i for i, line in enumerate(lines) if line.startswith("call @step(%0")), text
