"""The runtime: run-time fallback, fallback='error', input layouts, memory ownership."""
import gc

import pytest
import torch

import blade
from blade import _C
from helpers import assert_same


class Chain(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x * y + 1.0).sum(dim=-1), torch.sigmoid(x) - y


def optimize_chain(config=None):
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randn(8)
    return blade.optimize(Chain(), (x, y), config), x, y


def engine_of(module):
    return getattr(module, blade.report(module).clusters[0].name)


def test_wrong_shape_dtype_or_rank_runs_the_unspecialized_model():
    optimized, x, y = optimize_chain()
    cases = [
        (torch.randn(3, 8), y),                      # static dim differs
        (torch.randn(2, 4, 8), y),                   # rank differs
        (torch.randn(4, 8, dtype=torch.float64), y.double()),  # dtype differs
    ]
    for inputs in cases:
        assert_same(optimized(*inputs), Chain()(*inputs))
    report = blade.report(optimized)
    assert report.guard_fallbacks == len(cases) == report.runtime_fallbacks, str(report)
    assert "dtype is float64, expected float32" in report.guard_status
    assert all(c.calls == 0 for c in report.clusters)  # the guard kept them out
    # Matching inputs still run the compiled code.
    assert_same(optimized(x, y), Chain()(x, y))
    report = blade.report(optimized)
    assert report.guard_calls == len(cases) + 1
    assert all(c.fallbacks == 0 and c.calls == 1 for c in report.clusters)


def test_an_engine_given_other_inputs_runs_its_subgraph():
    optimized, x, y = optimize_chain()
    engine = engine_of(optimized)
    wrong = [torch.randn(3, 8), y]
    expected = engine.run_subgraph(wrong)
    assert_same(engine.execute(wrong), expected)
    assert engine.fallbacks() == 1
    assert "size of dim 0 is 3, expected 4" in engine.last_fallback_reason()


def test_fallback_error_mode_names_the_inputs_and_signatures():
    optimized, x, y = optimize_chain(blade.Config(fallback="error"))
    with pytest.raises(RuntimeError) as info:
        optimized(torch.randn(5, 8), y)
    message = str(info.value)
    assert "optimized for (float32[4,8];float32[8])" in message      # expected signature
    assert "got (float32[5,8];float32[8])" in message                 # actual signature
    assert "size of dim 0 is 5, expected 4" in message
    # An engine in error mode raises naming itself.
    with pytest.raises(RuntimeError) as info:
        engine_of(optimized).execute([torch.randn(5, 8), y])
    assert "blade_engine_0" in str(info.value)
    assert "size of dim 0 is 5, expected 4" in str(info.value)


def test_non_contiguous_and_aliasing_inputs():
    optimized, x, y = optimize_chain()
    wide = torch.randn(8, 4).t()  # non-contiguous view of the right shape
    assert not wide.is_contiguous()
    assert_same(optimized(wide, y), Chain()(wide, y))
    same = torch.randn(8, 8)
    row = same[0]
    assert_same(optimized(same[:4], row), Chain()(same[:4], row))  # inputs alias each other
    assert blade.report(optimized).runtime_fallbacks == 0


class LinearChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x, y):
        return torch.relu(self.fc(x)) * torch.sigmoid(y) + x.sum(dim=1, keepdim=True)


def test_zero_size_inputs():
    torch.manual_seed(0)
    model = LinearChain().eval()
    empty = (torch.randn(0, 8), torch.randn(0, 16))
    # Compiled for an empty batch: the code (library matmul included) runs on it.
    optimized = blade.optimize(model, empty)
    result = optimized(*empty)
    assert result.shape == (0, 16)
    assert_same(result, model(*empty))
    report = blade.report(optimized)
    assert report.coverage == 1.0 and report.clusters[0].calls == 1, str(report)
    assert report.runtime_fallbacks == 0, str(report)
    # Compiled for batch 4, called with an empty batch: the unspecialized model runs.
    optimized = blade.optimize(model, (torch.randn(4, 8), torch.randn(4, 16)))
    assert_same(optimized(*empty), model(*empty))
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 1
    assert "input 0: size of dim 0 is 0, expected 4" in report.guard_status


def test_outputs_own_their_memory_and_intermediates_are_freed():
    optimized, x, y = optimize_chain()
    before = _C.live_allocations()
    outputs = optimized(x, y)
    expected = Chain()(x, y)
    # Every buffer the code allocated was freed; what stays live is the outputs' blocks
    # (from the RAL's allocator, back to its cache when the caller frees them).
    assert _C.live_allocations() == before + len(outputs)
    del optimized
    gc.collect()
    assert_same(outputs, expected)  # outputs outlive the engine that produced them
    del outputs
    assert _C.live_allocations() == before


def test_engine_refuses_unloadable_code_and_falls_back():
    optimized, x, y = optimize_chain()
    engine = engine_of(optimized)
    expected = engine.execute([x, y])
    garbage = torch.zeros(64, dtype=torch.uint8)

    def signed(mode):  # signed, so that the loader itself gets to refuse the bytes
        fields = ("broken", garbage, engine.input_specs(), engine.output_specs(),
                  engine.fallback_ir(), [], mode, "")
        return fields + (_C.sign_engine(*fields, ""), "float32")

    broken = torch.classes.blade.Engine(*signed("fallback"))
    assert not broken.is_compiled()
    assert "could not be loaded" in broken.load_error()
    assert_same(broken.execute([x, y]), expected)
    assert broken.fallbacks() == 1
    with pytest.raises(RuntimeError, match="cannot run its compiled code"):
        torch.classes.blade.Engine(*signed("error"))


def test_inputs_that_require_grad_run_the_subgraph_autograd_follows():
    """The compiled code records nothing for autograd: under grad mode an input that
    requires grad runs the subgraph, so outputs carry grad_fn and gradients equal eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()
    x = torch.randn(4, 16)
    optimized = blade.optimize(model, (x,))
    compiled_input = x.clone().requires_grad_()
    out = optimized(compiled_input)
    assert out.grad_fn is not None
    out.sum().backward()
    eager_input = x.clone().requires_grad_()
    model(eager_input).sum().backward()
    torch.testing.assert_close(compiled_input.grad, eager_input.grad)
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 1 and "requires grad" in report.clusters[0].status
    # Without grad mode the compiled code runs, whatever requires_grad says.
    with torch.no_grad():
        assert_same(optimized(compiled_input), model(x))
    assert blade.report(optimized).runtime_fallbacks == 1
    strict = blade.optimize(model, (x,), blade.Config(fallback="error"))
    with pytest.raises(RuntimeError, match="requires grad under grad mode"):
        strict(x.clone().requires_grad_())
