"""The report's accounting: an op that runs is counted, compiled or with the reason it is
not; only ops the example inputs never ran are "not reached"."""
import torch

import blade
from helpers import assert_every_op_accounted_for, run_compiled


class AttentionBlock(torch.nn.Module):
    """nn.MultiheadAttention with a key padding mask between two linear layers. In eval
    mode, batch_first, without attention weights and under no_grad it takes PyTorch's fast
    path, one `aten::_native_multi_head_attention` node, whose attention-weights result is
    left undefined; with a mask Blade does not decompose it (without one it does:
    tests/codegen/kernels/test_attention_fast_path.py)."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.fc_in = torch.nn.Linear(dim, dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.fc_out = torch.nn.Linear(dim, dim)

    def forward(self, x, padding):
        h = torch.tanh(self.fc_in(x))
        h = self.attention(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return self.fc_out(h) + x


def test_an_op_that_runs_with_an_untyped_result_is_counted_as_not_compiled():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 3:] = True
    with torch.no_grad():
        optimized, report = run_compiled(AttentionBlock(), (x, padding), rtol=1e-4,
                                         atol=1e-4)
    op = "aten::_native_multi_head_attention"
    assert op not in report.unreached, str(report)
    assert report.unsupported[op].count == 1, str(report)
    assert "its type is not known" in report.unsupported[op].reasons[0], str(report)
    assert report.coverage < 1.0
    assert_every_op_accounted_for(report)
    # Its slow path, in the branch the example inputs did not take, is what is unreached.
    assert report.unreached_ops > 0 and "aten::linear" in report.unreached


class GrowsInALoop(torch.nn.Module):
    def forward(self, x, n: int):
        y = torch.tanh(x)
        for _ in range(n):
            y = torch.cat([y, y[:1]]) * 2.0
        return y.sum(dim=0) + 1.0


def test_an_op_whose_sizes_vary_between_runs_is_counted_as_not_compiled():
    x = torch.randn(3, 4)
    optimized, report = run_compiled(GrowsInALoop(), (x, 2))
    assert not report.unreached, str(report)
    # The ops in the loop ran (twice, at two sizes): counted, and not compiled.
    for op in ("aten::slice.Tensor", "aten::cat", "aten::mul.Scalar"):
        assert "differ between the runs" in report.unsupported[op].reasons[0], str(report)
    assert_every_op_accounted_for(report)


def test_an_op_outside_every_engine_without_a_recorded_reason_is_still_listed():
    from blade.frontend.finishing import account_for_ops_outside_engines
    from blade.report import Report

    class TopkThenTanh(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(torch.topk(x, 2, sorted=False).values)

    optimized = blade.optimize(TopkThenTanh(), (torch.randn(4, 5),),
                               blade.Config(kernel_calls=False))
    # As if no stage had recorded why topk stays TorchScript:
    report = Report()
    account_for_ops_outside_engines(optimized.graph, report)
    assert list(report.unsupported) == ["aten::topk"], str(report)
    assert "recorded no reason" in report.unsupported["aten::topk"].reasons[0]
