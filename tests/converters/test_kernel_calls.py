"""Kernel calls: ops that nothing lowers to StableHLO run inside the engine as calls of
PyTorch's own kernel (blade/partition/kernel_calls.py, csrc/ral/kernel_calls.h), so the
cluster around them stays whole and the answer is eager's, random numbers included."""
import pytest
import torch

import blade
from blade.partition import kernel_calls
from helpers import Lambda, assert_ran_compiled, compiled_whole

DETERMINISTIC = {
    # Each op between computations that compile as loops.
    "median": lambda x: tuple(t * 1 for t in torch.median(torch.sin(x), dim=1)),
    "nanmedian_keepdim": lambda x: torch.nanmedian(x.abs(), 0, keepdim=True)[0] + 1,
    "cummax": lambda x: tuple(t * 1 for t in torch.cummax(x * 0.5, dim=2)),
    "mode": lambda x: torch.mode((x * 2).round(), 1)[0] + x[:, 0],
    "histc": lambda x: torch.histc(x.exp(), 5, 0, 3) + 1,
    "bessel_i1": lambda x: torch.special.i1(x * 2) - 1,
    # Two calls with three buffers each, of other dtypes (float32 in, float32 and int64 out;
    # int64 in and out): one RAL function serves both (kernel_calls.h).
    "dtypes_differ": lambda x: torch.cummax(x * 0.5, dim=2)[1].sum(2) +
    torch.mode((x * 2).round().long(), 2)[0],
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_ops_nothing_lowers_compile_whole_and_give_eagers_values(name):
    torch.manual_seed(0)
    x = torch.randn(3, 6, 7)
    # The kernel's results are eager's; the loops around it are within the usual tolerance.
    _, report = compiled_whole(DETERMINISTIC[name], (x,))
    assert len(report.clusters) == 1, str(report)
    assert report.clusters[0].kernel_calls >= 1, str(report)
    assert report.checked_engines == 1, str(report)


def random_fns():
    return {
        "rand_like": lambda x: torch.rand_like(x) * 3.0 - x,
        "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)) * x,
        "dropout": lambda x: torch.dropout(torch.tanh(x), 0.4, True).sum(-1),
        "normal_mix": lambda x: (torch.randn_like(x) + x.relu(),
                                 torch.randint(0, 10, (4, 5)).to(torch.float32) * 2),
    }


@pytest.mark.parametrize("name", sorted(random_fns()))
def test_random_numbers_are_eagers_own_from_the_same_seed(name):
    fn = random_fns()[name]
    x = torch.randn(4, 5)
    model = Lambda(fn)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        got = optimized(x)
        torch.manual_seed(seed)
        want = model(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            # Other draws would differ by ~1, not by the rounding of the loops around them.
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops, str(report)
    assert sum(c.kernel_calls for c in report.clusters) >= 1, str(report)
    # Checked too: the subgraph and the code ran from one state of the generator.
    assert report.checked_engines == len(report.clusters), str(report)


def test_random_draws_keep_the_graphs_order_across_engines():
    # The draws of three nodes, two of which could join one engine if the clusterer moved
    # the first past the second: which numbers each gets depends on their order.
    def fn(x):
        first = torch.rand_like(x)
        middle = torch.randn(x.shape[0], 3)
        last = torch.rand_like(x)
        return (first + x).exp() * last, middle.sum()

    x = torch.randn(6, 4)
    model = Lambda(fn)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    torch.manual_seed(3)
    got = optimized(x)
    torch.manual_seed(3)
    want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert_ran_compiled(optimized)


def test_optimize_leaves_the_generator_as_it_found_it():
    x = torch.randn(4, 5)
    torch.manual_seed(11)
    blade.optimize(Lambda(lambda t: torch.rand_like(t) + t), (x,),
                   blade.Config(allow_tracing=True))
    after = torch.rand(3)
    torch.manual_seed(11)
    assert torch.equal(after, torch.rand(3))


def test_saved_and_loaded_kernel_calls_run(tmp_path):
    fn = DETERMINISTIC["median"]
    x = torch.randn(3, 6, 7)
    optimized, _ = compiled_whole(fn, (x,))
    path = tmp_path / "median.pt"
    torch.jit.save(optimized, str(path))
    loaded = torch.jit.load(str(path))
    y = torch.randn(3, 6, 7)
    for got, want in zip(loaded(y), fn(y)):
        torch.testing.assert_close(got, want)
    assert_ran_compiled(loaded)


def _refused(x):
    return torch.nonzero(x), torch.empty_like(x), x.add_(1)


def test_refused_ops_say_why():
    graph = torch.jit.script(_refused).graph
    found = {n.kind(): kernel_calls.schema_refusal(n) for n in graph.nodes()
             if n.kind().startswith("aten::")}
    assert "depend on the values" in found["aten::nonzero"]
    assert "not a function" in found["aten::empty_like"]
    assert "writes into" in found["aten::add_"]


def test_a_dynamic_engine_leaves_the_op_to_torchscript():
    x = torch.randn(4, 6)
    model = Lambda(lambda t: torch.median(t.exp(), dim=1)[0] * 2)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True, dynamic=True))
    report = blade.report(optimized)
    reasons = report.unsupported["aten::median.dim"].reasons
    assert any("static sizes" in r or "no converter" in r for r in reasons), str(report)
    y = torch.randn(7, 6)
    torch.testing.assert_close(optimized(y), model(y))


def _reads_then_overwrites(op):
    def fn(x):
        a = x * 2
        values = op(a)
        # Written after the call reads it: the write must not reach the call's operand.
        b = torch.slice_scatter(a, torch.full((1, 6), 50.0), 0, 0, 1)
        return values * 1.0, b + 1
    return fn


@pytest.mark.parametrize("op", [lambda a: torch.median(a, dim=1)[0],
                                lambda a: torch.sort(a, dim=1)[0]], ids=["kernel_call", "sort"])
def test_a_buffer_written_after_the_call_is_read_before_the_write(op):
    # Without the engine check, which would refuse a wrong engine: the code itself is right.
    fn = _reads_then_overwrites(op)
    x = torch.randn(4, 6)
    model = Lambda(fn)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True,
                                                         check_engines=False))
    for got, want in zip(optimized(x), model(x)):
        torch.testing.assert_close(got, want)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops and report.clusters[0].library_calls == 1
