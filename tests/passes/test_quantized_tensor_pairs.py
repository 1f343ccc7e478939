"""aten's quantized tensors made and read back within the model (quantize_per_tensor then
int_repr or dequantize; _make_per_tensor/_make_per_channel_quantized_tensor then
dequantize) compile as integer and float math, with eager's rounding exactly
(blade.frontend.quant_fusion.quantized_tensor_pairs)."""
import warnings

import pytest
import torch

import blade
from graph_runner import run_pass
from helpers import run_compiled

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions")


class IntRepr(torch.nn.Module):
    def __init__(self, scale, zero_point, dtype):
        super().__init__()
        self.scale, self.zero_point, self.dtype = scale, zero_point, dtype

    def forward(self, x):
        return torch.quantize_per_tensor(x, self.scale, self.zero_point, self.dtype).int_repr()


class FakeQuant(torch.nn.Module):
    def forward(self, x):
        q = torch.quantize_per_tensor(x, 0.04, 11, torch.quint8)
        return torch.tanh(q.dequantize()), q.int_repr(), q.int_repr()


class DequantizedRelu(torch.nn.Module):
    def forward(self, x):
        q = torch._make_per_tensor_quantized_tensor(x, 0.0215, -25)
        return torch.relu(torch.dequantize(q))


class PerChannel(torch.nn.Module):
    def forward(self, x, zero_points, scales):
        q = torch._make_per_channel_quantized_tensor(x, scales, zero_points, axis=1)
        return torch.dequantize(q)


class Escapes(torch.nn.Module):
    def forward(self, x):
        q = torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
        return q, q.dequantize() * 2


def _values():
    torch.manual_seed(0)
    x = torch.randn(64, 300) * 3
    x[0, :100] = torch.arange(100) * 0.25 - 12  # halves: where rounding orders differ
    return x


@pytest.mark.parametrize("dtype, scale, zero_point", [
    (torch.qint8, 0.013, 3), (torch.qint8, 0.5, -7), (torch.quint8, 0.04, 11),
    (torch.quint8, 0.5, 7), (torch.qint32, 0.0215, 5)])
def test_quantize_then_int_repr_rounds_as_eager_exactly(dtype, scale, zero_point):
    model = IntRepr(scale, zero_point, dtype)
    _, report = run_compiled(model, (_values(),), rtol=0, atol=0)
    assert report.coverage == 1.0, str(report)


def test_fake_quantization_compiles_and_each_int_repr_is_a_tensor_of_its_own():
    x = _values()
    optimized, report = run_compiled(FakeQuant(), (x,), rtol=0, atol=1e-6)
    assert report.coverage == 1.0, str(report)
    _, first, second = optimized(x)
    first.zero_()
    assert second.abs().sum() > 0  # eager's two int_repr calls return two tensors


def test_dequantized_integers_compile():
    x = torch.randint(-128, 127, (7, 4), dtype=torch.int8)
    _, report = run_compiled(DequantizedRelu(), (x,), atol=1e-6)
    assert report.coverage == 1.0, str(report)


@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 5)])
def test_per_channel_dequantize_compiles_along_its_axis_contiguous(shape):
    torch.manual_seed(0)
    inputs = (torch.randint(-128, 127, shape, dtype=torch.int8),
              torch.randint(-10, 10, (4,), dtype=torch.int8), torch.rand(4))
    optimized, report = run_compiled(PerChannel(), inputs, atol=1e-6)
    assert report.coverage == 1.0, str(report)
    assert optimized(*inputs).is_contiguous()


def test_a_quantized_tensor_the_model_returns_stays_as_it_is():
    x = _values()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = blade.optimize(Escapes(), (x,))
    q, doubled = optimized(x)
    expected_q, expected_doubled = Escapes()(x)
    assert q.dtype == torch.qint8 and torch.equal(q.int_repr(), expected_q.int_repr())
    torch.testing.assert_close(doubled, expected_doubled)
    assert "aten::quantize_per_tensor" in blade.report(optimized).unsupported


def test_the_pass_rewrites_the_pairs_and_counts_the_quantized_tensors():
    before, rewritten, after, _ = run_pass(FakeQuant(), (_values(),), "quantized_tensor_pairs")
    assert "aten::quantize_per_tensor" in before and rewritten == 1
    assert "aten::quantize_per_tensor" not in after and "aten::int_repr" not in after
    assert "aten::dequantize" not in after and "aten::round" in after


class WritesAfterQuantizing(torch.nn.Module):
    def forward(self, x, integers):
        q = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
        r = q.int_repr()
        r.zero_()                      # the quantized tensor keeps its values
        made = torch._make_per_tensor_quantized_tensor(integers, 0.5, 3)
        integers.add_(1)               # made copied the integers before this write
        return r, q.dequantize(), q.int_repr(), made.dequantize(), made.int_repr()


def test_reads_see_the_values_of_when_the_quantized_tensor_was_made():
    inputs = (torch.rand(4, 5) * 20, torch.randint(-100, 100, (4, 5), dtype=torch.int8))
    expected = WritesAfterQuantizing()(*[t.clone() for t in inputs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = blade.optimize(WritesAfterQuantizing(), tuple(t.clone() for t in inputs))
    got = optimized(*[t.clone() for t in inputs])
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_qint32_saturates_as_eager_does():
    model = IntRepr(1.0, 0, torch.qint32)
    x = torch.tensor([3e9, -3e9, 2147483000.0, 5.0])
    _, report = run_compiled(model, (x,), rtol=0, atol=0)
    assert report.coverage == 1.0, str(report)
