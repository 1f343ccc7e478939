"""Attention as one library call: softmax(q @ k^T * scale + mask) @ v.

Hand-written attention, `F.scaled_dot_product_attention` and the attention inside
nn.MultiheadAttention / nn.TransformerEncoderLayer (decompositions.py) all reach StableHLO
as the same chain: a batched dot_general, a multiply (or divide) by a constant, an add of
a mask broadcast to the scores, softmax as reduce-max / subtract / exponential /
reduce-add / divide over the last dim, and a second dot_general by v. Compiled op by op,
the scores are written to memory and read back four times and every step is a parallel
region of its own; PyTorch's fused CPU attention (flash attention) keeps a block of
scores in cache and runs the whole chain in one parallel loop.

`attention_chain` recognizes the chain from its last dot_general; `outlining.outline`
then moves it into one function marked `blade.library_call = "attention"` (or
"attention_masked"), whose body stays the real computation until `lowering.lower`
replaces it with a call to `blade_ral_attention[_masked]_<type>` (csrc/ral/ral_kernels.h).
A chain whose intermediate values are used anywhere else (the scores or the probabilities
returned, say) is left alone and compiled op by op.

Heads split out of a projection's result (`x.view(b, n, heads, d).transpose(1, 2)`, q, k
and v often slices of one fused projection) would be copied head by head before the
call. Where q, k or v is such a transpose of a reshape that splits the last dim of a value
no loop computes (an input, a library or kernel call's result), or of a slice of that dim,
the call takes that value instead and `lowering.lower` hands the kernel a strided view of
it (`head_view`): the kernel reads the heads in place.

A query row whose scores are all -inf (its mask excludes every key) makes softmax 0/0 =
NaN. `F.scaled_dot_product_attention` gives 0 there (PyTorch's safe softmax; its
decomposition selects 0 for rows whose max is -inf): a chain with that select runs with
the kernel's `zero_masked_rows`, one without it keeps NaN.
"""
import itertools
from typing import List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.ir_queries import as_operation, defining_op as _op, i64_array, producer
from blade.codegen.kernels.matmul import matmul_form
from blade.codegen.stablehlo.shape_assumptions import passed_through


# Ops between a reduction and the op that broadcasts its result back over the row.
_RESHAPES = ("stablehlo.reshape", "stablehlo.dynamic_reshape", "stablehlo.broadcast_in_dim",
             "stablehlo.dynamic_broadcast_in_dim")
_CONSTANTS = ("stablehlo.constant", "arith.constant")
# Ops that pass a splat or one element on unchanged in value (up to a float conversion).
_SCALAR_PASSING = ("stablehlo.reshape", "stablehlo.convert", "stablehlo.broadcast_in_dim",
                   "stablehlo.dynamic_broadcast_in_dim")


def _splat(value) -> Optional[float]:
    """The value of a constant splat tensor, looking through reshapes, converts and
    broadcasts of it; None for anything else."""
    while True:
        op = _op(value)
        if op is None:
            return None
        if op.name in _CONSTANTS:
            attr = op.attributes["value"]
            if not isinstance(attr, ir.DenseFPElementsAttr) or not attr.is_splat:
                return None
            return float(ir.FloatAttr(attr.get_splat_value()).value)
        if op.name not in _SCALAR_PASSING:
            return None
        value = op.operands[0]


def _keeps_rows(op) -> bool:
    """Whether a reshape or broadcast between a row reduction and its use only adds (or
    stretches) the trailing row dim: each row's value stays with its row."""
    source = ir.ShapedType(op.operands[0].type)
    if "broadcast" in op.name:
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        return dims == list(range(source.rank))
    target = ir.ShapedType(op.result.type)
    leading = min(source.rank, target.rank)
    return abs(source.rank - target.rank) == 1 and \
        list(source.shape[:leading]) == list(target.shape[:leading]) and \
        (source.shape[leading:] + target.shape[leading:]) == [1]


def _below_row_reshapes(value):
    """The op under the reshapes and broadcasts that keep each row's value with its row
    (see _keeps_rows) through which `value` is made; None for another reshape or a block
    argument."""
    op = _op(value)
    while op is not None and op.name in _RESHAPES:
        if not _keeps_rows(op):
            return None
        op = _op(op.operands[0])
    return op


def _row_reduction(value, combiner: str, initial: float, rank: int):
    """The reduce over the last dim with `combiner` and init `initial` that `value`
    broadcasts back over the row, and its input; None when it is not one."""
    op = _below_row_reshapes(value)
    if op is None or op.name != "stablehlo.reduce" or len(op.operands) != 2:
        return None
    if list(ir.DenseI64ArrayAttr(op.attributes["dimensions"])) != [rank - 1]:
        return None
    if _splat(op.operands[1]) != initial:
        return None
    body = op.regions[0].blocks[0]
    if [o.name for o in body.operations] != [combiner, "stablehlo.return"]:
        return None
    return op, op.operands[0]


def _through_identity_broadcast(value):
    """The source of a broadcast_in_dim that changes nothing (same shape, dims in order)."""
    op = _op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim" and \
            op.operands[0].type == op.result.type and \
            list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])) == \
            list(range(ir.ShapedType(op.result.type).rank)):
        return op.operands[0]
    return value


def _zeroed_masked_rows(value, rank: int):
    """For `select(rowmax(logits) == -inf, 0, probabilities)` (the safe softmax of
    decompositions.py): (probabilities, logits); None for anything else."""
    select = _op(value)
    if select is None or select.name != "stablehlo.select":
        return None
    predicate, on_true, on_false = select.operands
    if _splat(on_true) != 0.0:
        return None
    compare = _below_row_reshapes(predicate)
    if compare is None or compare.name != "stablehlo.compare":
        return None
    direction = compare.attributes["comparison_direction"]
    if stablehlo.ComparisonDirectionAttr(direction).value != "EQ":
        return None
    for row_max, bound in ((compare.operands[0], compare.operands[1]),
                           (compare.operands[1], compare.operands[0])):
        reduction = _row_reduction(row_max, "stablehlo.maximum", float("-inf"), rank)
        if reduction is not None and _splat(bound) == float("-inf"):
            return _through_identity_broadcast(on_false), reduction[1]
    return None


def _binary(value, name: str):
    op = _op(value)
    return op if op is not None and op.name == name else None


def _run_time_scalar(value):
    """The one-element float tensor whose value `value` broadcasts (looking through
    reshapes, converts and broadcasts of one element), when it is not a constant: a scale
    computed at run time, such as 1 / sqrt(q.size(-1)) in a dynamic engine. None
    otherwise."""
    found = None
    while True:
        shaped = ir.ShapedType(value.type)
        if _one_element(shaped) and isinstance(shaped.element_type, ir.FloatType):
            found = value
        op = _op(value)
        if op is not None and op.name in _CONSTANTS:
            return None
        if op is None or op.name not in _SCALAR_PASSING or \
                not _one_element(ir.ShapedType(op.operands[0].type)):
            return found
        value = op.operands[0]


def _one_element(shaped) -> bool:
    return shaped.has_static_shape and all(d == 1 for d in shaped.shape)


def _scores(value):
    """(the dot_general, the scale) of `q @ k^T`, `q @ k^T * c`, `c * q @ k^T` or
    `q @ k^T / c`; None otherwise. The scale is a float, or for a `c` computed at run time
    (`_run_time_scalar`), (the one-element tensor holding it, whether it divides)."""
    op = _op(value)
    if op is not None and op.name == "stablehlo.dot_general":
        return op, 1.0
    if op is not None and op.name in ("stablehlo.multiply", "stablehlo.divide"):
        divides = op.name == "stablehlo.divide"
        for product, factor in ((op.operands[0], op.operands[1]),
                                (op.operands[1], op.operands[0])):
            dot = _op(product)
            if dot is None or dot.name != "stablehlo.dot_general" or \
                    (divides and product != op.operands[0]):
                continue
            c = _splat(factor)
            if c is None:
                scalar = _run_time_scalar(factor)
                if scalar is not None:
                    return dot, (scalar, divides)
                continue
            if divides and c == 0.0:
                continue
            return dot, (1.0 / c if divides else c)
    return None


def _mask_source(value, rank: int, element_type):
    """The mask an add broadcasts over the scores (peeling a trailing-aligned broadcast),
    or None when `value` is not one the kernel takes."""
    op = _op(value)
    if op is not None and op.name in ("stablehlo.broadcast_in_dim",
                                      "stablehlo.dynamic_broadcast_in_dim"):
        source = op.operands[0]
        source_rank = ir.ShapedType(source.type).rank
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        if dims == list(range(rank - source_rank, rank)):
            value = source
    shaped = ir.ShapedType(value.type)
    if shaped.rank < 1 or shaped.rank > rank or shaped.element_type != element_type:
        return None
    return value


# What makes a value no loop computes: the heads' transposed copy of it is a copy alone.
# The heads of a value a loop makes (a bias add) are written by that loop, fused with the
# transpose, so reading them in place would save nothing (and strided rows read slower:
# BERT-base's float32 attention 291 -> 300 us).
_UNFUSED = ("func.call", "stablehlo.dot_general", "stablehlo.convolution")


def head_view(value) -> Optional[Tuple[object, dict]]:
    """(base, view) when `value` is `transpose(reshape(x))`, the reshape splitting the last
    dim of x into [heads, head dim] and keeping the others, x is `base` or a slice of
    base's last dim with unit step, and base is an input or a library call's result (see
    _UNFUSED): `value` is then a strided view of base, `view` =
    {"start": the slice's first element, "split": [heads, head dim], "permutation": the
    transpose's}. None otherwise.

    Example:
        >>> head_view(q)   # q = transpose(reshape(slice(qkv, 512:1024), [b, n, 8, 64]))
        (qkv, {'start': 512, 'split': [8, 64], 'permutation': [0, 2, 1, 3]})
    """
    transpose = producer(value, "stablehlo.transpose")
    if transpose is None:
        return None
    reshaped = transpose.operands[0]
    reshape = _op(reshaped)
    if reshape is None or reshape.name not in ("stablehlo.reshape",
                                               "stablehlo.dynamic_reshape"):
        return None
    x = reshape.operands[0]
    x_type, split_type = ir.RankedTensorType(x.type), ir.RankedTensorType(reshaped.type)
    n = x_type.rank
    if n < 1 or split_type.rank != n + 1 or not isinstance(x_type.element_type, ir.FloatType):
        return None
    if any(t.is_dynamic_dim(d) for t, d in ((x_type, n - 1), (split_type, n - 1),
                                            (split_type, n))):
        return None
    heads, dim = split_type.shape[n - 1], split_type.shape[n]
    if heads * dim != x_type.shape[n - 1]:
        return None
    passed = passed_through(x, reshape.operands[1], n + 1) \
        if reshape.name == "stablehlo.dynamic_reshape" else [None] * (n + 1)
    for d in range(n - 1):
        if x_type.is_dynamic_dim(d) or split_type.is_dynamic_dim(d):
            if not (x_type.is_dynamic_dim(d) and split_type.is_dynamic_dim(d) and
                    passed[d] == d):
                return None
        elif x_type.shape[d] != split_type.shape[d]:
            return None
    base, start = _last_dim_slice(x)
    made_by = _op(base)
    if made_by is not None and made_by.name not in _UNFUSED:
        return None
    return base, {"start": start, "split": [heads, dim],
                  "permutation": i64_array(transpose.attributes["permutation"])}


def _view_choices(found) -> List[Tuple[bool, ...]]:
    """Which of the found head views to take, most first, ending with none."""
    choices = [tuple(bool(view) and keep for view, keep in zip(found, mask))
               for mask in itertools.product((True, False), repeat=len(found))]
    return sorted(set(choices), key=lambda c: -sum(c))


def _last_dim_slice(x) -> Tuple[object, int]:
    """(base, start) when `x` is a slice of base's last dim from `start` with unit step
    (every other dim whole), else (x, 0)."""
    op = _op(x)
    x_type = ir.RankedTensorType(x.type)
    n = x_type.rank
    if op is None or op.name not in ("stablehlo.slice", "stablehlo.real_dynamic_slice"):
        return x, 0
    base = op.operands[0]
    base_type = ir.RankedTensorType(base.type)
    if base_type.is_dynamic_dim(n - 1):
        return x, 0
    if op.name == "stablehlo.slice":
        starts = i64_array(op.attributes["start_indices"])
        limits = i64_array(op.attributes["limit_indices"])
        steps = i64_array(op.attributes["strides"])
        whole = all(starts[d] == 0 and not base_type.is_dynamic_dim(d) and
                    limits[d] == base_type.shape[d] for d in range(n - 1))
    else:
        starts, steps = _constant_ints(op.operands[1]), _constant_ints(op.operands[3])
        if starts is None or steps is None:
            return x, 0
        limits = passed_through(base, op.operands[2], n)
        whole = all(starts[d] == 0 and limits[d] == d for d in range(n - 1))
    if not whole or any(step != 1 for step in steps):
        return x, 0
    return base, starts[n - 1]


def _constant_ints(value) -> Optional[List[int]]:
    """The elements of a constant integer tensor, None for anything else."""
    op = _op(value)
    if op is None or op.name not in _CONSTANTS:
        return None
    attr = op.attributes["value"]
    if not isinstance(attr, ir.DenseIntElementsAttr):
        return None
    shaped = ir.ShapedType(attr.type)
    if attr.is_splat:
        return [int(ir.IntegerAttr(attr.get_splat_value()).value)] * shaped.shape[0]
    return [int(v) for v in attr]


def attention_form(main, dot) -> Optional[Tuple[List, List, dict]]:
    """(sources [q, k, v, mask?], the chain's other ops in block order, attributes) when
    the dot_general `dot` in `main` is the `@ v` of an attention chain; None otherwise.
    Both products are matmuls of matmul.py's form; its operand peeling tells whether k and
    v are stored transposed."""
    form = matmul_form(dot)
    if form is None:
        return None
    probabilities, v, _, v_attributes = form
    rank = ir.ShapedType(dot.result.type).rank
    if rank not in (3, 4) or probabilities != dot.operands[0]:
        return None
    zeroed = _zeroed_masked_rows(probabilities, rank)
    if zeroed is not None:
        probabilities, zeroed_logits = zeroed
    divide = _binary(probabilities, "stablehlo.divide")
    if divide is None:
        return None
    exponentials = divide.operands[0]
    total = _row_reduction(divide.operands[1], "stablehlo.add", 0.0, rank)
    exponential = _binary(exponentials, "stablehlo.exponential")
    if total is None or total[1] != exponentials or exponential is None:
        return None
    subtract = _binary(exponential.operands[0], "stablehlo.subtract")
    if subtract is None:
        return None
    logits = subtract.operands[0]
    maximum = _row_reduction(subtract.operands[1], "stablehlo.maximum", float("-inf"), rank)
    if maximum is None or maximum[1] != logits or \
            (zeroed is not None and zeroed_logits != logits):
        return None
    element_type = ir.ShapedType(logits.type).element_type
    mask = None
    scored = _scores(logits)
    add = _binary(logits, "stablehlo.add")
    if scored is None and add is not None:
        for scores_value, mask_value in ((add.operands[0], add.operands[1]),
                                         (add.operands[1], add.operands[0])):
            scored = _scores(scores_value)
            mask = _mask_source(mask_value, rank, element_type) if scored else None
            if mask is not None:
                break
            scored = None
    if scored is None:
        return None
    first, scale = scored
    first_form = matmul_form(first)
    if first_form is None:
        return None
    q, k, _, k_attributes = first_form
    for operand in (q, k, v):
        if ir.ShapedType(operand.type).rank != rank:
            return None
    sources = [q, k, v] + ([mask] if mask is not None else [])
    # The heads read in place where the chain can take their views (see the module
    # docstring): as many of q, k and v as can be (heads that are also used elsewhere
    # keep their copy), else none.
    found = [head_view(s) for s in sources[:3]]
    extra = {}
    if not isinstance(scale, float):
        # The scalar's tensor is the function's last operand; `lowering.lower` reads
        # it and passes its value (or its reciprocal) as the kernel's scale.
        scalar, divides = scale
        extra = {"scale_operand": len(sources), "scale_divides": int(divides)}
        sources.append(scalar)
        scale = 1.0
    dot_op = _op(dot.result)
    chain = None
    for kept in _view_choices(found):
        views = [view if keep else None for view, keep in zip(found, kept)]
        viewed = [view[0] if view else s for view, s in zip(views, sources)] + sources[3:]
        chain = _chain(main, dot_op, viewed)
        if chain is not None:
            sources = viewed
            if any(views):
                extra["views"] = [view[1] if view else None for view in views]
            break
    if chain is None:
        return None
    return sources, chain, {
        "kind": "attention_masked" if mask is not None else "attention",
        # The kernel takes k as [..., keys, head dim] and v as [..., keys, value dim].
        "transpose_k": 1 - k_attributes["transpose_b"],
        "transpose_v": v_attributes["transpose_b"],
        "scale": scale,
        "zero_masked_rows": int(zeroed is not None),
        **extra}


def attention_chain(main, op) -> Optional[Tuple[object, List, List, dict]]:
    """What outlining takes for the attention chain whose last dot_general is `op`, as one
    call (`attention_form`): (the op whose result the call gives, the sources, the ops
    before it that move into the call, in block order, the kernel's attributes); None for
    any other op. A transpose that alone reads the chain's result goes into the call too:
    the kernel writes the heads straight into the transposed layout (OUT_PERMUTATION).

    Example:
        >>> attention_chain(main, dot)   # softmax(q @ k^T * 0.125) @ v
        (dot, [q, k, v], [dot_general, multiply, ...], {'kind': 'attention', ...})
    """
    if op.name != "stablehlo.dot_general":
        return None
    form = attention_form(main, op)
    if form is None:
        return None
    sources, chain, attributes = form
    after = _output_permutation(op)
    if after is None:
        return (op, sources, chain, attributes)
    transpose, permutation = after
    return (transpose, sources, chain + [op],
            {**attributes, "out_permutation": permutation})


def _output_permutation(op) -> Optional[Tuple[object, List[int]]]:
    """The transpose that is the only user of `op`'s result, and its permutation (the
    heads of an attention's output moved back next to the tokens, before the output
    projection), or None."""
    uses = list(op.result.uses)
    if len(uses) != 1:
        return None
    user = as_operation(uses[0].owner)
    if user.name != "stablehlo.transpose":
        return None
    return user, i64_array(user.attributes["permutation"])


def _chain(main, dot, sources) -> Optional[List]:
    """The ops `dot` is computed from back to `sources`, in block order, or None when the
    chain reads another value from outside or a value inside it is used elsewhere (then
    it must stay in main). Constants and shape computations may be shared: they are
    cloned, and erased from main only when nothing else uses them."""
    block_ops = [as_operation(o) for o in main.regions[0].blocks[0].operations]
    members = []
    member_set = set()  # Operations hash by identity, as they compare

    def member(op) -> bool:
        return as_operation(op) in member_set

    stack = [dot]
    while stack:
        op = stack.pop()
        if member(op):
            continue
        members.append(op)
        member_set.add(as_operation(op))
        for operand in op.operands:
            if any(operand == s for s in sources):
                continue
            owner = _op(operand)
            if owner is None:
                return None     # a block argument that is not a source
            stack.append(owner)

    def shareable(op) -> bool:
        """Constants, and what is computed from constants alone or is no float tensor
        (sizes and shapes of a dynamic chain)."""
        if op.name in _CONSTANTS:
            return True
        if not any(isinstance(r.type, ir.RankedTensorType) and
                   isinstance(r.type.element_type, ir.FloatType) for r in op.results):
            return True
        return all(_op(o) is not None and not any(o == s for s in sources) and
                   shareable(_op(o)) for o in op.operands)

    for op in members:
        if op == dot or shareable(op):
            continue
        for result in op.results:
            for use in result.uses:
                if not member(as_operation(use.owner)):
                    return None
    return [op for op in block_ops if member(op) and op != dot]
