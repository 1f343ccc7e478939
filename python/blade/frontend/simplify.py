"""The frozen graph simplified for clustering: tensor attributes folded, PyTorch's and
Blade's graph passes (csrc/passes) to a fixed point, decompositions, and every tensor's type
materialized from a run on the example inputs."""
import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.frontend import typed_rewrites
from blade.frontend.graph_walk import nodes_of
from blade.frontend.inputs import (ExampleInputsError, describe_inputs, failure_summary,
                                   private_copy)
from blade.frontend.pools import POOLING_OVERLOADS, explicit_pool_windows
from blade.partition.registry import argument_name, schema_name
from blade.tools.dump import Dumper

def is_tensor_op(node: torch._C.Node) -> bool:
    """An op that computes or views tensors: what coverage counts."""
    if node.kind().startswith("prim::"):
        return False
    return any(isinstance(v.type(), torch._C.TensorType) for v in node.outputs())


def may_be_written(value: torch._C.Value, also_reading: Sequence[str] = ()) -> bool:
    """Whether some node may write to `value`: an op whose schema marks the argument as
    written, or one that writes a view of it or a container holding it (followed through
    every op whose schema says its result may alias the argument). A node without a
    schema counts as a writer, except list/tuple plumbing, the reads below and the kinds
    `also_reading`."""
    for use in value.uses():
        node = use.user
        if node.kind() in _CONTAINER_PLUMBING:
            if any(may_be_written(output, also_reading) for output in node.outputs()):
                return True
            continue
        if node.kind() in _READS_WITHOUT_SCHEMA or node.kind() in also_reading:
            continue
        schema = node.schema()
        if schema == "(no schema)":
            return True
        arguments = torch._C.parse_schema(schema).arguments
        if not arguments:
            return True
        alias = arguments[min(use.offset, len(arguments) - 1)].alias_info
        if alias is not None and (alias.is_write or any(may_be_written(output, also_reading)
                                                        for output in node.outputs())):
            return True
    return False


_CONTAINER_PLUMBING = ("prim::ListConstruct", "prim::TupleConstruct", "prim::TupleUnpack",
                       "prim::ListUnpack", "prim::TupleIndex", "prim::unchecked_cast")
_READS_WITHOUT_SCHEMA = ("prim::device", "prim::dtype", "prim::requires_grad", "prim::is_cuda",
                         "prim::layout", "prim::shape", "prim::is_nested", "prim::isinstance",
                         "aten::__isnot__", "aten::__is__")


def attribute_path(node: torch._C.Node, self_value) -> Optional[Tuple[str, ...]]:
    """The attribute names from the module (`self`) to what a GetAttr/SetAttr node names,
    outermost first; None when its owner is not reached through GetAttrs from `self`."""
    path, owner = [node.s("name")], next(iter(node.inputs()))
    while owner != self_value and owner.node().kind() == "prim::GetAttr":
        path.append(owner.node().s("name"))
        owner = owner.node().input()
    return tuple(reversed(path)) if owner == self_value else None


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


def simplify(graph: torch._C.Graph, module: torch.jit.ScriptModule, inputs: Tuple,
             excluded_ops=(), dump: Optional[Dumper] = None,
             resized_inputs: Sequence[Tuple] = (), dynamic: bool = False,
             none_inputs: Sequence[int] = (),
             before_types: Optional[Callable[[torch._C.Graph], None]] = None
             ) -> Tuple[Dict[str, int], torch._C.Graph, List]:
    """Cleans the frozen graph, applies the decompositions and materializes its types from
    the example inputs (and `resized_inputs`: dims that differ there become dynamic).
    Optional tensor inputs at `none_inputs` (graph positions) are taken to be None.
    Returns how many nodes of each op were decomposed, a copy of the graph from before the
    decompositions and the example inputs were used (the model for any input), and what the
    graph returned when it ran on the example inputs to record the types (the passes after
    that run keep what the graph computes). `before_types` rewrites the decomposed graph
    before its types are recorded (int8 quantization). `dump` gets the graph after every
    pass that changed it."""
    from blade.frontend.decompositions import decompose
    from blade.frontend.quantize import from_dynamic_quantized

    dump = dump or Dumper(None)
    dump.graph("frozen", graph, always=True)

    def run(name, fn):
        result = fn()
        dump.graph(name, graph)
        return result

    def to_fixed_point(passes):
        for _ in range(8):
            before = str(graph)
            for name, fn in passes:
                run(name, fn)
            if str(graph) == before:
                break

    run("inline", lambda: torch._C._jit_pass_inline(graph))
    run("remove_dropout", lambda: torch._C._jit_pass_remove_dropout(module._c))
    run("fold_tensor_attributes", lambda: fold_tensor_attributes(graph, module))
    run("constant_propagation", lambda: torch._C._jit_pass_constant_propagation(graph))
    if _C.has_int8_dot_product():
        # Layers quantize_dynamic made, before the model for any input is taken: both run
        # the same int8 op.
        run("from_dynamic_quantized", lambda: from_dynamic_quantized(graph))
    # The model for any input is taken before Blade's decompositions, which are written for
    # the compiler, not for every input eager takes (SDPA's amax over zero keys raises).
    unspecialized = graph.copy()
    decomposed = run("decompose", lambda: decompose(graph, excluded_ops, dynamic))
    # Python structure that needs no shapes: in-place ops on fresh values, writes through
    # views, dicts and appended lists, list idioms, loops with constant trip counts.
    structure = [
        ("constant_propagation", lambda: torch._C._jit_pass_constant_propagation(graph)),
        ("remove_mutation", lambda: torch._C._jit_pass_remove_mutation(graph)),
        ("functionalize_view_writes", lambda: _C.functionalize_view_writes(graph)),
        ("fold_structures", lambda: _C.fold_structures(graph)),
        ("list_idioms", lambda: torch._C._jit_pass_peephole_list_idioms(graph, True)),
        ("constant_loop_unrolling",
         lambda: torch._C._jit_pass_constant_loop_unrolling(graph)),
        ("dce", lambda: torch._C._jit_pass_dce(graph)),
    ]
    to_fixed_point(structure)
    if none_inputs:
        # Optional inputs that are None in the example: `if mask is not None` folds.
        none = graph.insertConstant(None)
        none.node().moveBefore(next(iter(graph.nodes())))
        for position in none_inputs:
            list(graph.inputs())[position].replaceAllUsesWith(none)
        dump.graph("specialize_none_inputs", graph)
        to_fixed_point(structure)
    # What is left of in-place ops writes into the caller's tensors: functional values, and
    # write-backs that the engine computing the value can do (csrc/passes/
    # functionalize_input_writes.h). Before the types are recorded: the new ops get theirs.
    run("functionalize_input_writes", lambda: _C.functionalize_input_writes(graph))
    if before_types is not None:
        run("quantize_int8", lambda: before_types(graph))
    # Blade compiles for inference: the types are recorded under no_grad, so branches a
    # model takes only when autograd is on (nn.TransformerEncoderLayer's slow path) are
    # not the ones compiled.
    try:
        with torch.no_grad():
            _, example_outputs = run("materialize_types", lambda: _C.materialize_types(
                graph, (module._c,) + private_copy(inputs), True,
                [(module._c,) + private_copy(more) for more in resized_inputs]))
    except RuntimeError as e:
        # The model raised on its example inputs: the user's model or inputs, said in one
        # error, not as the interpreter's traceback through Blade's instrumented graph.
        names = [argument_name(v) for v in list(graph.inputs())[1:]]
        raise ExampleInputsError(
            f"blade.optimize: the model raised when run on its example inputs "
            f"({describe_inputs(inputs, names)}): {failure_summary(e)}. Check that the "
            "example inputs are what forward takes (their shapes and dtypes), and that the "
            "model runs on them in eager mode.", str(e)) from None
    run("check_in_place_casts", lambda: _C.check_in_place_casts(graph))
    run("functionalize_small_writes",
        lambda: _C.functionalize_input_writes(graph, SMALL_WRITE_ELEMENTS))
    for rewrite in typed_rewrites.REWRITES:
        run(rewrite.__name__, functools.partial(rewrite, graph))
    run("explicit_pool_windows",
        lambda: explicit_pool_windows(graph, nodes_of(graph, POOLING_OVERLOADS)))
    # With shapes known: size()/dim() fold, splits of known sizes become slices, which
    # opens more of the above.
    # fold_sizes before the peephole: it folds a size list that is written into a list the
    # writes can be removed from, where the peephole makes a constant they would write.
    to_fixed_point([
        ("split_to_slices", lambda: _C.split_to_slices(graph)),
        ("fold_sizes", lambda: _C.fold_sizes(graph)),
        ("peephole", lambda: torch._C._jit_pass_peephole(graph, False)),
        ("fold_numel", lambda: _C.fold_numel(graph)),
    ] + structure + [("bool_mask_writes", lambda: typed_rewrites.bool_mask_writes(graph))])
    return still_decomposed(decomposed, graph), unspecialized, example_outputs


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
