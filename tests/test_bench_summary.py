"""`make bench`'s summary tables: the share of the peak a ratio to a peer would take."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run as module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def row(ms, gflops):
    return {"median_ms": ms, "gflops": gflops, "ratio_to_eager": ms / 100.0,
            "max_abs_diff": 1e-4, "cosine": 0.9999}


PEAK = {"gflops": 200.0, "bf16_gflops": 400.0, "int8_gops": 800.0, "int8_gemm_gops": 700.0}


def test_share_needed(run):
    # 2000 MFLOP at 0.5x a 10 ms peer: 400 GFLOP/s, twice a peak of 200.
    assert run.share_needed(row(20.0, 100.0), 10.0, 0.5, 200.0) == pytest.approx(2.0)
    assert run.share_needed(row(20.0, None), 10.0, 0.5, 200.0) is None


def test_tables_give_the_share_each_line_needs(run):
    results = {"net": {"blade": row(10.0, 160.0), "onnxruntime": row(9.0, 177.8),
                       "openvino": row(8.0, 200.0), "blade_bf16": row(5.0, 320.0),
                       "openvino_bf16": row(4.0, 400.0), "blade_int8": row(2.5, 640.0),
                       "openvino_int8": row(2.0, 800.0)}}
    f32 = run.summary(results, PEAK).splitlines()[-1]
    # 1600 MFLOP in 0.90 x 8 ms: 222 GFLOP/s, 111% of 200; bf16 in 0.90 x 4 ms: 111% of 400.
    assert "| 1.25 (111% of peak) |" in f32
    assert "0.90x needs 111%" in f32
    int8 = run.int8_summary(results, PEAK).splitlines()[-1]
    # 1600 MOP in 0.85 x 2 ms: 941 GOP/s, 118% of the larger int8 limit (800).
    assert "| 1.25 (openvino_int8) | 80% (118%) |" in int8
