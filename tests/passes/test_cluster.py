"""Clustering: no cycles, nested blocks, min size, excluded ops, compile-time fallback."""
import re

import pytest
import torch
from torch.testing import FileCheck

import blade
from helpers import (NO_KERNEL_CALLS, Lambda, assert_every_op_accounted_for,
                     assert_ran_compiled, assert_same, run_compiled)


class CycleProne(torch.nn.Module):
    """a (supported) -> topk (unsorted: unsupported) -> c (supported, also uses a): a and
    c must not share a cluster, or the cluster would depend on itself through topk."""

    def forward(self, x):
        a = torch.relu(x) * 2.0
        b = torch.topk(a, 3, dim=-1, sorted=False).values.sum(dim=-1, keepdim=True)
        return torch.sigmoid(a + b) * a


class Looped(torch.nn.Module):
    def forward(self, x, n: int):
        for _ in range(n):
            x = torch.tanh(x) * 0.5 + 1.0
        return x


class Chain3(torch.nn.Module):
    def forward(self, x):
        return torch.exp(x) * 2.0 + 1.0


def test_cycle_prone_graph_clusters_without_cycles():
    x = torch.randn(4, 8)
    optimized, report = run_compiled(CycleProne(), (x,), blade.Config(**NO_KERNEL_CALLS))
    assert len(report.clusters) == 2
    FileCheck().check("blade::execute").check("aten::topk").check("blade::execute").run(
        str(optimized.graph))


def test_nested_loop_body_is_clustered():
    x = torch.randn(4, 8)
    optimized, report = run_compiled(Looped(), (x, 3))
    FileCheck().check("prim::Loop").check("blade::execute").run(str(optimized.graph))
    assert report.clusters[0].calls == 3  # once per iteration


def test_min_cluster_size_counts_compute_ops():
    x = torch.randn(4, 8)
    # exp, mul, add: three compute ops.
    run_compiled(Chain3(), (x,), blade.Config(min_cluster_size=3))
    optimized = blade.optimize(Chain3(), (x,), blade.Config(min_cluster_size=4))
    report = blade.report(optimized)
    assert not report.clusters and report.compiled_ops == 0
    assert "fewer than min_cluster_size=4" in report.unsupported["aten::exp"].reasons[0]
    assert_same(optimized(x), Chain3()(x))


def test_excluded_ops_stay_in_torchscript():
    x = torch.randn(4, 8)
    optimized, report = run_compiled(Chain3(), (x,), blade.Config(excluded_ops=["aten::mul"]))
    assert "aten::mul.Scalar" in report.unsupported
    assert "excluded" in report.unsupported["aten::mul.Scalar"].reasons[0]
    FileCheck().check("aten::mul").run(str(optimized.graph))


def test_failing_cluster_falls_back_and_model_runs(monkeypatch):
    from blade.codegen import driver as codegen

    def broken(*args, **kwargs):
        raise codegen.CodegenError("stage linalg_to_llvm failed: injected by the test")

    monkeypatch.setattr(codegen, "start_compiling", broken)
    x = torch.randn(4, 8)
    optimized = blade.optimize(CycleProne(), (x,), blade.Config(**NO_KERNEL_CALLS))
    report = blade.report(optimized)
    assert not report.clusters and report.compiled_ops == 0
    assert len(report.compile_errors) == 2
    assert "injected by the test" in report.compile_errors[0]
    # An error that names no node leaves its whole cluster in TorchScript.
    assert "left in TorchScript" not in report.compile_errors[0]
    assert "blade::execute" not in str(optimized.graph)
    assert_same(optimized(x), CycleProne()(x))


def test_dry_run_reports_clusters_without_compiling(monkeypatch):
    from blade.codegen import driver as codegen

    def must_not_run(*args, **kwargs):
        raise AssertionError("dry_run compiled something")

    monkeypatch.setattr(codegen, "start_compiling", must_not_run)
    x = torch.randn(4, 8)
    optimized = blade.optimize(CycleProne(), (x,),
                               blade.Config(dry_run=True, **NO_KERNEL_CALLS))
    report = blade.report(optimized)
    assert report.dry_run and len(report.clusters) == 2
    assert report.compiled_ops == 0 and not any(c.compiled for c in report.clusters)
    assert "blade::execute" not in str(optimized.graph)
    assert_same(optimized(x), CycleProne()(x))


def test_twenty_thousand_node_graph_clusters_in_under_five_seconds(monkeypatch):
    import time

    from blade import _C

    class Long(torch.nn.Module):
        def forward(self, x):
            for i in range(20_000):
                x = torch.sin(x) if i % 3 == 0 else x * 1.0001
            return x

    seconds = []
    nodes = []
    original = _C.cluster_supported_nodes

    def timed(graph, *args):
        nodes.append(sum(1 for _ in graph.nodes()))
        start = time.perf_counter()
        result = original(graph, *args)
        seconds.append(time.perf_counter() - start)
        return result

    monkeypatch.setattr(_C, "cluster_supported_nodes", timed)
    optimized = blade.optimize(Long(), (torch.randn(4),),
                               blade.Config(allow_tracing=True, dry_run=True))
    assert nodes[0] >= 20_000
    assert seconds[0] < 5.0, f"clustering {nodes[0]} nodes took {seconds[0]:.2f} s"
    report = blade.report(optimized)
    assert len(report.clusters) == 1 and report.clusters[0].ops["aten::sin"] == 6667


class WriteThroughView(torch.nn.Module):
    def forward(self, x):
        y = x * 2.0
        # A write through a view of a value computed by a cluster (a step of 2: the
        # write is not made functional, the mutation stays in TorchScript).
        y[:, 1::2] = 0.0
        return torch.sigmoid(y) + x


def test_view_of_a_cluster_output_stays_outside_so_writes_through_it_are_seen():
    x = torch.randn(4, 6)
    optimized, report = run_compiled(WriteThroughView(), (x,))
    # The slice that is written to is made after the engine call, on the engine's output
    # itself (an edge view, counted with that engine's ops); the rest stays compiled.
    FileCheck().check("blade::execute").check("aten::slice").check("aten::copy_") \
        .run(str(optimized.graph))
    assert report.edge_views == 2 and report.clusters[0].ops["aten::slice.Tensor"] == 2, \
        str(report)
    assert list(report.unsupported) == ["aten::copy_"], str(report)


class EqualOutputs(torch.nn.Module):
    def forward(self, x):
        a = x * 2.0
        return a, a * 1.0, torch.tanh(a)


def test_outputs_that_compile_to_one_value_get_their_own_buffers():
    x = torch.randn(4, 6)
    optimized, _ = run_compiled(EqualOutputs(), (x,))
    a, b, _ = optimized(x)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1.0)
    assert_same(b, x * 2.0)


class WithDeterminant(torch.nn.Module):
    """Elementwise ops around linalg_det, which no pipeline stage lowers (the test accepts
    it in the registry to stand for an op whose conversion fails). Its matrices have more
    than 16 rows, which Blade's decomposition leaves to the op."""

    def forward(self, x):
        a = torch.sigmoid(x) * 2.0
        d = torch.linalg.det(a)
        e = torch.linalg.det(a * 0.5)  # the same op on the same types: a twin
        return a.sum(dim=(1, 2)) * 0.5 + torch.tanh(d) + e


def _accept_in_registry(schema):
    from blade.dtypes import DtypeRule
    from blade.partition.registry import REGISTRY, Converter

    return REGISTRY.register(Converter(schema, dtype_rule=DtypeRule(
        args={"*": ("float32",)}, result="same"), priority=100, origin="test"))


def test_a_failing_node_stays_torchscript_and_the_rest_compiles():
    converter = _accept_in_registry("aten::linalg_det")
    try:
        x = torch.randn(3, 17, 17)
        optimized, report = run_compiled(WithDeterminant(), (x,), min_compiled_ops=6,
                                         allow_compile_errors=True)
        # Both determinants (the failing node and its twin) run as TorchScript, every other
        # op compiled after one failed attempt.
        reasons = report.unsupported["aten::linalg_det"].reasons
        assert report.unsupported["aten::linalg_det"].count == 2, str(report)
        assert "failed to legalize operation 'torch.aten.linalg_det'" in reasons[0], reasons
        assert len(report.compile_errors) == 1, str(report)
        assert "left in TorchScript: aten::linalg_det" in report.compile_errors[0]
        assert "and 1 like it" in report.compile_errors[0]
        assert report.compiled_ops == report.total_ops - 2, str(report)
        assert "%" not in reasons[0], reasons  # the reason is one line, not the op's IR
    finally:
        blade.unregister_converter(converter)


def test_recompiling_after_failures_is_bounded(monkeypatch):
    from blade.codegen import driver as codegen

    attempts = []

    def always_blames_the_first_op(text, *args, **kwargs):
        attempts.append(1)
        first = re.search(r'"torch\.aten\..*loc\("blade_node_(\d+)"\)', text)
        raise codegen.CodegenError("stage bufferize failed: injected",
                                   node_index=int(first.group(1)))

    monkeypatch.setattr(codegen, "start_compiling", always_blames_the_first_op)
    x = torch.randn(4, 8)
    model = Lambda(lambda x: ((((x.exp() * 2.0).tanh() + 1.0).sin() - 3.0).cos() / 4.0).abs())
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    report = blade.report(optimized)
    assert len(attempts) == 1 + blade.engines.MAX_RECLUSTER_ROUNDS
    assert not report.clusters and report.compiled_ops == 0
    assert_same(optimized(x), model(x))


class DeterminantBeforeTopk(torch.nn.Module):
    """Two clusters cut apart by an unsorted topk (Torch-MLIR lowers only sorted ones); the
    first holds linalg_det."""

    def forward(self, x):
        a = torch.sigmoid(x) * 2.0
        b = torch.tanh(torch.linalg.det(a)) + a.sum(dim=(1, 2))
        return torch.exp(torch.topk(b, 2, sorted=False).values) * 3.0


def test_a_failure_in_one_cluster_leaves_the_others_alone():
    converter = _accept_in_registry("aten::linalg_det")
    try:
        x = torch.randn(3, 17, 17)
        optimized, report = run_compiled(DeterminantBeforeTopk(), (x,),
                                         blade.Config(**NO_KERNEL_CALLS),
                                         allow_compile_errors=True)
        # The exp cluster compiled first time; the failed one came back as two clusters.
        assert len(report.clusters) == 3 and len(report.compile_errors) == 1, str(report)
        assert report.compiled_ops == report.total_ops - 2, str(report)  # det, topk
    finally:
        blade.unregister_converter(converter)


# No engine without a compute op, and every op left outside an engine has a reason.

class MaxOverMaskedRows(torch.nn.Module):
    """aten::max.dim, excluded below, splits the model; `i.to(torch.int64)` of an int64
    index is a no-op that returns its input."""

    def forward(self, x, mask):
        m = x.masked_fill(~mask, -1e4)
        v, i = m.max(dim=1)
        return v * 2, i.to(torch.int64)


class CastOnly(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.int64)


class ViewsOfInputsAndOutputs(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x)
        return x.transpose(0, 1), y, y[:, :2], x.reshape(-1), x.to(torch.float32)


def test_no_engine_is_made_without_a_compute_op():
    x, mask = torch.randn(4, 5), torch.rand(4, 5) > 0.3
    optimized, report = run_compiled(MaxOverMaskedRows(), (x, mask),
                                     blade.Config(excluded_ops=["aten::max.dim"]))
    assert_every_op_accounted_for(report)
    assert "excluded_ops" in report.unsupported["aten::max.dim"].reasons[0]
    # A cast to the dtype its input has returns the input: it reads the input directly
    # (typed_rewrites.fresh_casts), no op is left and no engine made. A cast to another
    # dtype computes a new tensor (aten::_to_copy): an engine.
    assert "aten::to.dtype" not in report.unsupported, str(report)
    x = torch.arange(6, dtype=torch.int64)
    optimized = blade.optimize(CastOnly(), (x,))
    report = blade.report(optimized)
    assert not report.clusters and report.total_ops == 0, str(report)
    assert optimized(x).data_ptr() == x.data_ptr()
    x = torch.arange(6, dtype=torch.int32)
    _, report = run_compiled(CastOnly(), (x,))
    assert report.clusters[0].ops == {"aten::_to_copy": 1}, str(report)


class PositionsOfTheLength(torch.nn.Module):
    """As Hugging Face's embeddings take their position ids: a slice of a buffer up to the
    input's length plus an offset, which tracing records as 0-d tensor arithmetic."""

    def __init__(self):
        super().__init__()
        self.register_buffer("positions", torch.arange(64).unsqueeze(0))
        self.table = torch.nn.Embedding(64, 8)

    def forward(self, ids):
        length = ids.shape[1]
        return torch.tanh(self.table(ids) + self.table(self.positions[:, 0:length + 0]))


def test_size_arithmetic_on_0d_tensors_is_no_engine_of_its_own():
    model = PositionsOfTheLength().eval()
    ids = torch.randint(0, 64, (1, 10))
    traced = torch.jit.trace(model, (ids,))
    optimized = blade.optimize(traced, (ids,), blade.Config(dynamic_dims={0: [1]}))
    report = blade.report(optimized)
    assert [c.inputs.split(";") for c in report.clusters if "int64[]" in c.inputs] == [], \
        str(report)
    assert "size arithmetic" in report.unsupported["aten::add.Tensor"].reasons[0], str(report)
    with torch.no_grad():
        for length in (3, 17):
            ids = torch.randint(0, 64, (1, length))
            torch.testing.assert_close(optimized(ids), model(ids))
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 0 and all(c.calls == 2 for c in report.clusters), \
        str(report)


def test_every_op_left_outside_an_engine_has_a_reason():
    x = torch.randn(4, 6)
    for config in (None, blade.Config(dynamic=True)):
        optimized, report = run_compiled(ViewsOfInputsAndOutputs(), (x,), config)
        assert_every_op_accounted_for(report)
        # Views of the input returned as they are are metadata, counted apart, never
        # clustered; the slice of `y` is made after the engine call, on its result (an
        # edge view, counted with the engine).
        for op in ("aten::transpose.int", "aten::reshape"):
            assert op not in report.unsupported, str(report)
        assert report.input_views == 2 and report.coverage == 1.0, str(report)
        assert report.clusters[0].ops["aten::slice.Tensor"] == 2, str(report)
        assert "aten::to.dtype" not in report.unsupported, str(report)  # x itself
    optimized = blade.optimize(ViewsOfInputsAndOutputs(), (x,),
                               blade.Config(min_cluster_size=2))
    report = blade.report(optimized)
    assert_every_op_accounted_for(report)
    assert "fewer than min_cluster_size=2" in report.unsupported["aten::tanh"].reasons[0]


# Views at an engine's edge: outputs that must alias an input or another output are made
# after the engine call from its results, and eager's aliasing is kept exactly.

class ViewBesideItsBase(torch.nn.Module):
    """`z` and its transpose both leave; ops on the transpose stay compiled."""

    def forward(self, x):
        z = torch.sin(x) * 2
        v = z.t()
        return z, v, torch.exp(v) + 1, z[1:, :3].unsqueeze(0)


class ViewsOfEverything(torch.nn.Module):
    def forward(self, x, y):
        z = torch.sigmoid(x) + y
        w = z.view(x.size(0), -1)  # sizes read at run time under dynamic shapes
        return (w, z.transpose(0, 1), x.t(), z.flatten(), y.expand(2, -1, -1),
                torch.tanh(z.narrow(1, 1, 2)), z.permute(1, 0).select(0, 1))


def _assert_aliases_as_eager(model, optimized, inputs):
    """Writes into each output in turn, then compares every output and every input with
    eager's after the same write: a view that lost its base shows it."""
    with torch.no_grad():
        outputs = len(model(*[t.clone() for t in inputs]))
        for i in range(outputs):
            eager_in = [t.clone() for t in inputs]
            blade_in = [t.clone() for t in inputs]
            want, got = model(*eager_in), optimized(*blade_in)
            try:
                want[i].add_(100.0)
            except RuntimeError as e:  # an expanded view refuses writes: so must Blade's
                with pytest.raises(RuntimeError, match=re.escape(str(e)[:40])):
                    got[i].add_(100.0)
                continue
            got[i].add_(100.0)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
            for g, w in zip(blade_in, eager_in):
                torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dynamic", [False, True])
def test_views_of_results_are_made_after_the_engine_and_alias_as_in_eager(dynamic):
    x = torch.randn(4, 6)
    optimized, report = run_compiled(ViewBesideItsBase(), (x,), blade.Config(dynamic=dynamic))
    # The exp of the transpose used to leave the engine with it, reported as a view.
    assert report.compiled_ops == report.total_ops and not report.unsupported, str(report)
    assert report.edge_views >= 2, str(report)
    assert_ran_compiled(optimized)
    FileCheck().check("blade::execute").check("aten::t(").run(str(optimized.graph))
    _assert_aliases_as_eager(ViewBesideItsBase(), optimized, (x,))


@pytest.mark.parametrize("dynamic", [False, True])
def test_views_of_inputs_and_results_keep_eager_aliasing(dynamic):
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    optimized, report = run_compiled(ViewsOfEverything(), (x, y), blade.Config(dynamic=dynamic))
    assert_every_op_accounted_for(report)
    # Only x.t() and y.expand, views of inputs with no work of their own, stay outside.
    assert set(report.unsupported) <= {"aten::t", "aten::expand"}, str(report)
    assert not any("may be a view" in reason for entry in report.unsupported.values()
                   for reason in entry.reasons), str(report)
    _assert_aliases_as_eager(ViewsOfEverything(), optimized, (x, y))
    if dynamic:
        x, y = torch.randn(3, 5), torch.randn(3, 5)
        torch.testing.assert_close(optimized(x, y), ViewsOfEverything()(x, y))
        _assert_aliases_as_eager(ViewsOfEverything(), optimized, (x, y))
        assert blade.report(optimized).runtime_fallbacks == 0


class MaskedMaxOverLengths(torch.nn.Module):
    """Padded positions masked, then a max over the sequence (aten::max.dim, decomposed
    into a transpose, amax, comparisons and where: fresh results around a view)."""

    def forward(self, x, lengths):
        t = torch.arange(x.size(1)).unsqueeze(0)
        mask = t < lengths.unsqueeze(1)
        return x.masked_fill(~mask.unsqueeze(-1), -1e4).max(dim=1)[0]


@pytest.mark.parametrize("dynamic", [False, True])
def test_no_op_whose_schema_cannot_alias_is_reported_as_a_view(dynamic):
    x, lengths = torch.randn(4, 10, 32), torch.tensor([10, 3, 7, 1])
    _, report = run_compiled(MaskedMaxOverLengths(), (x, lengths),
                             blade.Config(dynamic=dynamic))
    assert report.compiled_ops == report.total_ops, str(report)
    # quantize_dynamic's Linear ends with `Y.to(torch.float)` of its float result.
    float_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                      torch.nn.Linear(64, 8)).eval()
    model = torch.ao.quantization.quantize_dynamic(float_model, {torch.nn.Linear},
                                                   dtype=torch.qint8).eval()
    x = torch.randn(4, 32)
    optimized = blade.optimize(model, (x,), blade.Config(dynamic=dynamic))
    with torch.no_grad():
        got, want, exact = optimized(x), model(x), float_model(x)
    # On a CPU with VNNI or AMX Blade runs the layers as its own int8 ones (8-bit
    # activations where fbgemm keeps 7; tests/test_int8.py): as close to the float model.
    error = float((want - exact).abs().max())
    assert float((got - want).abs().max()) <= max(2 * error, 1e-5)
    report = blade.report(optimized)
    assert_every_op_accounted_for(report)
    for op, entry in report.unsupported.items():
        assert not any("may be a view" in reason for reason in entry.reasons), str(report)
