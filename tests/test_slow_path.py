"""The slow path is never silent: a call that runs TorchScript instead of compiled code
warns once per guard or engine and kind of reason, with the fix; the report counts the
calls by reason and says what runs compiled now."""
import subprocess
import sys
import textwrap
import warnings

import torch

import blade
from helpers import run_compiled


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.relu(self.fc(x.float())) * 2  # takes any float dtype, as eager does


def _blade_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("blade:")]


def _calls(optimized, inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            for x in inputs:
                optimized(x)
    return _blade_warnings(caught)


def test_a_refused_shape_warns_once_with_the_fix_and_the_report_says_what_runs():
    torch.manual_seed(0)
    model = Mlp().eval()
    optimized, report = run_compiled(model, (torch.randn(4, 8),))
    assert report.running_ops == report.total_ops > 0, str(report)
    said = _calls(optimized, [torch.randn(2, 8), torch.randn(2, 8), torch.randn(3, 8)])
    assert len(said) == 1, said  # one kind of reason: the size of dim 0
    assert "input guard" in said[0] and "size of dim 0 is 2, expected 4" in said[0]
    assert "Config(dynamic=True)" in said[0]
    report = blade.report(optimized)
    assert report.running_ops == 0 and report.compiled_ops == report.total_ops, str(report)
    text = str(report)
    assert "running compiled now: 0 (0.0%)" in text, text
    assert report.fallback_reasons == {
        "input guard: input 0 ('x'): size of dim 0 is 2, expected 4 "
        "(optimized for float32[4,8])": 3}, report.fallback_reasons
    # A call like the example runs compiled again, and the headline says so.
    assert _calls(optimized, [torch.randn(4, 8)]) == []
    report = blade.report(optimized)
    assert report.running_ops == report.total_ops, str(report)


def test_a_static_dim_of_a_dynamic_compile_is_not_told_to_go_dynamic():
    """Optimized with dynamic shapes from a batch of one (the length dynamic), the batch
    stays static: the fix is another example or dynamic_dims, not Config(dynamic=True)."""
    model = Mlp().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", blade.DynamicShapesWarning)
        optimized = blade.optimize(model, (torch.randn(1, 5, 8),), blade.Config(dynamic=True))
    assert blade.report(optimized).guard_specs == "float32[1,s0,8]"
    said = _calls(optimized, [torch.randn(3, 5, 8)])
    assert len(said) == 1 and "size of dim 0 is 3, expected 1" in said[0], said
    assert "stayed static" in said[0] and "Config(dynamic_dims=...)" in said[0], said
    assert "Optimize with Config(dynamic=True)" not in said[0], said


def test_each_kind_of_reason_is_said_once_with_its_own_fix():
    model = Mlp().eval()
    optimized, _ = run_compiled(model, (torch.randn(4, 8),))
    said = _calls(optimized, [torch.randn(4, 8, dtype=torch.float64),
                              torch.randn(4, 8, dtype=torch.float64), torch.randn(2, 4, 8),
                              torch.randn(4, 8, dtype=torch.float64)])
    assert len(said) == 2, said
    assert "dtype is float64, expected float32" in said[0] and "Cast the input" in said[0]
    assert "rank is 3, expected 2" in said[1] and "inputs of the example inputs' rank" in said[1]


def test_an_engine_that_runs_its_subgraph_says_why():
    model = Mlp().eval()
    x = torch.randn(4, 8)
    optimized, _ = run_compiled(model, (x,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            optimized(x.clone().requires_grad_())  # grad mode on: no compiled gradients
    said = _blade_warnings(caught)
    assert len(said) == 1 and "engine 'blade_engine_0'" in said[0], said
    assert "torch.no_grad()" in said[0]
    report = blade.report(optimized)
    assert report.running_ops == 0 and report.clusters[0].fallbacks == 2, str(report)
    assert list(report.fallback_reasons.values()) == [2], report.fallback_reasons


def test_warnings_are_python_warnings_that_filters_control(tmp_path):
    model = torch.jit.script(Mlp().eval())
    saved = tmp_path / "model.pt"
    torch.jit.save(blade.optimize(model, (torch.randn(4, 8),)), str(saved))
    script = textwrap.dedent(f"""
        import warnings, torch, blade
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        model = torch.jit.load({str(saved)!r})
        with torch.no_grad():
            model(torch.randn(2, 8))
        print("ran")
    """)
    loud = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", script],
                          capture_output=True, text=True)
    assert loud.returncode != 0 and "size of dim 0 is 2" in loud.stderr, loud.stderr
    quiet = subprocess.run([sys.executable, "-W", "error::UserWarning", "-W",
                            "ignore:blade:UserWarning", "-c", script],
                           capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stdout.strip() == "ran", quiet.stderr
    assert "blade:" not in quiet.stderr


def test_the_report_names_the_cpu_features_the_code_needs():
    optimized, _ = run_compiled(Mlp().eval(), (torch.randn(4, 8),))
    report = blade.report(optimized)
    needed = optimized.blade_engine_0.cpu_features()
    assert needed and report.clusters[0].cpu_features == needed
    assert f"code compiled for CPU features: {needed}" in str(report)
    assert needed in report.to_json()  # and so in `blade report --json`
