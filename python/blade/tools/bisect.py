"""Finding the clusters whose compiled code disagrees with their TorchScript subgraph.

`compare_clusters(optimized, inputs)` runs the optimized module once on `inputs`, capturing
what each engine receives; then runs each engine's compiled code and its TorchScript
subgraph on exactly those inputs and compares the results. `blade bisect` prints it.
"""
from dataclasses import dataclass, field
from typing import List, Sequence

import torch

from blade.report import report as read_report

# An engine's call; `_writing` when it writes into some of its inputs (Engine.writes).
EXECUTE_KINDS = ("blade::execute", "blade::execute_writing")


@dataclass
class ClusterComparison:
    name: str
    ops: dict
    max_abs_diff: float = 0.0
    matches: bool = True
    status: str = ""        # why the cluster could not be compared, if it could not
    outputs: List[str] = field(default_factory=list)  # per output: "ok" or what differs

    def __str__(self) -> str:
        ops = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(self.ops.items()))
        if self.status:
            verdict = f"not compared: {self.status}"
        elif self.matches:
            verdict = f"ok (max abs diff {self.max_abs_diff:.3g})"
        else:
            verdict = f"DIFFERS (max abs diff {self.max_abs_diff:.3g})"
        return f"{self.name}: {verdict}  [{ops}]"


def _unguarded(graph):
    """The graph with its input guard's optimized branch inlined at the top level (the
    inputs compared are the example-like ones the guard admits)."""
    for node in list(graph.nodes()):
        if node.kind() != "prim::If" or node.inputsAt(0).node().kind() != "blade::guard_admits":
            continue
        optimized = list(node.blocks())[0]
        for inner in list(optimized.nodes()):
            inner.moveBefore(node)
        for out, value in zip(node.outputs(), optimized.returnNode().inputs()):
            out.replaceAllUsesWith(value)
        node.destroy()
    return graph


def _engine_inputs(module: torch.jit.ScriptModule, inputs: Sequence) -> dict:
    """engine name -> the list of tensors it received, for the engines of the top-level
    block (engines inside if/loop bodies are not captured)."""
    graph = _unguarded(module.graph.copy())
    captured = []
    for node in graph.nodes():
        if node.kind() not in EXECUTE_KINDS:
            continue
        engine = node.inputsAt(0).node()
        if engine.kind() != "prim::GetAttr":
            continue
        captured.append((engine.s("name"), node.inputsAt(1)))
    if not captured:
        return {}
    # One tuple out: the engines' input lists (a method returns a single value).
    values = [value for _, value in captured]
    tuple_node = graph.create("prim::TupleConstruct", values)
    tuple_node.insertBefore(graph.return_node())
    tuple_node.output().setType(torch._C.TupleType([v.type() for v in values]))
    while len(list(graph.outputs())) > 0:
        graph.eraseOutput(0)
    graph.registerOutput(tuple_node.output())
    function = torch._C._create_function_from_graph("blade_capture", graph)
    with torch.no_grad():  # (on copies: the model may write into its inputs)
        lists = function(module._c, *[t.clone() if isinstance(t, torch.Tensor) else t
                                      for t in inputs])
    return {name: list(tensors) for (name, _), tensors in zip(captured, lists)}


def compare_clusters(module: torch.jit.ScriptModule, inputs: Sequence,
                     rtol: float = 1e-4, atol: float = 1e-4) -> List[ClusterComparison]:
    report = read_report(module)
    captured = _engine_inputs(module, inputs)
    results = []
    for cluster in report.clusters:
        comparison = ClusterComparison(cluster.name, cluster.ops)
        results.append(comparison)
        if not cluster.compiled or cluster.name not in captured:
            comparison.status = ("not compiled" if not cluster.compiled else
                                 "inside a control-flow block, not reached at top level")
            continue
        engine = getattr(module, cluster.name)
        args = [t.clone() for t in captured[cluster.name]]
        fallbacks = engine.fallbacks()
        with torch.no_grad():
            compiled = engine.execute(args)
            if engine.fallbacks() != fallbacks:
                comparison.status = f"fell back: {engine.last_fallback_reason()}"
                continue
            reference = engine.run_subgraph([t.clone() for t in captured[cluster.name]])
        for i, (got, want) in enumerate(zip(compiled, reference)):
            if got.shape != want.shape or got.dtype != want.dtype:
                comparison.matches = False
                comparison.outputs.append(f"output {i}: {got.dtype}{list(got.shape)} where "
                                          f"TorchScript gives {want.dtype}{list(want.shape)}")
                continue
            g, w = got.double(), want.double()
            gap = (g - w).abs().masked_fill(g.isnan() & w.isnan(), 0).nan_to_num(
                nan=float("inf"))
            diff = gap.max().item() if gap.numel() else 0.0
            comparison.max_abs_diff = max(comparison.max_abs_diff, diff)
            close = torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
            if not close:
                comparison.matches = False
                comparison.outputs.append(f"output {i}: max abs diff {diff:.3g}")
            else:
                comparison.outputs.append("ok")
    return results
