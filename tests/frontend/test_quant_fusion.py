"""QuantFusion on small graphs (blade.frontend.quant_fusion.fuse): which dequantize ->
linear / convolution <- dequantize_per_channel patterns become Blade's int8 layers, what
the fused op reads, and the patterns left alone."""
import pytest
import torch
from torch.ao.quantization.fx import _decomposed  # noqa: F401  (registers the ops)
from torch.testing import FileCheck

from blade.frontend import quant_fusion

qd = torch.ops.quantized_decomposed


class QuantizedLinear(torch.nn.Module):
    """What PT2E's convert writes for a static int8 linear layer."""

    def __init__(self, activation_dtype=torch.uint8, low=0, high=255, weight_zero=0):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("weight", torch.randint(-128, 128, (8, 16), dtype=torch.int8))
        self.register_buffer("scales", torch.rand(8, dtype=torch.float64) / 50 + 1e-3)
        self.register_buffer("zero_points", torch.full((8,), weight_zero, dtype=torch.int64))
        self.bias = torch.nn.Parameter(torch.randn(8))
        self.activation = (activation_dtype, low, high)

    def forward(self, x):
        dtype, low, high = self.activation
        q = qd.quantize_per_tensor(x, 0.05, 3, low, high, dtype)
        x = qd.dequantize_per_tensor(q, 0.05, 3, low, high, dtype)
        w = qd.dequantize_per_channel(self.weight, self.scales, self.zero_points, 0, -128, 127,
                                      torch.int8)
        return torch.nn.functional.linear(x, w, self.bias)


def _fused(model, x):
    traced = torch.jit.trace(model, (x,))
    graph = traced.graph
    count = quant_fusion.fuse(traced, graph)
    return traced, graph, count


def test_a_static_linear_pattern_becomes_one_int8_layer_reading_the_int8_weight():
    x = torch.randn(4, 16)
    traced, graph, count = _fused(QuantizedLinear(), x)
    assert count == 1
    # The int8 weight and its float32 scales, read from the module's attributes.
    FileCheck().check("aten::to(%scales").check("blade::quantized_linear(%x.1, %weight, ") \
        .check_not("aten::linear").run(str(graph))
    assert "quantized_decomposed" not in str(graph)
    # The activation's scale and zero point are the fused op's input range.
    fused = graph.findNode("blade::quantized_linear")
    assert fused.inputsAt(4).toIValue().tolist() == pytest.approx([0.05, 3.0])


@pytest.mark.parametrize("model", [
    QuantizedLinear(activation_dtype=torch.int8, low=-128, high=127),  # signed activation
    QuantizedLinear(weight_zero=1),                                      # asymmetric weight
], ids=["int8_activation", "weight_zero_point"])
def test_patterns_the_int8_layer_cannot_compute_are_left_alone(model):
    _, graph, count = _fused(model, torch.randn(4, 16))
    assert count == 0
    FileCheck().check("quantized_decomposed::dequantize_per_channel").check("aten::linear") \
        .run(str(graph))
