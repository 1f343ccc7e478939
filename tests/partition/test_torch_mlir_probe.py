"""Ops with no converter of Blade's compile when Torch-MLIR lowers them for the node's types
and constants (blade.partition.torch_mlir_probe); what it cannot lower, or lowers wrongly,
stays TorchScript with the reason."""
import torch

import blade
from blade.frontend import decompositions
from blade.partition import torch_mlir_probe
from blade.partition.registry import REGISTRY
from helpers import Lambda, assert_ran_compiled, assert_same

TRACE = blade.Config(allow_tracing=True)


def optimized_report(fn, x):
    optimized = blade.optimize(Lambda(fn), (x,), TRACE)
    assert_same(optimized(x), fn(x))
    return optimized, blade.report(optimized)


def test_an_op_without_a_converter_compiles_when_torch_mlir_lowers_it():
    assert not REGISTRY.entries("aten::atan2") and not REGISTRY.entries("aten::logaddexp")
    fn = lambda x: torch.logaddexp(torch.atan2(x, x * x + 1.0), x)  # noqa: E731
    optimized, report = optimized_report(fn, torch.randn(8, 16))
    assert report.coverage == 1.0, str(report)
    assert_ran_compiled(optimized)


def test_an_op_torch_mlir_cannot_lower_stays_torchscript_with_the_reason():
    assert not REGISTRY.entries("aten::diagonal")
    _, report = optimized_report(lambda x: torch.diagonal(x) * 2.0, torch.randn(8, 8))
    reason = report.unsupported["aten::diagonal"].reasons[0]
    assert "no converter is registered for aten::diagonal, and Torch-MLIR does not lower it" \
        in reason, reason
    assert report.compiled_ops == report.total_ops - 1, str(report)


def test_a_wrong_lowering_by_torch_mlir_is_caught_by_the_engine_check(monkeypatch):
    # Torch-MLIR lowers a float remainder with the sign of the dividend (fmod); PyTorch's
    # takes the divisor's. Blade decomposes remainder (into fmod and a correction): without
    # that decomposition, the engine check refuses Torch-MLIR's lowering, and only it.
    assert not REGISTRY.entries("aten::remainder.Scalar")
    monkeypatch.delitem(decompositions._BUILTIN, "aten::remainder.Scalar")
    x = torch.randn(8, 8) * 10
    _, report = optimized_report(lambda t: torch.remainder(t, 3.0) * 2.0, x)
    reason = report.unsupported["aten::remainder.Scalar"].reasons[0]
    assert "disagrees with TorchScript" in reason, str(report)
    assert report.compiled_ops == report.total_ops - 1, str(report)


def test_each_case_is_asked_once(monkeypatch):
    asked = []
    lower_alone = torch_mlir_probe._lower_alone
    monkeypatch.setattr(torch_mlir_probe, "_lower_alone",
                        lambda node: asked.append(node.kind()) or lower_alone(node))
    monkeypatch.setattr(torch_mlir_probe, "_ANSWERS", {})
    fn = lambda x: torch.atan2(x, x + 1.0) + torch.atan2(x, x - 1.0)  # noqa: E731
    for _ in range(2):
        optimized_report(fn, torch.randn(4, 4))
    assert asked == ["aten::atan2"]
    # Another shape is another case.
    optimized_report(fn, torch.randn(4, 5))
    assert asked == ["aten::atan2", "aten::atan2"]


def writes_and_draws(x):
    return x.add_(1.0) + torch.rand_like(x)


def test_ops_that_write_or_draw_random_numbers_are_not_asked():
    graph = torch.jit.script(writes_and_draws).graph
    refusals = {n.kind(): torch_mlir_probe.probe_refusal(n) for n in graph.nodes()
                if n.kind() in ("aten::add_", "aten::rand_like")}
    assert refusals == {"aten::add_": "it writes into an operand",
                        "aten::rand_like": "it draws random numbers"}


def instance_norms(x, weight):
    return (torch.instance_norm(x, None, None, None, None, True, 0.1, 1e-5, False),
            torch.instance_norm(x, weight, weight, None, None, True, 0.1, 1e-5, False))


def test_an_instance_norm_without_a_weight_is_never_asked():
    """Torch-MLIR's conversion of it aborts the process (LLVM's "SmallVector unable to
    grow"); with a weight it converts."""
    graph = torch.jit.script(instance_norms).graph
    refusals = [torch_mlir_probe.probe_refusal(n) for n in graph.nodes()
                if n.kind() == "aten::instance_norm"]
    assert refusals == ["Torch-MLIR's StableHLO conversion aborts on aten::instance_norm "
                        "without a weight", None]
