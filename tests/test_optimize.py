"""blade.optimize end to end: mixed models, no supported op, scripting and tracing."""
import torch

import blade
from helpers import assert_same, run_compiled


class MixedModel(torch.nn.Module):
    """Elementwise chains around linear layers, and a topk that Blade does not compile."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)
        self.scale = torch.nn.Parameter(torch.randn(64))

    def forward(self, x, mask):
        h = self.fc1(x)
        h = torch.nn.functional.gelu(h * self.scale + 1.0) * torch.sigmoid(h)
        h = h.masked_fill(mask, 0.0)
        values, _ = torch.topk(h, 4, dim=-1)
        out = self.fc2(h)
        out = torch.softmax(out - out.amax(dim=-1, keepdim=True), dim=-1)
        return out, values.sum(dim=-1)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 2).values.cumprod(dim=0)


def test_mixed_model_compiles_clusters_and_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    mask = torch.rand(8, 64) > 0.7
    model = MixedModel().eval()
    optimized, report = run_compiled(model, (x, mask), min_compiled_ops=6)
    assert len(report.clusters) >= 2
    assert set(report.unsupported) == {"aten::topk"}
    assert sum(c.ops.get("aten::linear", 0) for c in report.clusters) == 2
    assert report.compiled_ops == report.total_ops - 1
    assert 0 < report.coverage < 1
    # The graph really calls engines in place of the compiled nodes.
    assert "blade::execute" in str(optimized.graph)
    # Other inputs of the same signature run compiled too.
    x2 = torch.randn(8, 32)
    with torch.no_grad():
        assert_same(optimized(x2, mask), model(x2, mask))


def test_model_without_supported_ops_comes_back_unchanged():
    x = torch.randn(6, 5)
    model = Unsupported().eval()
    optimized = blade.optimize(model, (x,))
    report = blade.report(optimized)
    assert report.compiled_ops == 0 and not report.clusters
    assert "blade::execute" not in str(optimized.graph)
    assert_same(optimized(x), model(x))


def test_tracing_path_compiles():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.ReLU())
    run_compiled(model, (torch.randn(4, 16),), blade.Config(allow_tracing=True))


def test_optimize_accepts_a_script_module_and_a_single_tensor():
    class Chain(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x) * 2 + torch.tanh(x)

    scripted = torch.jit.script(Chain())
    x = torch.randn(3, 7)
    optimized = blade.optimize(scripted, x)
    assert_same(optimized(x), Chain()(x))
    assert blade.report(optimized).clusters[0].calls == 1


class WithExtras(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = 3.0
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.factor

    @torch.jit.export
    def scale(self, x):
        return x * self.factor


def test_preserved_attributes_and_methods_survive_freezing():
    model = WithExtras().eval()
    x = torch.randn(2, 4)
    optimized = blade.optimize(model, (x,),
                               blade.Config(preserved_attributes=["factor", "scale"]))
    assert optimized.factor == 3.0
    torch.testing.assert_close(optimized.scale(x), model.scale(x))
    torch.testing.assert_close(optimized(x), model(x))
    # A preserved attribute stays an attribute (the user may set it): the op reading it
    # runs in TorchScript, and sees the new value.
    report = blade.report(optimized)
    assert report.compiled_ops == 2 and "not a compile-time constant" in \
        report.unsupported["aten::mul.Scalar"].reasons[0], str(report)
    optimized.factor = 5.0
    torch.testing.assert_close(optimized(x), torch.relu(model.fc(x)) * 5.0)
    plain = blade.optimize(model, (x,))
    assert not hasattr(plain, "scale")
    assert blade.report(plain).coverage == 1.0
