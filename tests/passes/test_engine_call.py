"""engine_call: a cluster's tensor constants become its engine's params, its fallback is
IR that parses with shape-free types, the writes into its inputs that its engine can do
are found, and the cluster becomes a call of its engine."""
import torch
from torch.testing import FileCheck

from blade import _C
from graph_runner import run_pass
from test_graph_pipeline import Linear


class WritesInput(torch.nn.Module):
    def forward(self, x):
        x.mul_(2)
        return torch.tanh(x)


class CacheStep(torch.nn.Module):
    """A static KV cache's step: a counter and the caches written in place."""

    def forward(self, x, k, v, n):
        position = torch.arange(1) + n
        n.add_(1)
        k.index_copy_(2, position, x)
        v.index_copy_(2, position, x * 2)
        return torch.softmax(x @ k.transpose(-1, -2), -1) @ v


def cache_step_inputs():
    return (torch.randn(1, 2, 1, 4), torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4),
            torch.tensor(0))


def cluster_of(model, inputs):
    _, _, _, c = run_pass(model, inputs, "cluster")
    assert len(c.clusters) == 1
    return c.clusters[0], c


def test_tensor_constants_become_trailing_inputs_and_params():
    cluster, _ = cluster_of(Linear(), (torch.randn(4, 8),))
    subgraph = cluster.g("Subgraph").copy()
    inputs = len(list(subgraph.inputs()))
    params = _C.lift_tensor_constants(subgraph)
    assert sorted(p.shape for p in params) == [(8,), (8, 8)]
    assert len(list(subgraph.inputs())) == inputs + 2
    FileCheck().check_not("prim::Constant[value=<Tensor>]").check("aten::linear") \
        .run(str(subgraph))


def test_the_fallback_parses_with_shape_free_types():
    cluster, _ = cluster_of(Linear(), (torch.randn(4, 8),))
    subgraph = cluster.g("Subgraph").copy()
    _C.lift_tensor_constants(subgraph)
    text = _C.fallback_ir(subgraph)
    assert "Float(4, 8" not in text
    parsed = torch._C.parse_ir(text)
    FileCheck().check("aten::linear").check("aten::relu").run(str(parsed))


def test_a_write_into_an_input_is_done_by_the_engine():
    cluster, _ = cluster_of(WritesInput(), (torch.randn(4),))
    assert len(_C.absorbable_write_backs(cluster)) == 1
    # compile_clusters makes the engine and replaces the cluster with its call.
    _, _, after, _ = run_pass(WritesInput(), (torch.randn(4),), "compile_clusters")
    FileCheck().check("blade::execute_writing").check_not("blade::write_back").run(after)


def test_writes_past_a_write_into_another_input_are_done_by_the_engine():
    """The counter's write-back comes between the caches' cluster and their write-backs.
    AliasDb takes graph inputs to alias each other; the guard admits no written input
    that shares memory with another, so the caches' writes still move up to their engine."""
    _, _, _, c = run_pass(CacheStep(), cache_step_inputs(), "cluster")
    caches = max(c.clusters, key=lambda n: len(list(n.g("Subgraph").nodes())))
    assert len(_C.absorbable_write_backs(caches)) == 2, str(c.graph)
