"""Passes that simplify the frozen graph for clustering (blade.frontend.pipeline runs them in
order): tensor attributes folded, PyTorch's and Blade's graph passes (csrc/passes) to a
fixed point, optional inputs specialized to None, every tensor's type recorded from a run
on the example inputs, and sizes folded once shapes are known."""
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from blade import _C
from blade.frontend import typed_rewrites
from blade.frontend.inputs import ExampleInputsError, describe_inputs, failure_summary
from blade.graph_queries import (argument_name, attribute_path, may_be_written, nodes_of,
                                 schema_name)
from blade.isolation import private_copy


def fold_tensor_attributes(graph: torch._C.Graph, module: torch.jit.ScriptModule) -> int:
    """Module tensors that freezing left as `prim::GetAttr` (it keeps an attribute that is
    put in a list or tuple, as nn.MultiheadAttention's `in_proj_weight` is for its fast path
    checks) become constants when nothing in the graph writes to them through any of its
    reads, nor assigns it: engines then get them as params, prepared once (packed
    weights), instead of as inputs on every call. Returns how many were folded."""
    self_value = next(iter(graph.inputs()))
    reads, written = [], set()
    for node in nodes_of(graph, ("prim::SetAttr", "prim::GetAttr")):
        if node.kind() == "prim::SetAttr":
            written.add(attribute_path(node, self_value))
        elif node.kind() == "prim::GetAttr" and \
                isinstance(node.output().type(), torch._C.TensorType):
            path = attribute_path(node, self_value)
            reads.append((node, path))
            if may_be_written(node.output()):
                written.add(path)
    folded = 0
    for node, path in reads:
        if path is None or path in written:
            continue
        obj = module._c
        for name in path:
            obj = obj.getattr(name)
        if not isinstance(obj, torch.Tensor):
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(obj.detach())
        node.output().replaceAllUsesWith(constant)
        folded += 1
    return folded


def _to_fixed_point(graph: torch._C.Graph, passes: Sequence[Callable[[], Any]]) -> None:
    for _ in range(8):
        before = str(graph)
        for run in passes:
            run()
        if str(graph) == before:
            break


def _structure(graph: torch._C.Graph) -> List[Callable[[], Any]]:
    """Python structure that needs no shapes: in-place ops on fresh values, writes through
    views, dicts and appended lists, list idioms, loops with constant trip counts."""
    return [
        lambda: torch._C._jit_pass_constant_propagation(graph),
        lambda: torch._C._jit_pass_remove_mutation(graph),
        lambda: _C.functionalize_view_writes(graph),
        lambda: _C.fold_structures(graph),
        lambda: torch._C._jit_pass_peephole_list_idioms(graph, True),
        lambda: torch._C._jit_pass_constant_loop_unrolling(graph),
        lambda: torch._C._jit_pass_dce(graph),
    ]


def simplify_structure(graph: torch._C.Graph) -> None:
    """The structure passes (`_structure`) to a fixed point."""
    _to_fixed_point(graph, _structure(graph))


def specialize_none_inputs(graph: torch._C.Graph, none_inputs: Sequence[int]) -> None:
    """Optional inputs that are None in the example (graph positions) are None: `if mask is
    not None` folds, and the structure passes run again."""
    if not none_inputs:
        return
    none = graph.insertConstant(None)
    none.node().moveBefore(next(iter(graph.nodes())))
    for position in none_inputs:
        list(graph.inputs())[position].replaceAllUsesWith(none)
    simplify_structure(graph)


def record_types(graph: torch._C.Graph, module: torch.jit.ScriptModule, inputs: Tuple,
                 resized_inputs: Sequence[Tuple] = ()) -> List:
    """Types every tensor of the graph as a run on the example inputs saw it (and on
    `resized_inputs`: dims that differ there become dynamic); returns what the graph
    returned on the example inputs (the passes after keep what the graph computes)."""
    # Blade compiles for inference: the types are recorded under no_grad, so branches a
    # model takes only when autograd is on (nn.TransformerEncoderLayer's slow path) are
    # not the ones compiled.
    try:
        with torch.no_grad():
            _, results = _C.materialize_types(
                graph, (module._c,) + private_copy(inputs), True,
                [(module._c,) + private_copy(more) for more in resized_inputs])
        return results
    except RuntimeError as e:
        # The model raised on its example inputs: the user's model or inputs, said in one
        # error, not as the interpreter's traceback through Blade's instrumented graph.
        names = [argument_name(v) for v in list(graph.inputs())[1:]]
        raise ExampleInputsError(
            f"blade.optimize: the model raised when run on its example inputs "
            f"({describe_inputs(inputs, names)}): {failure_summary(e)}. Check that the "
            "example inputs are what forward takes (their shapes and dtypes), and that the "
            "model runs on them in eager mode.", str(e)) from None


_WRITES = ("aten::copy_", "aten::fill_")


def static_write_bounds(graph: torch._C.Graph) -> int:
    """Negative constant bounds of the slices that writes go through (`mask[-7:-3, :4] = 1`,
    as Swin builds its attention mask), counted from the end of a dim whose size the types
    fix, become the positive bounds they stand for, so that functionalize_view_writes can
    rewrite the writes (it takes bounds >= 0 only: before the types, a negative bound's
    place is not known). Returns how many slices changed."""
    count = 0
    for write in nodes_of(graph, _WRITES):
        view = write.inputsAt(0).node()
        while view.kind() == "aten::slice" and len(list(view.inputs())) == 5:
            source, dim = view.inputsAt(0), view.inputsAt(1).toIValue() \
                if view.inputsAt(1).node().kind() == "prim::Constant" else None
            sizes = source.type().symbolic_sizes() \
                if isinstance(source.type(), torch._C.TensorType) else None
            if isinstance(dim, int) and sizes is not None and -len(sizes) <= dim < len(sizes) \
                    and sizes[dim] >= 0:
                for position in (2, 3):
                    bound = view.inputsAt(position)
                    value = bound.toIValue() if bound.node().kind() == "prim::Constant" \
                        else None
                    if isinstance(value, int) and value < 0:
                        with graph.insert_point_guard(view):
                            view.replaceInput(position, graph.insertConstant(
                                max(value + sizes[dim], 0)))
                        count += 1
            view = source.node()
    return count


def simplify_shapes(graph: torch._C.Graph) -> None:
    """With shapes known: size()/dim() fold, splits of known sizes become slices, which
    opens more of the structure passes; to a fixed point. fold_sizes comes before the
    peephole: it folds a size list that is written into a list the writes can be removed
    from, where the peephole makes a constant they would write."""
    _to_fixed_point(graph, [
        lambda: _C.split_to_slices(graph),
        lambda: _C.fold_sizes(graph),
        lambda: torch._C._jit_pass_peephole(graph, False),
        lambda: _C.fold_numel(graph),
    ] + _structure(graph) + [lambda: typed_rewrites.bool_mask_writes(graph)])


# A write of a few elements (index_put_, scatter_, ...) into a caller's tensor of at most this
# many elements compiles as a new value written back whole (csrc/passes/
# functionalize_input_writes.h): about 256 KB of float32, a few microseconds to copy. Larger
# tensors (a KV cache) keep the write in place.
SMALL_WRITE_ELEMENTS = 1 << 16


def still_decomposed(decomposed: Dict[str, int], graph) -> Dict[str, int]:
    """`decomposed` less the nodes of each op that the simplified graph still calls: a
    decomposition that applies to some arguments only (upsampling by whole factors) keeps
    the op in its other branch, and the report must not count an op as decomposed that
    runs as it was (it is listed as not compiled instead)."""
    remaining: Dict[str, int] = {}
    for node in nodes_of(graph, decomposed):
        name = schema_name(node)
        if name in decomposed:
            remaining[name] = remaining.get(name, 0) + 1
    counts = {op: n - remaining.get(op, 0) for op, n in decomposed.items()}
    return {op: n for op, n in counts.items() if n > 0}
