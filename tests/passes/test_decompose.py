"""Decompositions: the C++ pass that inlines them, Blade's own (logsumexp), and
`blade.register_decomposition` for aten and torch.library ops."""
from typing import List

import pytest
import torch
from torch.testing import FileCheck

import blade
from blade import _C
from blade.quiet import quiet_torchscript
from blade.frontend.decompositions import DecompositionError, active
from helpers import Lambda, assert_same, run_compiled

TRACE = blade.Config(allow_tracing=True)

LIB = torch.library.Library("blade_test_decomp", "DEF")
LIB.define("softplus2(Tensor x, float beta) -> Tensor")
LIB.define("halves(Tensor x) -> (Tensor, Tensor)")


@torch.library.impl(LIB, "softplus2", "CPU")
def _softplus2(x, beta):
    return torch.nn.functional.softplus(x, beta)


@torch.library.impl(LIB, "halves", "CPU")
def _halves(x):
    return x * 0.5, x - x * 0.5


def logsumexp_graph(keepdim: bool):
    def fn(x):
        return torch.logsumexp(x, dim=[1], keepdim=keepdim) * 2
    with quiet_torchscript():
        scripted = torch.jit.trace(Lambda(fn), (torch.randn(3, 4),))
        return torch.jit.freeze(scripted.eval())


@pytest.mark.parametrize("keepdim", [False, True])
def test_pass_inlines_the_body_and_computes_the_same(keepdim):
    module = logsumexp_graph(keepdim)
    graph = module.graph.copy()
    FileCheck().check("aten::logsumexp").run(str(graph))
    assert _C.decompose(graph, "aten::logsumexp", active()["aten::logsumexp"].graph) == 1
    torch._C._jit_pass_constant_propagation(graph)
    FileCheck().check_not("aten::logsumexp").check("aten::amax").check("aten::exp") \
        .check("aten::sum").check("aten::log").run(str(graph))
    with quiet_torchscript():
        function = torch._C._create_function_from_graph("f", graph)
    for x in (torch.randn(3, 4), torch.randn(5, 7) * 50):
        assert_same(function(module._c, x), module(x))


def test_logsumexp_infinities_match_eager():
    x = torch.randn(4, 6)
    x[0] = float("-inf")
    x[1, 2] = float("inf")
    x[2, :3] = float("-inf")
    model = Lambda(lambda x: torch.logsumexp(x * 1, dim=1))
    optimized, report = run_compiled(model, (x,), TRACE)
    assert report.decomposed == {"aten::logsumexp": 1}
    assert "decomposed: aten::logsumexp x1" in str(report)


def test_user_decomposition_of_a_custom_op_is_compiled():
    @blade.register_decomposition("blade_test_decomp::softplus2")
    def softplus2(x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.log1p(torch.exp(x * beta)) / beta

    try:
        model = Lambda(lambda x: torch.ops.blade_test_decomp.softplus2(x * 1, 2.0) + 1)
        x = torch.randn(8, 16)
        optimized, report = run_compiled(model, (x,), TRACE)
        assert report.coverage == 1.0, str(report)
        assert report.decomposed == {"blade_test_decomp::softplus2": 1}
    finally:
        blade.unregister_decomposition("blade_test_decomp::softplus2")
    report = blade.report(blade.optimize(model, (x,), TRACE))
    assert "blade_test_decomp::softplus2" in report.unsupported, str(report)


def test_user_decomposition_with_several_results():
    @blade.register_decomposition("blade_test_decomp::halves")
    def halves(x: torch.Tensor):
        half = x * 0.5
        return half, x - half

    try:
        def fn(x):
            a, b = torch.ops.blade_test_decomp.halves(x)
            return a * b
        optimized, report = run_compiled(Lambda(fn), (torch.randn(5, 3),), TRACE)
        assert report.decomposed == {"blade_test_decomp::halves": 1}
        assert report.coverage == 1.0, str(report)
    finally:
        blade.unregister_decomposition("blade_test_decomp::halves")


def test_user_decomposition_replaces_blades_own_and_may_call_the_op_itself():
    @blade.register_decomposition("aten::logsumexp")
    def logsumexp(x: torch.Tensor, dim: List[int], keepdim: bool) -> torch.Tensor:
        # Calls the op it decomposes: the pass must not rewrite its own output again.
        return torch.logsumexp(x * 1.0, dim, keepdim) + 0.0

    try:
        model = Lambda(lambda x: torch.logsumexp(x, dim=[0]) * 3)
        # Kept out of kernel calls: the op itself then stays TorchScript, as the check reads.
        optimized = blade.optimize(model, (torch.randn(3, 4),),
                                   blade.Config(allow_tracing=True, kernel_calls=False))
        FileCheck().check("aten::logsumexp").run(str(optimized.graph))
        # The op still runs (inside the wrapper): the report does not count it decomposed.
        assert blade.report(optimized).decomposed == {}
    finally:
        blade.unregister_decomposition("aten::logsumexp")
    assert active()["aten::logsumexp"].builtin


def test_excluded_ops_are_not_decomposed():
    model = Lambda(lambda x: torch.logsumexp(x * 1, dim=1))
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::logsumexp"])
    report = blade.report(blade.optimize(model, (torch.randn(3, 4),), config))
    assert report.decomposed == {}
    assert report.unsupported["aten::logsumexp"].reasons == [
        "aten::logsumexp is in Config.excluded_ops"]


def test_decompositions_that_do_not_fit_the_op_are_refused_with_the_reason():
    with pytest.raises(DecompositionError, match="no op overload aten::logsumexp.bogus"):
        blade.register_decomposition("aten::logsumexp.bogus")(lambda x: x)
    with pytest.raises(DecompositionError, match="not an op name"):
        blade.register_decomposition("logsumexp")(lambda x: x)

    def too_few(x: torch.Tensor) -> torch.Tensor:
        return x
    with pytest.raises(DecompositionError, match="the op takes 2 arguments .x, beta., "
                                                 "the function takes 1"):
        blade.register_decomposition("blade_test_decomp::softplus2")(too_few)

    def wrong_type(x: torch.Tensor, beta: int) -> torch.Tensor:
        return x * beta
    with pytest.raises(DecompositionError, match="argument 1 'beta' of the op is float, but "
                                                 "the function's 'beta' takes int"):
        blade.register_decomposition("blade_test_decomp::softplus2")(wrong_type)

    def wrong_result(x: torch.Tensor, beta: float) -> int:
        return 1
    with pytest.raises(DecompositionError, match=r"the op returns \(Tensor\), the function "
                                                 "returns int"):
        blade.register_decomposition("blade_test_decomp::softplus2")(wrong_result)
    assert "blade_test_decomp::softplus2" not in active()


def test_every_builtin_decomposition_scripts_and_fits_its_op():
    """Blade's own are scripted on first use (optimize scripts only those its graph needs):
    each must still script and match its op's schema."""
    from blade.frontend.decompositions import _BUILTIN, _BUILTIN_DYNAMIC

    assert len(_BUILTIN) + len(_BUILTIN_DYNAMIC) > 40
    for overload, decomposition in {**_BUILTIN, **_BUILTIN_DYNAMIC}.items():
        assert decomposition.builtin
        assert isinstance(decomposition.graph, torch._C.Graph), overload
