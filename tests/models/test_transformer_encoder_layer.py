"""nn.TransformerEncoderLayer as users run it: its inference fast path
(aten::_transformer_encoder_layer_fwd) is decomposed and compiled in one engine, static or
dynamic, post- or pre-norm, with or without a key padding mask, with eager's results."""
import pytest
import torch

import blade
from helpers import assert_same


def layer(norm_first: bool, activation: str):
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0,
                                            norm_first=norm_first,
                                            activation=activation).eval()


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_fast_path_compiles_into_one_engine(norm_first, activation):
    model = layer(norm_first, activation)
    x = torch.randn(2, 16, 64)
    optimized = blade.optimize(model, (x,))
    report = blade.report(optimized)
    # (The slow path's F.scaled_dot_product_attention, not taken here, is decomposed too.)
    assert report.decomposed["aten::_transformer_encoder_layer_fwd"] == 1, str(report)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    # qkv, the attention as one fused kernel, out, ffn x2
    assert report.clusters[0].library_calls == 5, str(report)
    assert report.clusters[0].fused_attention == 1, str(report)
    with torch.no_grad():
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    assert blade.report(optimized).clusters[0].calls == 1
    assert blade.report(optimized).runtime_fallbacks == 0


def test_dynamic_batch_and_length():
    model = layer(False, "relu")
    optimized = blade.optimize(model, (torch.randn(2, 16, 64),), blade.Config(dynamic=True))
    # The attention is one fused kernel in the dynamic engine too.
    assert blade.report(optimized).clusters[0].fused_attention == 1
    with torch.no_grad():
        for batch, length in ((1, 1), (3, 9), (5, 31)):
            x = torch.randn(batch, length, 64)
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 3 and report.runtime_fallbacks == 0, str(report)


def test_key_padding_mask():
    model = layer(False, "relu")
    x = torch.randn(2, 16, 64)
    pad = torch.zeros(2, 16, dtype=torch.bool)
    pad[0, 11:] = True
    optimized = blade.optimize(model, (x, None, pad))
    with torch.no_grad():
        assert_same(optimized(x, None, pad), model(x, src_key_padding_mask=pad),
                    rtol=1e-4, atol=1e-5)
        # An optional input given in the example is not specialized: None works too.
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage >= 0.95 and report.runtime_fallbacks == 0, str(report)
