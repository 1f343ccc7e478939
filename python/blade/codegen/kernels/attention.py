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

A query row whose scores are all -inf (its mask excludes every key) makes softmax 0/0 =
NaN. `F.scaled_dot_product_attention` gives 0 there (PyTorch's safe softmax; its
decomposition selects 0 for rows whose max is -inf): a chain with that select runs with
the kernel's `zero_masked_rows`, one without it keeps NaN.
"""
from typing import List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.ir_queries import as_operation, defining_op as _op, i64_array
from blade.codegen.kernels.matmul import matmul_form


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
    run_time_scale = {}
    if not isinstance(scale, float):
        # The scalar's tensor is the function's last operand; `lowering.lower` reads
        # it and passes its value (or its reciprocal) as the kernel's scale.
        scalar, divides = scale
        run_time_scale = {"scale_operand": len(sources), "scale_divides": int(divides)}
        sources.append(scalar)
        scale = 1.0
    chain = _chain(main, _op(dot.result), sources)
    if chain is None:
        return None
    return sources, chain, {
        "kind": "attention_masked" if mask is not None else "attention",
        # The kernel takes k as [..., keys, head dim] and v as [..., keys, value dim].
        "transpose_k": 1 - k_attributes["transpose_b"],
        "transpose_v": v_attributes["transpose_b"],
        "scale": scale,
        "zero_masked_rows": int(zeroed is not None),
        **run_time_scale}


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
