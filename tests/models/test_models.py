"""Real small models: every tensor compute op compiled, results equal to eager."""
import sys
from pathlib import Path

import pytest
import torch

from helpers import run_compiled
from models.zoo import BasicBlock, BertLayer, GptBlock, Mlp, bert_inputs, randomize_batch_norms


def cases():
    torch.manual_seed(0)
    return {
        "bert_layer": (BertLayer(), bert_inputs()),
        "gpt_block": (GptBlock(), (torch.randn(2, 12, 64),)),
        "resnet_block": (randomize_batch_norms(BasicBlock()), (torch.randn(2, 8, 16, 16),)),
        "mlp": (Mlp(), (torch.randn(4, 32),)),
    }


@pytest.mark.parametrize("name", ["bert_layer", "gpt_block", "resnet_block", "mlp"])
def test_model_is_fully_compiled(name):
    model, inputs = cases()[name]
    optimized, report = run_compiled(model.eval(), inputs, atol=1e-4, rtol=1e-4)
    assert report.coverage == 1.0, str(report)
    assert not report.unsupported and not report.compile_errors, str(report)
    # Matmuls, linears and convolutions all ran through PyTorch's kernels.
    assert sum(c.library_calls for c in report.clusters) >= 2
    # One engine: list plumbing (split/chunk) does not cut the model in two.
    assert len(report.clusters) == 1, str(report)
    # New data of the same signature is computed by the engine too.
    fresh = tuple(torch.randn_like(t) if t.is_floating_point() else t for t in inputs)
    with torch.no_grad():
        torch.testing.assert_close(optimized(*fresh), model(*fresh), atol=1e-4, rtol=1e-4)
    assert report.runtime_fallbacks == 0


@pytest.mark.parametrize("name", ["efficientnet", "convnext"])
def test_benchmark_convolution_networks_compile_whole(name):
    """`make bench`'s EfficientNet-B0 and ConvNeXt-Tiny (benchmarks/workloads.py), on a
    smaller image: one engine, every op compiled, eager's results."""
    benchmarks = str(Path(__file__).resolve().parents[2] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        from workloads import build
    finally:
        sys.path.remove(benchmarks)
    model, _ = build(name)
    optimized, report = run_compiled(model, (torch.randn(1, 3, 96, 96),), atol=1e-4,
                                     rtol=1e-4)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    assert report.runtime_fallbacks == 0
