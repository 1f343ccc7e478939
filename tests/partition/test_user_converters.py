"""User converters: priority over built-ins, validators, dtype entries, broken converters."""
import torch

import blade
from helpers import Lambda, assert_same

TRACE = blade.Config(allow_tracing=True)
# What a refusal leaves to TorchScript when ops are not made kernel calls instead.
NO_KERNEL_CALLS = blade.Config(allow_tracing=True, kernel_calls=False)


def double_it(ctx):
    """Deliberately not relu: 2 * x, so a test can see which converter ran."""
    x = ctx.operands[0]
    return ctx.op("stablehlo.add", [x, x])


def compiled_result(x, config=TRACE):
    model = Lambda(lambda x: torch.relu(x) * 1.0)
    optimized = blade.optimize(model, (x,), config)
    report = blade.report(optimized)
    assert report.coverage == 1.0, str(report)
    return optimized(x)


def test_higher_priority_user_converter_replaces_the_builtin():
    x = torch.randn(4, 8)
    converter = blade.register_converter("aten::relu", priority=100)(double_it)
    try:
        # Unchecked: the engine check would refuse the wrong code (tests/test_self_check.py).
        unchecked = blade.Config(allow_tracing=True, check_engines=False)
        assert_same(compiled_result(x, unchecked), x * 2)
    finally:
        blade.unregister_converter(converter)
    assert_same(compiled_result(x), torch.relu(x))


def test_lower_priority_user_converter_loses_to_the_builtin():
    x = torch.randn(4, 8)
    converter = blade.register_converter("aten::relu", priority=-1)(double_it)
    try:
        assert_same(compiled_result(x), torch.relu(x))
    finally:
        blade.unregister_converter(converter)


def test_refusing_validator_hands_the_node_to_the_next_converter_or_reports_it():
    x = torch.randn(4, 8)
    converter = blade.register_converter(
        "aten::relu", capability_validator=lambda node: "refused by the test",
        priority=100)(double_it)
    try:
        # The built-in accepts what the user converter refuses.
        assert_same(compiled_result(x), torch.relu(x))
    finally:
        blade.unregister_converter(converter)

    converter = blade.register_converter(
        "aten::erfinv", capability_validator=lambda node: "refused by the test")(double_it)
    try:
        model = Lambda(lambda x: torch.erfinv(x * 0.5) + 1.0)
        report = blade.report(blade.optimize(model, (x,), NO_KERNEL_CALLS))
        assert report.unsupported["aten::erfinv"].reasons == ["aten::erfinv: refused by the test"]
        # By default the refused node is a call of PyTorch's own kernel instead.
        optimized = blade.optimize(model, (x,), TRACE)
        torch.testing.assert_close(optimized(x), model(x), equal_nan=True)
        assert "aten::erfinv" not in blade.report(optimized).unsupported
    finally:
        blade.unregister_converter(converter)


def test_user_converter_dtype_entry_is_enforced():
    converter = blade.register_converter("aten::erfinv", dtypes={"self": ("float64",)})(
        lambda ctx: ctx.op("chlo.erf_inv", ctx.operands))
    try:
        model = Lambda(lambda x: torch.erfinv(x * 0.5) + 1.0)
        report = blade.report(blade.optimize(model, (torch.rand(3, 4),), NO_KERNEL_CALLS))
        assert "dtype float32" in report.unsupported["aten::erfinv"].reasons[0]
    finally:
        blade.unregister_converter(converter)


def test_broken_user_converter_falls_back_with_its_name_in_the_report():
    def wrong_type(ctx):
        x = ctx.operands[0]
        return ctx.op("stablehlo.convert", [x], ctx.result_types[0].__class__.parse(
            "tensor<4x8xf64>"))

    converter = blade.register_converter("aten::relu", priority=100)(wrong_type)
    try:
        x = torch.randn(4, 8)
        model = Lambda(lambda x: torch.relu(x) * 2.0)
        optimized = blade.optimize(model, (x,), TRACE)
        report = blade.report(optimized)
        assert report.compile_errors and "wrong_type" in report.compile_errors[0]
        assert "expected ['tensor<4x8xf32>']" in report.compile_errors[0]
        # The failure names the relu: it stays TorchScript, the mul is compiled without it.
        assert "wrong_type" in report.unsupported["aten::relu"].reasons[0]
        assert [c.ops for c in report.clusters] == [{"aten::mul.Tensor": 1}]
        assert_same(optimized(x), model(x))
        assert blade.report(optimized).clusters[0].calls == 1
    finally:
        blade.unregister_converter(converter)


def test_register_converter_rejects_a_bad_schema_or_dtype():
    import pytest

    with pytest.raises(ValueError, match="not an op overload name"):
        blade.register_converter("relu")
    with pytest.raises(ValueError, match="unknown dtype"):
        blade.register_converter("aten::relu", dtypes={"*": ("float",)})
