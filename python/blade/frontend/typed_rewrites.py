"""Rewrites that need the graph's types, run once they are materialized: each writes a node
that neither Blade nor Torch-MLIR lowers as it is (or that Torch-MLIR lowers wrongly) as
the ops eager computes it with, for the dtypes and ranks where that differs.

- float math of integers (`erf`, `reciprocal`, `clamp` by float bounds, ...): the integer
  operand is cast to the result's dtype first, which is what eager computes in;
- integer sums and products into a narrower integer dtype: reduced in int64, then cast
  (the same value modulo 2**bits);
- `index_select` by a 0-d index: the index as a one-element list;
- a vector norm of a 0-d tensor: its absolute value;
- `x[..., idx]` (index.Tensor) with positions that may be negative: counted from the end
  first;
- integer floor division by a constant: the truncating division, corrected by the
  remainder's sign (exact for all int64);
- `matmul` of batches that broadcast (a batch of one against several): the batch of one as
  a matrix, other batches expanded to the common one;
- `scatter(x, dim, index, value)` with a value computed at run time: scattered from that
  value as a tensor, expanded to the index's shape;
- `embedding` with flags that shape only its gradient: without them.
"""
from typing import List, Optional

import torch

from blade.frontend.simplify import _replace, _static_sizes, nodes_of
from blade.partition.registry import schema_name

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


# Reductions whose integer results wrap: reducing in int64 and casting gives the same bits.
_WRAPPING_REDUCTIONS = {"aten::sum.dim_IntList", "aten::sum", "aten::cumsum", "aten::prod",
                        "aten::prod.dim_int", "aten::cumprod"}


def narrow_integer_reductions(graph: torch._C.Graph) -> int:
    """`x.sum(dtype=torch.int32)` of integers: summed without a dtype (in int64), then cast.
    (Floating dtypes and int64 are blade.frontend.simplify.reduction_dtypes'.) Returns how
    many were rewritten."""
    count = 0
    for node in nodes_of(graph, _WRAPPING_REDUCTIONS):
        if schema_name(node) not in _WRAPPING_REDUCTIONS:
            continue
        names = [a.name for a in torch._C.parse_schema(node.schema()).arguments]
        if "dtype" not in names:
            continue
        position = names.index("dtype")
        source, result = node.inputsAt(0), node.output()
        if node.inputsAt(position).toIValue() is None or \
                _scalar_type(source) not in _INTEGERS or \
                _scalar_type(result) not in _INTEGERS[:-1] or _scalar_type(result) == "Long":
            continue
        narrow = result.type()
        with graph.insert_point_guard(node):
            node.replaceInput(position, graph.insertConstant(None))
        result.setType(narrow.with_dtype(torch.int64))
        with graph.insert_point_guard(node):
            cast = _cast(graph, result, narrow.dtype(), node)
        cast.node().moveAfter(node)
        result.replaceAllUsesWith(cast)
        cast.node().replaceInput(0, result)
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
    expanded to the common batch. Returns how many were rewritten."""
    count = 0
    for node in nodes_of(graph, ("aten::matmul",)):
        left, right = node.inputsAt(0), node.inputsAt(1)
        shapes = [_static_sizes(v) for v in (left, right)]
        if schema_name(node) != "aten::matmul" or any(s is None or len(s) < 3 for s in shapes):
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
        # int() of a float truncates), item() the tensor's own value; then x's dtype.
        through = {"aten::Float": "Double", "aten::Int": "Long"}.get(producer.kind())
        if producer.kind() == "aten::Int" and _scalar_type(tensor) not in _INTEGERS:
            continue
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


def typed_rewrites(graph: torch._C.Graph) -> List[int]:
    """Every rewrite above, in order; how many nodes each rewrote."""
    return [rewrite(graph) for rewrite in (
        float_math_of_integers, narrow_integer_reductions, scalar_index_selects,
        scalar_vector_norms, negative_tensor_indices, integer_floor_divisions,
        broadcast_batch_matmuls, computed_scatter_values, embedding_training_flags)]
