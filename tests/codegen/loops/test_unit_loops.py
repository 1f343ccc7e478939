"""unit_loops.drop_unit_loops: a loop nest loses its leading loops of extent 1 through
collapsed views whose types are the ones memref.collapse_shape's verifier infers."""
import pytest
from torch_mlir import ir

from blade.codegen.loops.unit_loops import drop_unit_loops

# The head split of a fused QKV product of one sequence: q is a strided column slice of
# the [1, length, 3 * 64] product, viewed as [1, length, 4, 16] and transposed into heads.
HEAD_TRANSPOSE = """
#head = affine_map<(d0, d1, d2, d3) -> (d0, d2, d1, d3)>
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%q: memref<1x{length}x4x16xf32, strided<[?, 192, 16, 1]>>,
                %out: memref<1x4x{length}x16xf32>) {{
  linalg.generic {{indexing_maps = [#head, #id],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel"]}}
      ins(%q : memref<1x{length}x4x16xf32, strided<[?, 192, 16, 1]>>)
      outs(%out : memref<1x4x{length}x16xf32>) {{
  ^bb0(%x: f32, %o: f32):
    linalg.yield %x : f32
  }}
  return
}}
"""


@pytest.mark.parametrize("length, view", [
    # A dynamic length may be 1 at run time, so MLIR cannot tell whose stride the merged
    # dim takes: the view's outer stride is dynamic.
    ("?", "memref<?x4x16xf32, strided<[?, 16, 1]>>"),
    ("8", "memref<8x4x16xf32, strided<[192, 16, 1]>>"),
])
def test_a_head_transpose_of_one_sequence_reads_a_view_mlir_accepts(length, view):
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(HEAD_TRANSPOSE.format(length=length))
        assert drop_unit_loops(module.body.operations[0]) == 1
        assert module.operation.verify()
        text = str(module)
    assert f"into {view}" in text, text
    assert f"into memref<4x{length}x16xf32>" in text, text
