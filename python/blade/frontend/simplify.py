"""The frozen graph simplified for clustering: tensor attributes folded, PyTorch's and
Blade's graph passes (csrc/passes) to a fixed point, decompositions, and every tensor's type
materialized from a run on the example inputs."""
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.frontend.inputs import private_copy
from blade.frontend.pools import POOLING_OVERLOADS, explicit_pool_windows
from blade.partition.registry import is_materialized, schema_name
from blade.tools.dump import Dumper


# The node kinds that TorchScript gives blocks: control flow, closures, autodiff's GradOf.
_KINDS_WITH_BLOCKS = frozenset(("prim::If", "prim::Loop", "prim::Closure", "prim::GradOf"))


def all_nodes(block) -> List[torch._C.Node]:
    """The nodes of `block` and of the blocks inside them, in order. Only the kinds that
    have blocks are asked for them: iterating a node's blocks costs 7 us even when there
    are none (a frozen BERT-base encoder walked this way six times: 0.2 s -> 0.1)."""
    nodes = []
    for node in block.nodes():
        nodes.append(node)
        if node.kind() in _KINDS_WITH_BLOCKS:
            for sub in node.blocks():
                nodes.extend(all_nodes(sub))
    return nodes


def nodes_of(graph: torch._C.Graph, overloads: Iterable[str]) -> List[torch._C.Node]:
    """The nodes of `graph` (its blocks' too) whose kind is that of one of `overloads`
    ("aten::sum.dim_IntList" is of kind "aten::sum"), kind by kind, found by TorchScript's
    own walk: a pass that rewrites a few kinds walked a frozen BERT-base encoder in 15 ms
    through all_nodes, in well under 1 ms so."""
    kinds = sorted({overload.split(".")[0] for overload in overloads})
    return [node for kind in kinds for node in graph.findAllNodes(kind, True)]


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


def _attribute_path(node: torch._C.Node, self_value) -> Optional[Tuple[str, ...]]:
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
            written.add(_attribute_path(node, self_value))
        elif node.kind() == "prim::GetAttr" and \
                isinstance(node.output().type(), torch._C.TensorType):
            path = _attribute_path(node, self_value)
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
             none_inputs: Sequence[int] = ()) -> Tuple[Dict[str, int], torch._C.Graph, List]:
    """Cleans the frozen graph, applies the decompositions and materializes its types from
    the example inputs (and `resized_inputs`: dims that differ there become dynamic).
    Optional tensor inputs at `none_inputs` (graph positions) are taken to be None.
    Returns how many nodes of each op were decomposed, a copy of the graph from before the
    decompositions and the example inputs were used (the model for any input), and what the
    graph returned when it ran on the example inputs to record the types (the passes after
    that run keep what the graph computes). `dump` gets the graph after every pass that
    changed it."""
    from blade.frontend.decompositions import decompose
    from blade.frontend.typed_rewrites import typed_rewrites

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
    # Blade compiles for inference: the types are recorded under no_grad, so branches a
    # model takes only when autograd is on (nn.TransformerEncoderLayer's slow path) are
    # not the ones compiled.
    with torch.no_grad():
        _, example_outputs = run("materialize_types", lambda: _C.materialize_types(
            graph, (module._c,) + private_copy(inputs), True,
            [(module._c,) + private_copy(more) for more in resized_inputs]))
    run("check_in_place_casts", lambda: _C.check_in_place_casts(graph))
    run("functionalize_small_writes",
        lambda: _C.functionalize_input_writes(graph, SMALL_WRITE_ELEMENTS))
    run("fresh_casts", lambda: fresh_casts(graph))
    run("float_comparison_scalars", lambda: float_comparison_scalars(graph))
    run("tensor_divisors", lambda: tensor_divisors(graph))
    run("reduction_dtypes", lambda: reduction_dtypes(graph))
    run("typed_rewrites", lambda: typed_rewrites(graph))
    run("scalar_reductions", lambda: scalar_reductions(graph))
    run("batched_images", lambda: batched_images(graph))
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
    ] + structure + [("bool_mask_writes", lambda: bool_mask_writes(graph))])
    return still_decomposed(decomposed, graph), unspecialized, example_outputs


# The casts (self, dtype, ...) by overload: the positions of their non_blocking, copy and
# memory_format arguments. Those between dtype and non_blocking (layout, device,
# pin_memory) must be None.
_CASTS = {"aten::to.dtype": (2, 3, 4), "aten::to.dtype_layout": (5, 6, 7)}


# A write of a few elements (index_put_, scatter_, ...) into a caller's tensor of at most this
# many elements compiles as a new value written back whole (csrc/passes/
# functionalize_input_writes.h): about 256 KB of float32, a few microseconds to copy. Larger
# tensors (a KV cache) keep the write in place.
SMALL_WRITE_ELEMENTS = 1 << 16


def fresh_casts(graph: torch._C.Graph) -> int:
    """`x.to(dtype)` returns x itself when x has that dtype already, so its schema says the
    result may alias x, and clustering keeps it out of engines (which return fresh
    tensors). With the types materialized, a cast to another dtype is known to give a new
    tensor: it becomes `aten::_to_copy`, which eager runs for it anyway and whose schema
    says so. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _CASTS):
        shape = _CASTS.get(schema_name(node))
        if shape is None:
            continue
        non_blocking, copy_flag, memory_format = shape
        inputs = list(node.inputs())
        source, result = inputs[0], node.output()
        if not all(isinstance(v.type(), torch._C.TensorType) and v.type().scalarType()
                   for v in (source, result)):
            continue
        if source.type().scalarType() == result.type().scalarType():
            continue
        if any(not isinstance(v.type(), torch._C.NoneType) for v in inputs[2:non_blocking]):
            continue  # a layout, device or pin_memory given
        if not isinstance(inputs[copy_flag].toIValue(), bool):
            continue  # copy= is not a constant
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            _replace(graph, node, "aten::_to_copy", [source, inputs[1], none, none, none,
                                                      inputs[non_blocking],
                                                      inputs[memory_format]])
        count += 1
    return count


def _replace(graph: torch._C.Graph, node: torch._C.Node, kind: str, inputs) -> None:
    """Puts a `kind` node of `inputs` at the insertion point in place of `node` (one
    result, of the same type)."""
    replacement = graph.create(kind, inputs)
    graph.insertNode(replacement)
    replacement.output().setType(node.output().type())
    replacement.copyMetadata(node)
    node.output().replaceAllUsesWith(replacement.output())
    node.destroy()


_COMPARISONS = {f"aten::{name}.Scalar" for name in ("lt", "le", "gt", "ge", "eq", "ne")}


def _static_sizes(value: torch._C.Value) -> Optional[List[int]]:
    """The sizes of a tensor value whose type was materialized with static shapes."""
    if not isinstance(value.type(), torch._C.TensorType) or not is_materialized(value):
        return None
    return list(value.type().symbolic_sizes())


def bool_mask_writes(graph: torch._C.Graph) -> int:
    """`x[mask] = v`, once remove_mutation has made it `aten::index_put(x, [mask], v, acc)`,
    selects where the mask, a bool over x's leading dims, is true: `where(mask, v, x)`
    (`where(mask, x + v, x)` accumulating), when v is one value or one per trailing
    position (broadcast alike to every selected row), with static shapes. Neither Blade nor
    Torch-MLIR compiles index_put by a mask (its general case, a value per selected row,
    has a shape that depends on the data). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::index_put",)):
        if schema_name(node) != "aten::index_put":
            continue
        target, indices, values, accumulate = node.inputs()
        listed = indices.node()
        if listed.kind() != "prim::ListConstruct" or len(list(listed.inputs())) != 1 or \
                not isinstance(accumulate.toIValue(), bool):
            continue
        mask = next(listed.inputs())
        shapes = [_static_sizes(v) for v in (target, mask, values)]
        if any(s is None for s in shapes) or mask.type().scalarType() != "Bool" or \
                values.type().scalarType() != target.type().scalarType():
            continue
        size, mask_size, value_size = shapes
        trailing = size[len(mask_size):]
        if not 0 < len(mask_size) <= len(size) or size[:len(mask_size)] != mask_size or \
                len(value_size) > len(trailing) or \
                any(v not in (1, t) for v, t in zip(reversed(value_size), reversed(trailing))):
            continue
        kept_size = mask_size + [1] * len(trailing)
        with graph.insert_point_guard(node):
            keep = graph.insertNode(graph.create("aten::reshape",
                                                 [mask, graph.insertConstant(kept_size)]))
            keep.output().setType(torch._C.TensorType.create_from_tensor(
                torch.empty(kept_size, dtype=torch.bool)))
            chosen = values
            if accumulate.toIValue():
                add = graph.insertNode(graph.create("aten::add", [target, values,
                                                                  graph.insertConstant(1)]))
                add.output().setType(target.type())
                chosen = add.output()
            _replace(graph, node, "aten::where", [keep.output(), chosen, target])
        count += 1
    return count


def float_comparison_scalars(graph: torch._C.Graph) -> int:
    """`x < 0` with a float x compares with 0.0 (PyTorch promotes the int to x's dtype).
    Written so: Torch-MLIR's constant folder of a comparison of a float constant tensor
    (a `full_like`, once folded) with an int reads the floats' bits as integers and gives
    a wrong mask (`full_like(x, 2.5) < 0` folds to all true). Returns how many int
    constants were made floats."""
    count = 0
    for node in nodes_of(graph, _COMPARISONS):
        if schema_name(node) not in _COMPARISONS:
            continue
        tensor, scalar = list(node.inputs())[:2]
        if not isinstance(tensor.type(), torch._C.TensorType) or \
                tensor.type().scalarType() not in _FLOAT_DTYPES:
            continue
        value = scalar.toIValue() if scalar.node().kind() == "prim::Constant" else None
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        with graph.insert_point_guard(node):
            node.replaceInput(1, graph.insertConstant(float(value)))
        count += 1
    return count


_FLOAT_DTYPES = ("Float", "Double", "Half", "BFloat16")

# Ops with a Scalar divisor Torch-MLIR does not lower, and their Tensor overload, which it
# does.
_SCALAR_DIVISORS = {"aten::fmod.Scalar": "aten::fmod"}


def tensor_divisors(graph: torch._C.Graph) -> int:
    """`fmod(x, 3)` as `fmod(x, tensor(3))`, the constant a 0-dim tensor of the result's
    dtype (so type promotion gives that dtype again, and the scalar is converted to it as
    the Scalar overload does). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _SCALAR_DIVISORS):
        kind = _SCALAR_DIVISORS.get(schema_name(node))
        if kind is None:
            continue
        source, scalar = list(node.inputs())
        result = node.output()
        dtype = result.type().dtype() if isinstance(result.type(), torch._C.TensorType) \
            else None
        value = scalar.toIValue() if scalar.node().kind() == "prim::Constant" else None
        if dtype is None or not isinstance(value, (int, float)):
            continue
        with graph.insert_point_guard(node):
            _replace(graph, node, kind,
                     [source, graph.insertConstant(torch.tensor(value, dtype=dtype))])
        count += 1
    return count


# Reductions that take an optional dtype: the input is cast to it before reducing.
_DTYPE_REDUCTIONS = {"aten::sum.dim_IntList", "aten::sum", "aten::mean.dim", "aten::mean",
                     "aten::softmax.int", "aten::log_softmax.int", "aten::cumsum",
                     "aten::prod", "aten::prod.dim_int", "aten::cumprod"}


def reduction_dtypes(graph: torch._C.Graph) -> int:
    """`x.sum(dtype=torch.float64)` casts x before it sums; written as that cast
    (`_to_copy`) and the reduction without a dtype, both of which compile. Only for a
    floating dtype or int64, which the reduction without a dtype keeps (integers narrower
    than int64 would sum to int64). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _DTYPE_REDUCTIONS):
        if schema_name(node) not in _DTYPE_REDUCTIONS:
            continue
        names = [a.name for a in torch._C.parse_schema(node.schema()).arguments]
        if "dtype" not in names:
            continue
        position = names.index("dtype")
        source = node.inputsAt(0)
        dtype = node.inputsAt(position).toIValue()
        if dtype is None or not isinstance(source.type(), torch._C.TensorType) or \
                source.type().scalarType() is None:
            continue
        target = _DTYPE_BY_CODE.get(dtype)
        if target is None or not (target.is_floating_point or target == torch.int64):
            continue
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            if source.type().dtype() != target:
                false = graph.insertConstant(False)
                cast = graph.create("aten::_to_copy", [source, node.inputsAt(position), none,
                                                       none, none, false, none])
                graph.insertNode(cast)
                cast.output().setType(source.type().with_dtype(target))
                cast.copyMetadata(node)
                node.replaceInput(0, cast.output())
            node.replaceInput(position, none)
        count += 1
    return count


def _dtype_codes() -> Dict[int, torch.dtype]:
    """The dtypes by the int a graph's ScalarType constant holds, as TorchScript writes them."""
    graph = torch._C.Graph()
    return {graph.insertConstant(d).toIValue(): d
            for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64,
                      torch.int64)}


_DTYPE_BY_CODE = _dtype_codes()


# Reductions over dims: on a 0-d tensor (whose one "dim" is itself) each returns its input,
# in the result's dtype.
_DIM_REDUCTIONS = {"aten::sum.dim_IntList", "aten::mean.dim", "aten::amax", "aten::amin",
                   "aten::prod.dim_int", "aten::sum", "aten::mean", "aten::prod"}


def scalar_reductions(graph: torch._C.Graph) -> int:
    """A reduction of a 0-d tensor is a copy of it (a cast where the result's dtype
    differs, an integer sum's int64): Torch-MLIR's StableHLO lowering reduces over no dims,
    which StableHLO's linalg lowering leaves unconverted, and with keepdim it crashed the
    process. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _DIM_REDUCTIONS):
        if schema_name(node) not in _DIM_REDUCTIONS:
            continue
        source, result = node.inputsAt(0), node.output()
        if not all(isinstance(v.type(), torch._C.TensorType) and v.type().dim() == 0 and
                   v.type().dtype() is not None for v in (source, result)):
            continue
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            if source.type().dtype() == result.type().dtype():
                _replace(graph, node, "aten::clone", [source, none])
            else:
                false = graph.insertConstant(False)
                dtype = graph.insertConstant(result.type().dtype())
                _replace(graph, node, "aten::_to_copy",
                         [source, dtype, none, none, none, false, none])
        count += 1
    return count


# Ops compiled for batched NCHW input that PyTorch also takes unbatched (CHW).
_IMAGE_OPS = {"aten::avg_pool2d", "aten::max_pool2d", "aten::adaptive_avg_pool2d",
              "aten::conv2d"}


def batched_images(graph: torch._C.Graph) -> int:
    """An unbatched image (rank 3, CHW) given to a pooling or a conv2d becomes a batch of
    one: `op(x.unsqueeze(0)).squeeze(0)`, which is what PyTorch computes. Returns how many
    were rewritten."""
    count = 0
    for node in nodes_of(graph, _IMAGE_OPS):
        if schema_name(node) not in _IMAGE_OPS:
            continue
        image, result = node.inputsAt(0), node.output()
        if not all(isinstance(v.type(), torch._C.TensorType) and v.type().dim() == 3
                   for v in (image, result)):
            continue
        with graph.insert_point_guard(node):
            zero = graph.insertConstant(0)
            batch = graph.create("aten::unsqueeze", [image, zero])
            graph.insertNode(batch)
        batch.output().setType(image.type().with_sizes([1] + image.type().varyingSizes()))
        batch.copyMetadata(node)
        node.replaceInput(0, batch.output())
        unbatched_type = result.type()
        unbatch = graph.create("aten::squeeze", [result, zero])
        unbatch.insertAfter(node)
        unbatch.output().setType(unbatched_type)
        unbatch.copyMetadata(node)
        result.replaceAllUsesWith(unbatch.output())
        unbatch.replaceInput(0, result)
        result.setType(unbatched_type.with_sizes([1] + unbatched_type.varyingSizes()))
        count += 1
    return count


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
