"""`make bench`'s tables: the share of the peak a ratio to a peer would take, and
layers.py's matching of Blade's kernels with OpenVINO's layers."""
import pytest
from helpers import bench_module


@pytest.fixture(scope="module")
def run():
    return bench_module("run")


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


@pytest.fixture(scope="module")
def layers():
    return bench_module("layers")


def test_layer_keys_name_the_same_work(layers):
    """Blade's profile names and OpenVINO's layer shapes give one key per convolution or
    linear layer: NHWC and NCHW inputs alike, rows of a linear layer's input flattened."""
    nhwc = "blade::quantized_conv2d [1, 14, 14, 256] [256, 256, 3, 3] [256] [256] [2] [2]"
    nchw = "blade::quantized_conv2d [1, 3, 224, 224] [64, 3, 7, 7] [64] [64] [2] [2]"
    f32 = "blade_ral_conv2d_nhwc [1, 56, 56, 64] by [256, 64, 1, 1] stride 1 groups 1"
    assert layers.blade_key(nhwc) == layers.openvino_key(
        "Convolution", [[1, 256, 14, 14], [256, 256, 3, 3], [256]])
    assert layers.blade_key(nchw) == ("conv", (1, 3, 224, 224), (64, 3, 7, 7))
    assert layers.blade_key(f32) == ("conv", (1, 64, 56, 56), (256, 64, 1, 1))
    assert layers.blade_key("blade_ral_matmul [1, 128, 768] x [3072, 768]^T") == \
        layers.openvino_key("FullyConnected", [[128, 768], [3072, 768]]) == \
        ("linear", 128, 768, 3072)
    assert layers.blade_key("parallel loop 0x1 extent 56") is None
    assert layers.openvino_key("MaxPool", [[1, 64, 112, 112]]) is None


def test_matched_pairs_kernels_with_layers(layers):
    blade_rows = [("blade_ral_conv2d_nhwc [1, 7, 7, 512] by [512, 512, 3, 3] stride 1 groups 1",
                   2, 300.0),
                  ("parallel loop 0x1 extent 7", 1, 20.0)]
    openvino_rows = [("a", "Convolution", "brgconv", 250.0, [[1, 512, 7, 7], [512, 512, 3, 3]]),
                     ("b", "Convolution", "brgconv", 270.0, [[1, 512, 7, 7], [512, 512, 3, 3]]),
                     ("c", "Convolution", "brgconv_1x1", 90.0,
                      [[1, 512, 7, 7], [2048, 512, 1, 1]])]
    table, unmatched = layers.matched(blade_rows, openvino_rows)
    assert table == [(blade_rows[0][0], 2, 300.0, 2, 260.0, ["brgconv"])]
    assert ("blade", "parallel loop 0x1 extent 7", 1, 20.0) in unmatched
    assert ("openvino", "c", 1, 90.0) in unmatched
