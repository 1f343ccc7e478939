"""tiled_transpose.tile_transposes: transposing loop nests run as 8 x 8 vector tiles
(report's tiled_transposes), with eager's results; nests it cannot tile stay loops."""
import torch
from torch_mlir import ir

import blade
from blade.codegen.loops.tiled_transpose import tile_transposes
from helpers import Lambda, run_compiled

TRACE = blade.Config(allow_tracing=True)
DYNAMIC = blade.Config(allow_tracing=True, dynamic_dims={0: [0], 1: [0]})   # the batch

NHWC_TO_NCHW = """
#nhwc = affine_map<(d0, d1, d2, d3) -> (d0, d2, d3, d1)>
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @main(%a: memref<2x16x8x24xf32>, %b: memref<2x8x24x16xf32>,
                %out: memref<2x16x8x24xf32>) {
  linalg.generic {indexing_maps = [#id, #nhwc, #id],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%a, %b : memref<2x16x8x24xf32>, memref<2x8x24x16xf32>)
      outs(%out : memref<2x16x8x24xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}
"""


def test_a_transposing_nest_becomes_tile_loops_with_one_transpose_per_tile():
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(NHWC_TO_NCHW)
        assert tile_transposes(module) == 1
        text = str(module)
        assert tile_transposes(module) == 0      # nothing transposing is left
    assert "linalg.generic" not in text, text
    assert text.count("vector.transpose") == 1, text   # %b's tile; %a is read as it lies
    assert text.count("scf.for") == 4, text            # n, h, then the 8 x 8 tiles of c, w
    assert "vector<8x8xf32>" in text, text


def to_channels_last_plus(x, y):
    return x.permute(0, 2, 3, 1) + y


def add_to_channels_first(a, b):
    return (a * b + 1.0).permute(0, 3, 1, 2)


def transposed_matrix(x, y):
    return torch.relu(x.t() * 2.0) + y


def scaled_per_batch(x, s):
    return x.permute(0, 2, 3, 1) * s - 0.5


def integers(x, y):
    return x.permute(0, 2, 1) * 3 + y


def check_tiled(fn, inputs, config=TRACE, tiled=1):
    _, report = run_compiled(Lambda(fn), inputs, config, rtol=1e-6, atol=1e-6)
    assert report.clusters[0].tiled_transposes == tiled, str(report.clusters[0])


def test_permutes_between_layouts_run_as_tiles_and_match_eager():
    torch.manual_seed(0)
    check_tiled(to_channels_last_plus, (torch.randn(2, 16, 8, 24), torch.randn(2, 8, 24, 16)))
    # both inputs transposed against the output: computed along theirs, the result tiled
    check_tiled(add_to_channels_first, (torch.randn(2, 8, 24, 16), torch.randn(2, 8, 24, 16)))
    check_tiled(transposed_matrix, (torch.randn(40, 64), torch.randn(64, 40)))
    check_tiled(scaled_per_batch, (torch.randn(3, 8, 5, 16), torch.randn(3, 1, 1, 1)))
    check_tiled(integers, (torch.randint(-50, 50, (2, 24, 16), dtype=torch.int32),
                           torch.randint(-50, 50, (2, 16, 24), dtype=torch.int32)))


def test_a_dynamic_batch_still_tiles():
    torch.manual_seed(0)
    x, y = torch.randn(3, 16, 8, 24), torch.randn(3, 8, 24, 16)
    optimized, report = run_compiled(Lambda(to_channels_last_plus), (x, y), DYNAMIC)
    assert report.clusters[0].tiled_transposes == 1, str(report.clusters[0])
    for batch in (1, 5):
        x, y = torch.randn(batch, 16, 8, 24), torch.randn(batch, 8, 24, 16)
        torch.testing.assert_close(optimized(x, y), to_channels_last_plus(x, y))


def test_nests_it_cannot_tile_stay_loops_and_match_eager():
    torch.manual_seed(0)
    # 7 and 9 channels / columns: no whole 8 x 8 tile
    check_tiled(to_channels_last_plus, (torch.randn(2, 7, 8, 9), torch.randn(2, 8, 9, 7)),
                tiled=0)
    # booleans: a byte per element in memory, a bit per lane in a vector
    check_tiled(lambda x, y: (x.permute(0, 2, 1) > 0) & (y > 0),
                (torch.randn(2, 16, 24), torch.randn(2, 24, 16)), tiled=0)
