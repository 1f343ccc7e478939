"""Rewrites that need the graph's types, run once they are materialized (blade.frontend.
simplify, in the order of REWRITES): each writes a node that neither Blade nor Torch-MLIR
lowers as it is, that Torch-MLIR lowers wrongly, or that clustering would keep out of an
engine, as the ops eager computes it with, for the dtypes and ranks where that differs.

- `x.to(dtype)` to another dtype as `_to_copy`, which says it gives a new tensor, and to
  x's own dtype as x itself;
- a float tensor compared with an int constant compares with the float;
- `fmod(x, 3)` as `fmod(x, tensor(3))`;
- a reduction given a float or int64 `dtype=` as a cast and the reduction without it;
- float math of integers (`erf`, `reciprocal`, `clamp` by float bounds, ...): the integer
  operand is cast to the result's dtype first, which is what eager computes in;
- integer sums and products into a narrower integer dtype: reduced in int64, then cast
  (the same value modulo 2**bits);
- `index_select` by a 0-d index: the index as a one-element list;
- a vector norm of a 0-d tensor: its absolute value;
- `x[..., idx]` (index.Tensor) with positions that may be negative: counted from the end
  first;
- integer floor division by a constant (in x's dtype's range): the truncating division,
  corrected by the remainder's sign (exact for every value of x);
- `matmul` of batches that broadcast (a batch of one against several): the batch of one as
  a matrix, other batches expanded to the common one; of two 3-d operands with one dynamic
  batch symbol: a `bmm`;
- `scatter(x, dim, index, value)` with a value computed at run time: scattered from that
  value as a tensor, expanded to the index's shape;
- `x >> 3` of integers: a shift by a 0-d tensor;
- `embedding` with flags that shape only its gradient: without them;
- a reduction of a 0-d tensor as a copy or a cast;
- an unbatched image given to a 2-d pooling or conv2d as a batch of one;
- and, with the graph's structure passes, `x[mask] = v` as a `where` (bool_mask_writes),
  v one value, a value per trailing position, or a row per selected position gathered in
  order (with eager's check of their count).
"""
import math
from typing import Dict, List, Optional

import torch

from blade.graph_queries import nodes_of, schema_name
from blade.partition.kernel_calls import VALUE_SIZED
from blade.partition.registry import is_materialized


# The casts (self, dtype, ...) by overload: the positions of their non_blocking, copy and
# memory_format arguments. Those between dtype and non_blocking (layout, device,
# pin_memory) must be None.
_CASTS = {"aten::to.dtype": (2, 3, 4), "aten::to.dtype_layout": (5, 6, 7)}
# torch.preserve_format as TorchScript holds it: an int, c10::MemoryFormat::Preserve.
_PRESERVE_FORMAT = 1


def fresh_casts(graph: torch._C.Graph) -> int:
    """`x.to(dtype)` returns x itself when x has that dtype already, so its schema says the
    result may alias x, and clustering would keep it out of engines (which return fresh
    tensors). With the types materialized both cases are known: a cast to another dtype
    gives a new tensor and becomes `aten::_to_copy`, which eager runs for it anyway and
    whose schema says so; a cast to the dtype x has, without `copy=True` or a memory
    format, is x, and its uses read x directly (eager's aliasing, exactly). Returns how
    many were rewritten."""
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
        if any(not isinstance(v.type(), torch._C.NoneType) for v in inputs[2:non_blocking]):
            continue  # a layout, device or pin_memory given
        copy = inputs[copy_flag].toIValue()
        if not isinstance(copy, bool):
            continue  # copy= is not a constant
        if source.type().scalarType() == result.type().scalarType():
            if not copy and _preserves_format(inputs[memory_format]):
                result.replaceAllUsesWith(source)
                node.destroy()
                count += 1
            continue
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            _replace(graph, node, "aten::_to_copy", [source, inputs[1], none, none, none,
                                                      inputs[non_blocking],
                                                      inputs[memory_format]])
        count += 1
    return count


def _preserves_format(memory_format: torch._C.Value) -> bool:
    """Whether a cast's memory_format argument is None or torch.preserve_format: then a
    cast to the tensor's own dtype returns the tensor whatever its strides."""
    if isinstance(memory_format.type(), torch._C.NoneType):
        return True
    return memory_format.node().kind() == "prim::Constant" and \
        memory_format.toIValue() == _PRESERVE_FORMAT


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


def _tensor_type(sizes: List[int], dtype: torch.dtype) -> torch._C.TensorType:
    return torch._C.TensorType.create_from_tensor(torch.empty(sizes, dtype=dtype))


def _rows_for_mask(graph: torch._C.Graph, node: torch._C.Node, mask: torch._C.Value,
                   values: torch._C.Value, mask_size: List[int],
                   value_size: List[int]) -> torch._C.Value:
    """Values [R, ...], one row per position the mask selects, in order, laid out over the
    mask's positions: row `cumsum(mask) - 1` at each (clamped at the positions not
    selected, which the `where` does not read). Adds the check that the mask selects R
    positions, which eager makes (raising a shape mismatch) and the gather cannot."""
    positions = math.prod(mask_size)
    rows = value_size[0]
    flat = _insert(graph, "aten::reshape", [mask, graph.insertConstant([positions])],
                   _tensor_type([positions], torch.bool), node)
    none = graph.insertConstant(None)
    # As int64: a cumsum of bools would not be Blade's (whose long scans call the kernel).
    counted = _cast(graph, flat, torch.int64, node)
    ordinal = _insert(graph, "aten::cumsum", [counted, graph.insertConstant(0), none],
                      _tensor_type([positions], torch.int64), node)
    index = _insert(graph, "aten::sub", [ordinal, graph.insertConstant(1),
                                         graph.insertConstant(1)],
                    _tensor_type([positions], torch.int64), node)
    index = _insert(graph, "aten::clamp", [index, graph.insertConstant(0),
                                           graph.insertConstant(rows - 1)],
                    _tensor_type([positions], torch.int64), node)
    dtype = values.type().dtype()
    gathered = _insert(graph, "aten::index_select", [values, graph.insertConstant(0), index],
                       _tensor_type([positions] + value_size[1:], dtype), node)
    laid_out = _insert(graph, "aten::reshape",
                       [gathered, graph.insertConstant(mask_size + value_size[1:])],
                       _tensor_type(mask_size + value_size[1:], dtype), node)
    selected = _insert(graph, "aten::sum", [mask, none], _tensor_type([], torch.int64), node)
    selected_count = graph.insertNode(graph.create("aten::Int", [selected]))
    selected_count.output().setType(torch._C.IntType.get())
    differs = graph.insertNode(graph.create("aten::ne", [selected_count.output(),
                                                         graph.insertConstant(rows)]))
    differs.output().setType(torch._C.BoolType.get())
    check = graph.insertNode(graph.create("prim::If", [differs.output()], 0))
    for made in (selected_count, differs, check):
        made.copyMetadata(node)
    message = graph.insertConstant(
        f"shape mismatch: index_put of a value tensor of shape {value_size} by a bool mask "
        f"of shape {mask_size}: the mask must select {rows} positions, one per row")
    kind = graph.insertConstant("builtins.RuntimeError")
    for position in (message, kind):
        position.node().moveBefore(check)
    raising = check.addBlock()
    check.addBlock()
    raise_node = graph.create("prim::RaiseException", [message, kind], 0)
    raise_node.insertBefore(raising.returnNode())
    raise_node.copyMetadata(node)
    return laid_out


# index_put by Tensor?[] indices, and by Tensor[] (the overload TorchScript resolves
# `torch.ops.aten.index_put(x, [mask], v)` to).
_INDEX_PUTS = ("aten::index_put", "aten::index_put.hacked_twin")


def _fixed_sizes(value: torch._C.Value) -> bool:
    """Whether `value`'s sizes follow from the sizes of the graph's inputs alone (which the
    input guard fixes), not from data: no op of its making selects by value (`x[m]`,
    `nonzero`, ...; blade.partition.kernel_calls) or comes out of an `if` or a loop."""
    pending, seen = [value.node()], set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.kind() in VALUE_SIZED or node.kind() in ("prim::If", "prim::Loop"):
            return False
        pending.extend(v.node() for v in node.inputs())
    return True


def bool_mask_writes(graph: torch._C.Graph) -> int:
    """`x[mask] = v`, once remove_mutation has made it `aten::index_put(x, [mask], v, acc)`,
    selects where the mask, a bool over x's leading dims, is true: `where(mask, v, x)`
    (`where(mask, x + v, x)` accumulating), with static shapes, where v is
    - one value, or one per trailing position (broadcast alike to every selected row), or
    - one row per selected position ([R, ...]): row i goes to the i-th selected position,
      gathered at `cumsum(mask) - 1` (_rows_for_mask), with eager's check that the mask
      selects R positions; only where R cannot follow the data (the rows of `x[m]` number
      what m selects, in each call). The cumsum over the positions is compiled for short
      masks and a call of PyTorch's linear scan for long ones (converters.reduction.
      LONGEST_COMPILED_SCAN).
    Neither Blade nor Torch-MLIR compiles index_put by a mask (the number of positions it
    selects depends on the data). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _INDEX_PUTS):
        if schema_name(node) not in _INDEX_PUTS:
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
        if not 0 < len(mask_size) <= len(size) or size[:len(mask_size)] != mask_size:
            continue
        per_row = len(value_size) == len(trailing) + 1
        if per_row and not (0 < value_size[0] and _fixed_sizes(values)):
            continue
        if per_row and value_size[0] == 1:
            per_row, value_size = False, value_size[1:]  # one row: broadcast to every one
        if len(value_size) - per_row > len(trailing) or \
                any(v not in (1, t) for v, t in zip(reversed(value_size[per_row:]),
                                                     reversed(trailing))):
            continue
        kept_size = mask_size + [1] * len(trailing)
        with graph.insert_point_guard(node):
            keep = _insert(graph, "aten::reshape", [mask, graph.insertConstant(kept_size)],
                           _tensor_type(kept_size, torch.bool), node)
            if per_row:
                chosen = _rows_for_mask(graph, node, mask, values, mask_size, value_size)
            elif value_size != _static_sizes(values):
                chosen = _insert(graph, "aten::reshape",
                                 [values, graph.insertConstant(value_size)],
                                 _tensor_type(value_size, values.type().dtype()), node)
            else:
                chosen = values
            if accumulate.toIValue():
                chosen = _insert(graph, "aten::add", [target, chosen, graph.insertConstant(1)],
                                 target.type(), node)
            _replace(graph, node, "aten::where", [keep, chosen, target])
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


# Those whose integer results wrap: reducing in int64 and casting gives the same bits.
_WRAPPING_REDUCTIONS = {"aten::sum.dim_IntList", "aten::sum", "aten::cumsum", "aten::prod",
                        "aten::prod.dim_int", "aten::cumprod"}


def reduction_dtypes(graph: torch._C.Graph) -> int:
    """`x.sum(dtype=torch.float64)` casts x before it sums; written as that cast
    (`_to_copy`) and the reduction without a dtype, both of which compile, for a floating
    dtype or int64, which the reduction without a dtype keeps. Integers reduced to a
    narrower integer dtype (`x.sum(dtype=torch.int32)`; without one they would reduce to
    int64) are reduced without it, in int64, and the result cast: the same bits, where the
    reduction wraps. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _DTYPE_REDUCTIONS):
        if schema_name(node) not in _DTYPE_REDUCTIONS:
            continue
        names = [a.name for a in torch._C.parse_schema(node.schema()).arguments]
        if "dtype" not in names:
            continue
        position = names.index("dtype")
        source, result = node.inputsAt(0), node.output()
        target = node.inputsAt(position).toIValue()
        if target is None or _scalar_type(source) is None:
            continue
        cast_first = _DTYPE_BY_CODE.get(target)
        if cast_first is not None and (cast_first.is_floating_point or
                                       cast_first == torch.int64):
            with graph.insert_point_guard(node):
                if source.type().dtype() != cast_first:
                    node.replaceInput(0, _cast(graph, source, cast_first, node))
                node.replaceInput(position, graph.insertConstant(None))
        elif schema_name(node) in _WRAPPING_REDUCTIONS and _scalar_type(source) in _INTEGERS \
                and _scalar_type(result) in _INTEGERS[:-1] and _scalar_type(result) != "Long":
            narrow = result.type()
            with graph.insert_point_guard(node):
                node.replaceInput(position, graph.insertConstant(None))
            result.setType(narrow.with_dtype(torch.int64))
            with graph.insert_point_guard(node):
                cast = _cast(graph, result, narrow.dtype(), node)
            cast.node().moveAfter(node)
            result.replaceAllUsesWith(cast)
            cast.node().replaceInput(0, result)
        else:
            continue
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


# Ops computing in floating point whatever their operand: eager casts an integer operand to
# the result's dtype (the default float dtype) before the math.
_FLOAT_MATH = {f"aten::{name}" for name in (
    "erf", "erfc", "erfinv", "reciprocal", "exp", "exp2", "expm1", "log", "log2", "log10",
    "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "sqrt", "rsqrt", "sigmoid", "lgamma", "digamma", "i0", "sinc")} | {
    "aten::clamp", "aten::clamp.Tensor"}

_INTEGERS = ("Byte", "Char", "Short", "Int", "Long", "Bool")
_FLOATS = ("Float", "Double", "Half", "BFloat16")
_DTYPES = {"Double": torch.float64, "Long": torch.int64}


def _scalar_type(value: torch._C.Value) -> Optional[str]:
    t = value.type()
    return t.scalarType() if isinstance(t, torch._C.TensorType) else None


def _insert(graph: torch._C.Graph, kind: str, inputs, result_type,
            source: torch._C.Node) -> torch._C.Value:
    node = graph.create(kind, inputs)
    graph.insertNode(node)
    node.output().setType(result_type)
    node.copyMetadata(source)
    return node.output()


def _cast(graph: torch._C.Graph, value: torch._C.Value, dtype: torch.dtype,
          source: torch._C.Node) -> torch._C.Value:
    none = graph.insertConstant(None)
    return _insert(graph, "aten::_to_copy",
                   [value, graph.insertConstant(dtype), none, none, none,
                    graph.insertConstant(False), none],
                   value.type().with_dtype(dtype), source)


def float_math_of_integers(graph: torch._C.Graph) -> int:
    """Returns how many integer operands of float math were cast first."""
    count = 0
    for node in nodes_of(graph, _FLOAT_MATH):
        if schema_name(node) not in _FLOAT_MATH:
            continue
        operand, result = node.inputsAt(0), node.output()
        if _scalar_type(operand) not in _INTEGERS or _scalar_type(result) not in _FLOATS:
            continue
        with graph.insert_point_guard(node):
            node.replaceInput(0, _cast(graph, operand, result.type().dtype(), node))
        count += 1
    return count


def scalar_index_selects(graph: torch._C.Graph) -> int:
    """`index_select(x, dim, i)` with a 0-d i selects a dim of one: i becomes [i]. Returns
    how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::index_select",)):
        index = node.inputsAt(2)
        if schema_name(node) != "aten::index_select" or \
                not isinstance(index.type(), torch._C.TensorType) or index.type().dim() != 0:
            continue
        with graph.insert_point_guard(node):
            listed = _insert(graph, "aten::unsqueeze", [index, graph.insertConstant(0)],
                             index.type().with_sizes([1]), node)
            node.replaceInput(2, listed)
        count += 1
    return count


def scalar_vector_norms(graph: torch._C.Graph) -> int:
    """A vector norm of a 0-d tensor is its absolute value (for order 0: whether it is not
    zero), in the result's dtype. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::linalg_vector_norm",)):
        source, result = node.inputsAt(0), node.output()
        order = node.inputsAt(1).toIValue() if \
            node.inputsAt(1).node().kind() == "prim::Constant" else None
        if schema_name(node) != "aten::linalg_vector_norm" or order is None or \
                not all(isinstance(v.type(), torch._C.TensorType) and v.type().dim() == 0 and
                        _scalar_type(v) in _FLOATS for v in (source, result)):
            continue
        with graph.insert_point_guard(node):
            if order == 0:
                value = _insert(graph, "aten::ne", [source, graph.insertConstant(0)],
                                source.type().with_dtype(torch.bool), node)
            else:
                value = _insert(graph, "aten::abs", [source], source.type(), node)
            if _scalar_type(value) != _scalar_type(result):
                value = _cast(graph, value, result.type().dtype(), node)
        result.replaceAllUsesWith(value)
        node.destroy()
        count += 1
    return count


def negative_tensor_indices(graph: torch._C.Graph) -> int:
    """`aten::index(x, [None, ..., i, ...])` with integer index tensors, which may hold
    positions counted from the end: each i becomes `where(i < 0, i + size, i)` for its dim's size
    (a constant, or `x.size(d)` for a dynamic dim). Torch-MLIR's gather clamps a negative
    position to 0: a wrong answer wherever the example inputs had none for the engine check
    to see. Returns how many indices were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::index",)):
        source, listed = node.inputsAt(0), node.inputsAt(1).node()
        if schema_name(node) != "aten::index.Tensor" or listed.kind() != "prim::ListConstruct" \
                or not isinstance(source.type(), torch._C.TensorType) or \
                source.type().dim() is None:
            continue
        sizes = source.type().symbolic_sizes()
        indices = list(listed.inputs())
        if any(_scalar_type(i) in ("Bool", "Byte") for i in indices):
            continue  # a mask covers dims of its own
        for position, index in enumerate(indices):
            if _scalar_type(index) not in ("Int", "Long") or position >= len(sizes):
                continue
            with graph.insert_point_guard(node):
                if sizes[position] >= 0:
                    size = graph.insertConstant(sizes[position])
                else:
                    size = graph.insertNode(graph.create(
                        "aten::size", [source, graph.insertConstant(position)])).output()
                    size.setType(torch._C.IntType.get())
                negative = _insert(graph, "aten::lt", [index, graph.insertConstant(0)],
                                   index.type().with_dtype(torch.bool), node)
                from_end = _insert(graph, "aten::add", [index, size, graph.insertConstant(1)],
                                   index.type(), node)
                wrapped = _insert(graph, "aten::where", [negative, from_end, index],
                                  index.type(), node)
            listed.replaceInput(position, wrapped)
            count += 1
    return count


# Integer floor divisions by a divisor given as a Scalar or as a 0-d constant tensor.
_FLOOR_DIVISIONS = {"aten::div.Scalar_mode", "aten::div.Tensor_mode",
                    "aten::floor_divide.Scalar", "aten::floor_divide"}


def _constant_integer(value: torch._C.Value) -> Optional[int]:
    if value.node().kind() != "prim::Constant":
        return None
    constant = value.toIValue()
    if isinstance(constant, torch.Tensor) and constant.dim() == 0 and \
            not constant.is_floating_point() and not constant.is_complex():
        constant = int(constant)
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def integer_floor_divisions(graph: torch._C.Graph) -> int:
    """`x // c` of integers by a constant c, as the truncating division q, moved down by one
    where the remainder is not zero and its sign differs from c's:
    `where(x - q * c < 0, q - 1, q)` for c > 0. Torch-MLIR lowers a floor division through
    float64, which Blade's integer_division pass recognizes and makes exact where c is a
    tensor; a constant c is folded into a float64 constant first, and int64 values beyond
    2**53 rounded (9223372036854775806 // 2**30 gave 2**33). The truncating division
    compiles exact. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _FLOOR_DIVISIONS):
        name = schema_name(node)
        if name not in _FLOOR_DIVISIONS:
            continue
        inputs = list(node.inputs())
        source, divisor, result = inputs[0], _constant_integer(inputs[1]), node.output()
        if name.startswith("aten::div") and inputs[2].toIValue() != "floor":
            continue
        if divisor is None or divisor == 0 or _scalar_type(source) not in _INTEGERS[:-1] or \
                _scalar_type(result) != _scalar_type(source):
            continue
        limits = torch.iinfo(source.type().dtype())
        if not limits.min <= divisor <= limits.max:
            continue  # eager wraps it into x's dtype first
        with graph.insert_point_guard(node):
            c = graph.insertConstant(divisor)
            quotient = _insert(graph, "aten::div", [source, c, graph.insertConstant("trunc")],
                               result.type(), node)
            product = _insert(graph, "aten::mul", [quotient, c], result.type(), node)
            rest = _insert(graph, "aten::sub", [source, product, graph.insertConstant(1)],
                           result.type(), node)
            zero = graph.insertConstant(0)
            down = _insert(graph, "aten::lt" if divisor > 0 else "aten::gt", [rest, zero],
                           result.type().with_dtype(torch.bool), node)
            lower = _insert(graph, "aten::sub", [quotient, graph.insertConstant(1),
                                                 graph.insertConstant(1)], result.type(), node)
            _replace(graph, node, "aten::where", [down, lower, quotient])
        count += 1
    return count


def broadcast_batch_matmuls(graph: torch._C.Graph) -> int:
    """`matmul` of two batched operands (rank >= 3) whose batch dims differ but broadcast,
    which Torch-MLIR's decomposition refuses: an operand with a batch of one (and no more
    batch dims than the other) becomes a matrix, a GEMM over the other's rows; any other is
    expanded to the common batch. Two 3-d operands with one dynamic batch symbol, which it
    refuses too, become a `bmm`. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::matmul",)):
        left, right = node.inputsAt(0), node.inputsAt(1)
        if schema_name(node) != "aten::matmul":
            continue
        symbolic = [list(v.type().symbolic_sizes())
                    if isinstance(v.type(), torch._C.TensorType) and
                    is_materialized(v, static_shapes=False) else None for v in (left, right)]
        if all(s is not None and len(s) == 3 for s in symbolic) and \
                symbolic[0][0] == symbolic[1][0] < 0:
            # One batch symbol: equal at run time (the guard checks it), which Torch-MLIR
            # cannot tell from two dynamic dims, so it refuses the matmul; a bmm it takes.
            with graph.insert_point_guard(node):
                _replace(graph, node, "aten::bmm", [left, right])
            count += 1
            continue
        shapes = [_static_sizes(v) for v in (left, right)]
        if any(s is None or len(s) < 3 for s in shapes):
            continue
        batches = [shape[:-2] for shape in shapes]
        if batches[0] == batches[1]:
            continue
        try:
            batch = list(torch.broadcast_shapes(torch.Size(batches[0]), torch.Size(batches[1])))
        except RuntimeError:
            continue  # eager raises for these; left as they are
        with graph.insert_point_guard(node):
            for position, (value, shape) in enumerate(zip((left, right), shapes)):
                own, other = batches[position], batches[1 - position]
                if own == batch:
                    continue
                if all(size == 1 for size in own) and len(own) <= len(other):
                    matrix = shape[-2:]
                    replacement = _insert(graph, "aten::reshape",
                                          [value, graph.insertConstant(matrix)],
                                          value.type().with_sizes(matrix), node)
                else:
                    full = batch + shape[-2:]
                    replacement = _insert(graph, "aten::expand",
                                          [value, graph.insertConstant(full),
                                           graph.insertConstant(False)],
                                          value.type().with_sizes(full), node)
                node.replaceInput(position, replacement)
        count += 1
    return count


_SCATTER_VALUES = {"aten::scatter.value": "aten::scatter"}
# The dtypes that hold every value of a dtype: what a scalar of it may be cast to without
# eager's overflow check ever raising.
_HOLDS = {"Double": ("Double",), "Float": ("Float", "Double"),
          "Long": ("Long", "Float", "Double"), "Int": ("Int", "Long", "Float", "Double"),
          "Short": ("Short", "Int", "Long", "Float", "Double"),
          "Char": ("Char", "Short", "Int", "Long", "Float", "Double", "Half", "BFloat16"),
          "Byte": ("Byte", "Short", "Int", "Long", "Float", "Double", "Half", "BFloat16"),
          "Bool": ("Bool", "Byte", "Char", "Short", "Int", "Long", "Float", "Double", "Half",
                   "BFloat16")}


def computed_scatter_values(graph: torch._C.Graph) -> int:
    """`scatter(x, dim, index, float(t))`, the value read from a tensor at run time: the
    value scattered as that tensor instead, cast to x's dtype and expanded to the index's
    shape (a constant value compiles as it is). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, _SCATTER_VALUES):
        kind = _SCATTER_VALUES.get(schema_name(node))
        if kind is None:
            continue
        target, dim, index, value = node.inputs()
        producer = value.node()
        if producer.kind() not in ("aten::Float", "aten::Int", "aten::item",
                                   "aten::ScalarImplicit"):
            continue
        tensor = producer.inputsAt(0)
        sizes = _static_sizes(index)
        if sizes is None or not isinstance(tensor.type(), torch._C.TensorType) or \
                tensor.type().dim() != 0 or _scalar_type(target) is None or \
                _scalar_type(tensor) is None:
            continue
        # The scalar eager scatters: float() a double, int() an int64 (of integers only:
        # int() of a float truncates), item() the tensor's own value; then x's dtype, which
        # must hold every value of the tensor's dtype (eager raises for one that overflows).
        through = {"aten::Float": "Double", "aten::Int": "Long"}.get(producer.kind())
        if producer.kind() == "aten::Int" and _scalar_type(tensor) not in _INTEGERS:
            continue
        if _scalar_type(target) not in _HOLDS.get(_scalar_type(tensor), ()):
            continue  # the values the tensor can hold, whatever the scalar passes through
        dtype = target.type().dtype()
        with graph.insert_point_guard(node):
            source = tensor
            if through is not None and _scalar_type(source) != through:
                source = _cast(graph, source, _DTYPES[through], node)
            if _scalar_type(source) != _scalar_type(target):
                source = _cast(graph, source, dtype, node)
            source = _insert(graph, "aten::expand",
                             [source, graph.insertConstant(sizes), graph.insertConstant(False)],
                             target.type().with_sizes(sizes).with_dtype(dtype), node)
            _replace(graph, node, kind, [target, dim, index, source])
        count += 1
    return count


def shifts_by_scalars(graph: torch._C.Graph) -> int:
    """`x >> 3` of an integer tensor (not bool, which eager promotes) by a constant within
    its width: a shift by a tensor of x's dtype, which Torch-MLIR lowers (it refuses the
    Scalar overload). Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::__rshift__",)):
        if schema_name(node) != "aten::__rshift__.Scalar":
            continue
        source, amount = node.inputsAt(0), node.inputsAt(1)
        shift = amount.toIValue() if amount.node().kind() == "prim::Constant" else None
        if _scalar_type(source) not in _INTEGERS[:-1] or not isinstance(shift, int) or \
                isinstance(shift, bool) or _scalar_type(node.output()) != _scalar_type(source):
            continue
        if not 0 <= shift < torch.iinfo(source.type().dtype()).bits:
            continue
        with graph.insert_point_guard(node):
            by = graph.insertConstant(torch.tensor(shift, dtype=source.type().dtype()))
            _replace(graph, node, "aten::bitwise_right_shift", [source, by])
        count += 1
    return count


def embedding_training_flags(graph: torch._C.Graph) -> int:
    """`embedding`'s padding_idx, scale_grad_by_freq and sparse shape only its gradient:
    the lookup is written without them, which Torch-MLIR lowers (it refuses the flags).
    Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::embedding",)):
        if schema_name(node) != "aten::embedding":
            continue
        flags = list(node.inputs())[2:]
        if [v.toIValue() if v.node().kind() == "prim::Constant" else None
                for v in flags] == [-1, False, False]:
            continue
        with graph.insert_point_guard(node):
            for position, default in ((2, -1), (3, False), (4, False)):
                node.replaceInput(position, graph.insertConstant(default))
        count += 1
    return count


# In order: the casts first (later rewrites read the dtypes they leave).
REWRITES = (fresh_casts, float_comparison_scalars, tensor_divisors, reduction_dtypes,
            float_math_of_integers, scalar_index_selects, scalar_vector_norms,
            negative_tensor_indices, integer_floor_divisions,
            broadcast_batch_matmuls, computed_scatter_values, shifts_by_scalars,
            embedding_training_flags, scalar_reductions, batched_images)
