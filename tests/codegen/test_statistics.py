"""What passes count (pipeline.Compilation.statistics, which the report shows), on cases of
mlir/, whose CHECK lines check the IR the passes leave."""
import pytest

from ir_runner import MLIR, run_file

COUNTS = [
    ("kernels/outline-library-calls-matmul.mlir", {"library_calls": 1, "fused_attention": 0}),
    ("kernels/outline-library-calls-convolution.mlir", {"library_calls": 1}),
    ("kernels/outline-library-calls-elementwise.mlir", {"library_calls": 0}),
    ("kernels/outline-library-calls-sort.mlir", {"library_calls": 1}),
    ("kernels/outline-library-calls-sort-other-comparator.mlir", {"library_calls": 0}),
    ("loops/outline-parallel-loops.mlir", {"parallel_loops": 1}),
    ("loops/outline-parallel-loops-small.mlir", {"parallel_loops": 0}),
    ("loops/tile-transposes.mlir", {"tiled_transposes": 1}),
    ("loops/tile-transposes-no-transpose.mlir", {"tiled_transposes": 0}),
]


@pytest.mark.parametrize("path, counts", COUNTS, ids=[path for path, _ in COUNTS])
def test_statistics(path, counts):
    _, compilation = run_file(MLIR / path)
    assert {name: getattr(compilation.statistics, name) for name in counts} == counts
