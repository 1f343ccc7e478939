"""Config.check_engines: every engine is compared with its cluster's TorchScript subgraph on
the example run's inputs before it replaces the cluster; one that disagrees is refused, the
node to blame found by bisection and left in TorchScript, the rest compiled again."""
import pytest
import torch

import blade
from blade.self_check import disagreement
from helpers import Lambda, assert_same

TRACE = blade.Config(allow_tracing=True)


def double_it(ctx):
    """A deliberately wrong relu: 2 * x."""
    x = ctx.operands[0]
    return ctx.op("stablehlo.add", [x, x])


def chain(x):
    y = torch.tanh(x * 1.5) + 0.25
    y = torch.relu(y - 0.5)
    return torch.sigmoid(y * 3.0) - y


@pytest.fixture
def wrong_relu():
    converter = blade.register_converter("aten::relu", priority=100)(double_it)
    yield
    blade.unregister_converter(converter)


def test_a_wrong_converter_is_caught_and_only_its_op_falls_back(wrong_relu):
    x = torch.randn(16, 32)
    optimized = blade.optimize(Lambda(chain), (x,), TRACE)
    assert_same(optimized(x), chain(x))
    report = blade.report(optimized)
    assert len(report.compile_errors) == 1, str(report)
    assert "disagrees with TorchScript" in report.compile_errors[0], str(report)
    assert "left in TorchScript: aten::relu" in report.compile_errors[0], str(report)
    # Bisection blamed the relu alone: every other op is compiled, in engines that ran.
    assert list(report.unsupported) == ["aten::relu"], str(report)
    assert "disagrees with TorchScript" in report.unsupported["aten::relu"].reasons[0]
    assert report.compiled_ops == report.total_ops - 1, str(report)
    assert report.clusters and all(c.compiled and c.calls == 1 for c in report.clusters), \
        str(report)
    # The bisection's prefix engines are none of the model's: no engine shares their code.
    assert not any("_prefix" in c.code for c in report.clusters), str(report)
    assert report.runtime_fallbacks == 0, str(report)
    assert report.checked_engines >= 2 and report.check_seconds > 0, str(report)
    # The first engine, of the whole model, was compared with the results of the run that
    # recorded the types; the disagreement was caught there.
    assert report.examples_from_type_run >= 1, str(report)


def test_without_the_check_the_wrong_code_would_run(wrong_relu):
    x = torch.randn(16, 32)
    config = blade.Config(allow_tracing=True, check_engines=False)
    optimized = blade.optimize(Lambda(chain), (x,), config)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and not report.compile_errors, str(report)
    assert report.checked_engines == 0
    assert not torch.allclose(optimized(x), chain(x))


def test_engines_that_agree_are_all_checked_and_kept():
    x = torch.randn(16, 32)
    optimized = blade.optimize(Lambda(chain), (x,), TRACE)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and not report.compile_errors, str(report)
    assert report.checked_engines == len(report.clusters) == 1, str(report)
    assert "engines checked against TorchScript" in str(report)
    # Compiled whole: its example is the run that recorded the types, not a run of its own.
    assert report.examples_from_type_run == 1, str(report)
    assert "compared with the results of the run that recorded the types" in str(report)
    assert_same(optimized(x), chain(x))


def test_a_cluster_reading_an_input_written_before_it_has_an_example_run_of_its_own():
    """The model writes into its input before the cluster reads it: the cluster's inputs are
    not the example inputs, so its example comes from the capture run, and the engine
    agrees (an example taken from the example inputs would have refused it)."""
    class WritesFirst(torch.nn.Module):
        def forward(self, x):
            # Scripted: the ops below read the same value, %x, that add_ wrote.
            x.add_(1.0)
            return torch.tanh(x) * 2.0 + x

    x = torch.randn(16, 32)
    model = WritesFirst()
    optimized = blade.optimize(model, (x.clone(),))
    report = blade.report(optimized)
    assert not report.compile_errors and report.checked_engines == 1, str(report)
    assert report.examples_from_type_run == 0, str(report)
    assert_same(optimized(x.clone()), model(x.clone()))


class BranchOnValues(torch.nn.Module):
    """A compiled chain in the branch of a data-dependent `if` that the example takes (as
    nn.TransformerEncoderLayer leaves its slow path), or in such a branch inside a loop."""

    def __init__(self, loop: bool):
        super().__init__()
        self.loop = loop

    def forward(self, x):
        if self.loop:
            for _ in range(int(x.abs().sum() > 0) + 1):
                if x.sum() > -1e9:
                    x = torch.tanh(x) * 2.0 + x
                else:
                    x = x - 1.0
            return x
        if x.sum() > -1e9:
            return torch.tanh(x) * 2.0 + x
        return x - 1.0


@pytest.mark.parametrize("loop", [False, True])
def test_a_cluster_in_the_branch_taken_has_its_example_from_the_type_run(monkeypatch, loop):
    """Returned by an If's branch that the graph returns: the type run's results are the
    chain's. In a loop's body they are not (the loop returns its last iteration's, and a
    data-dependent trip count keeps it a loop): the example run records it."""
    captures = _recording_captures(monkeypatch)
    x = torch.randn(16, 32)
    model = BranchOnValues(loop)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    report = assert_ran_compiled_on(optimized, model, x)
    # The chain and the condition (whose result the graph does not return: it always needs
    # the example run), and in the loop the trip count's test.
    assert report.checked_engines == len(report.clusters) == (3 if loop else 2), str(report)
    assert report.examples_from_type_run == (0 if loop else 1), str(report)
    assert sum(c["clusters"] for c in captures) == len(report.clusters) - \
        report.examples_from_type_run, captures


class ReturnedByOneBranch(torch.nn.Module):
    """relu(x) is computed before the `if` and returned by the branch the example does not
    take: the If's result in the type run is x, not the cluster's."""

    def forward(self, x, c):
        y = torch.relu(x)
        if bool(c):
            return y
        return x


def test_a_value_defined_outside_the_branch_that_returns_it_gets_an_example_run(wrong_relu):
    x = torch.randn(16, 32)
    model = ReturnedByOneBranch()
    optimized = blade.optimize(model, (x, torch.tensor(False)), blade.Config(cache_dir="off"))
    report = blade.report(optimized)
    assert report.examples_from_type_run == 0, str(report)
    assert "left in TorchScript: aten::relu" in report.compile_errors[0], str(report)
    with torch.no_grad():
        assert_same(optimized(x, torch.tensor(True)), model(x, torch.tensor(True)))


class ComputedBeforeTheBranch(torch.nn.Module):
    """The chain is computed before the `if` and returned by one branch; the other branch
    computes its own result (as nn.TransformerEncoderLayer returns its slow path's result
    from one branch and its fast path's from the other)."""

    def forward(self, x, c):
        y = torch.relu(torch.tanh(x) * 2.0 - 0.5)
        if bool(c):
            return y
        return torch.sigmoid(x) * 3.0


@pytest.mark.parametrize("taken", [True, False])
def test_a_value_returned_by_the_only_branch_that_ran_has_its_example_from_the_type_run(
        monkeypatch, taken):
    """The other branch made no tensor in the type run, so the branch returning the chain's
    value ran and the If's result is the chain's: no example run. When the example takes
    the other branch, that branch's own engine is compared with the result, and the chain,
    whose value is no result then, is recorded by an example run."""
    captures = _recording_captures(monkeypatch)
    x = torch.randn(16, 32)
    model = ComputedBeforeTheBranch()
    optimized = blade.optimize(model, (x, torch.tensor(taken)), blade.Config(cache_dir="off"))
    report = blade.report(optimized)
    assert not report.compile_errors and report.examples_from_type_run == 1, str(report)
    assert report.checked_engines == len(report.clusters) == (1 if taken else 2), str(report)
    assert sum(c["clusters"] for c in captures if c["ran"]) == (0 if taken else 1), captures
    with torch.no_grad():
        for flag in (True, False):
            assert_same(optimized(x, torch.tensor(flag)), model(x, torch.tensor(flag)))


def test_a_wrong_converter_is_caught_against_the_result_of_the_branch_that_ran(wrong_relu):
    x = torch.randn(16, 32)
    model = ComputedBeforeTheBranch()
    optimized = blade.optimize(model, (x, torch.tensor(True)), blade.Config(cache_dir="off"))
    report = blade.report(optimized)
    assert report.examples_from_type_run >= 1, str(report)
    assert "left in TorchScript: aten::relu" in report.compile_errors[0], str(report)
    with torch.no_grad():
        for flag in (True, False):
            assert_same(optimized(x, torch.tensor(flag)), model(x, torch.tensor(flag)))


def test_transformer_encoder_layer_is_checked_against_the_type_run(monkeypatch):
    """Its slow path, compiled whole, is returned by the branch the fast path's test leaves
    to it: its check needs no TorchScript run of its own."""
    captures = _recording_captures(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(2, 10, 64)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    report = assert_ran_compiled_on(optimized, model, x)
    assert report.checked_engines == 1 and report.examples_from_type_run == 1, str(report)
    assert not any(c["ran"] for c in captures), captures


class WrittenAfterTheBranch(torch.nn.Module):
    """The If's result, the chain's, is scaled in place before it is returned: what the
    graph returned is not what the chain gave."""

    def forward(self, x, c):
        if bool(c):
            y = torch.tanh(x) * 2.0 + x
        else:
            y = x
        y.mul_(3.0)
        return y


def test_an_if_result_written_after_the_branch_gets_an_example_run():
    x = torch.randn(16, 32)
    model = WrittenAfterTheBranch()
    optimized = blade.optimize(model, (x, torch.tensor(True)), blade.Config(cache_dir="off"))
    report = blade.report(optimized)
    assert not report.compile_errors and report.checked_engines >= 1, str(report)
    assert report.examples_from_type_run == 0, str(report)
    with torch.no_grad():
        assert_same(optimized(x.clone(), torch.tensor(True)), model(x.clone(),
                                                                    torch.tensor(True)))


class BranchOnSize(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] > 4:
            return torch.relu(x) * 2.0   # only the resized inputs of dynamic dims take it
        return x * 1.0


def test_with_dynamic_dims_a_branch_with_types_may_not_have_run():
    """Resized inputs record types in branches the example did not take: the If's result
    in the example run is the other branch's, so no example comes from there."""
    x = torch.randn(4, 8)
    model = BranchOnSize()
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off", dynamic=True))
    report = blade.report(optimized)
    assert not report.compile_errors and report.examples_from_type_run == 0, str(report)
    # The branch's engine: the example run never reaches it, so it is not checked, and the
    # report says so.
    assert report.engines_not_reached_by_the_check == 1, str(report)
    assert "engines not checked: 1" in str(report)
    with torch.no_grad():
        for rows in (4, 9):
            xi = torch.randn(rows, 8)
            assert_same(optimized(xi), model(xi))


def assert_ran_compiled_on(optimized, model, x):
    with torch.no_grad():
        assert_same(optimized(x), model(x))
    report = blade.report(optimized)
    assert not report.compile_errors and all(c.compiled and c.calls > 0
                                             for c in report.clusters), str(report)
    return report


@pytest.mark.parametrize("got, want, agrees", [
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-5]), True),
    (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), False),
    # the tolerance scales with the output's largest value
    (torch.tensor([1000.0, 0.0]), torch.tensor([1000.0, 0.05]), True),
    (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]), True),
    (torch.tensor([1.0, float("nan")]), torch.tensor([float("nan"), 1.0]), False),
    (torch.tensor([float("inf")]), torch.tensor([float("-inf")]), False),
    (torch.tensor([1, 2]), torch.tensor([1, 3]), False),
    (torch.tensor([True]), torch.tensor([True]), True),
    (torch.zeros(2, 3), torch.zeros(3, 2), False),
    (torch.zeros(2, dtype=torch.float64), torch.zeros(2), False),
    (torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0 + 1e-6], dtype=torch.float64),
     False),
])
def test_disagreement_by_dtype(got, want, agrees):
    assert (disagreement([got], [want]) is None) == agrees


def _large(changes=()):
    """Ramp values over more than two of the check's chunks, with `changes` made."""
    t = torch.linspace(-4.0, 4.0, (1 << 23) + 5)
    for index, value in changes:
        t[index] = value
    return t


@pytest.mark.parametrize("changes, agrees", [
    ((), True),
    (((-1, 100.0),), False),                    # in the last, partial chunk
    (((1 << 22, float("nan")),), False),        # the first of the second chunk
    (((3, float("inf")),), False),
    (((-2, 4.0 + 1e-6),), True),                # within float32's tolerance
], ids=["same", "last-chunk", "nan", "inf", "within"])
def test_disagreement_of_outputs_larger_than_a_chunk(changes, agrees):
    found = disagreement([_large(changes)], [_large()])
    assert (found is None) == agrees, found
    if changes and not agrees and changes[0][1] == 100.0:
        assert "max abs diff 96" in found, found


def test_engines_running_checked_code_are_not_run_again():
    """Three clusters of the same ops on the same types share one compiled code: the first
    engine is compared, the other two run code that just agreed on its own inputs."""
    def blocks(x):
        for _ in range(3):
            x = torch.sin(torch.tanh(x * 1.5) + 1.0)   # sin stays TorchScript below
        return x

    x = torch.randn(8, 16)
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::sin"])
    optimized = blade.optimize(Lambda(blocks), (x,), config)
    report = blade.report(optimized)
    assert len(report.clusters) == 3 and not report.compile_errors, str(report)
    assert report.checked_engines == 1 and report.engines_sharing_checked_code == 2, \
        str(report)
    assert "; 2 more engines run code already checked in this optimize" in str(report)
    assert_same(optimized(x), blocks(x))


def _recording_captures(monkeypatch):
    """Wraps self_check's capture_cluster_examples: records, per capture prepared, how
    many clusters it records and whether it ran."""
    import blade.self_check

    captures = []
    real = blade.self_check.capture_cluster_examples

    def capture(module, graph, clusters, inputs):
        run = real(module, graph, clusters, inputs)
        entry = {"clusters": len(clusters), "ran": False}
        captures.append(entry)

        def recorded():
            entry["ran"] = True
            return run()
        return recorded

    monkeypatch.setattr(blade.self_check, "capture_cluster_examples", capture)
    return captures


def test_repeated_clusters_are_recorded_only_when_their_code_is_new(monkeypatch):
    """The example run records the first of three repeated clusters and stops there; the
    other two run checked code, so the run prepared for them never runs."""
    captures = _recording_captures(monkeypatch)

    def blocks(x):
        x = torch.cos(x)   # the first cluster reads no graph input: it needs a capture
        for _ in range(3):
            x = torch.sin(torch.tanh(x * 1.5) + 1.0)
        return x

    x = torch.randn(8, 16)
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::sin", "aten::cos"])
    optimized = blade.optimize(Lambda(blocks), (x,), config)
    report = blade.report(optimized)
    assert len(report.clusters) == 3 and not report.compile_errors, str(report)
    assert report.checked_engines == 1 and report.engines_sharing_checked_code == 2, \
        str(report)
    # The deferred run is prepared first, then the one of the new kinds.
    assert captures == [{"clusters": 2, "ran": False}, {"clusters": 1, "ran": True}]
    assert_same(optimized(x), blocks(x))


def test_a_cluster_taken_for_a_repeat_is_still_checked_when_its_code_differs(
        monkeypatch, wrong_relu):
    """Every cluster is taken for a repeat of the first (its record deferred); the second
    compiles to other code, so the deferred run records it and the check catches the wrong
    relu there."""
    import blade.self_check

    monkeypatch.setattr(blade.self_check, "repetition_key", lambda cluster: "same")
    captures = _recording_captures(monkeypatch)

    def two(x):
        x = torch.tanh(torch.cos(x) * 1.5) + 1.0
        return torch.relu(torch.sin(x) - 0.5) * 2.0

    x = torch.randn(8, 16)
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::sin", "aten::cos"])
    optimized = blade.optimize(Lambda(two), (x,), config)
    assert_same(optimized(x), two(x))
    report = blade.report(optimized)
    assert captures[:2] == [{"clusters": 1, "ran": True}, {"clusters": 1, "ran": True}], \
        captures   # the deferred run (of the second cluster) ran too
    assert set(report.unsupported) == {"aten::relu", "aten::sin", "aten::cos"}, str(report)
    assert "disagrees with TorchScript" in report.unsupported["aten::relu"].reasons[0]


def test_repeated_layers_of_a_traced_model_with_small_weights_are_repeats(monkeypatch):
    """The key of a repeat is blind to the scopes of tracing and to the values of a tensor
    constant, however few (a bias of 8 prints its values in TorchScript's text)."""
    captures = _recording_captures(monkeypatch)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.sin(torch.tanh(self.linear(x)))   # sin stays TorchScript below

    model = torch.nn.Sequential(Layer(), Layer(), Layer()).eval()
    x = torch.randn(4, 8)
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::sin"])
    optimized = blade.optimize(model, (x,), config)
    report = blade.report(optimized)
    assert len(report.clusters) == 3 and not report.compile_errors, str(report)
    assert report.checked_engines == 1 and report.engines_sharing_checked_code == 2, \
        str(report)
    assert sorted(c["clusters"] for c in captures) == [1, 2], captures
    assert not any(c["ran"] for c in captures if c["clusters"] == 2), captures
    with torch.no_grad():
        assert_same(optimized(x), model(x))


def test_a_failing_deferred_run_leaves_its_clusters_in_torchscript(monkeypatch):
    """The second run fails once: every cluster that needed it stays TorchScript with that
    error, none runs unchecked, and the run is not tried again."""
    import blade.self_check

    monkeypatch.setattr(blade.self_check, "repetition_key", lambda cluster: "same")
    real = blade.self_check.capture_cluster_examples
    runs = []

    def capture(module, graph, clusters, inputs):
        run = real(module, graph, clusters, inputs)
        if len(clusters) == 1:
            return run

        def failing():
            runs.append(len(clusters))
            raise RuntimeError("the example run failed")
        return failing

    monkeypatch.setattr(blade.self_check, "capture_cluster_examples", capture)

    def three(x):
        x = torch.tanh(torch.cos(x) * 1.5) + 1.0
        x = torch.relu(torch.sin(x) - 0.5) * 2.0
        return torch.sigmoid(torch.cos(x)) * 3.0

    x = torch.randn(8, 16)
    config = blade.Config(allow_tracing=True, excluded_ops=["aten::sin", "aten::cos"])
    optimized = blade.optimize(Lambda(three), (x,), config)
    assert_same(optimized(x), three(x))
    report = blade.report(optimized)
    assert runs == [2], runs
    failed = [e for e in report.compile_errors if "the example run failed" in e]
    assert len(failed) == 2, str(report)
    assert report.checked_engines == 1, str(report)
