"""Matmuls, convolutions and sorts as calls into PyTorch's own CPU kernels (through the RAL).

Loops generated from linalg cannot match MKL or oneDNN, so these ops never become loops
(and nothing else in the pipeline lowers a sort: see `_outline_sort`):

1. `outline` (on StableHLO, before linalg): each `stablehlo.dot_general` and
   `stablehlo.convolution` of a supported form moves into a private function of its own,
   marked `blade.library_call`, and main calls it. Transposes of the last two dims and
   broadcasts of leading (batch) dims that feed a matmul move into the function too, so
   the kernel reads the original weight in place (no per-call transpose or broadcast
   copy). Until step 2 the function body is the real computation, so every analysis in
   between (fusion, bufferization) sees the truth.
2. `lowering.lower` (after bufferization, when the function has become `(inputs..., out)`
   on memrefs): the body is replaced by one call to the RAL kernel `blade_ral_<op>_<type>`
   (csrc/ral/ral_kernels.h), which writes all of `out`. Memrefs are passed unranked, which
   the LLVM lowering turns into a (rank, descriptor pointer) pair of arguments.

A sort, and a kernel call (codegen/kernels/kernel_calls.py), has no computation of its own
to stand in until step 2: it is outlined as a declaration whose operands are marked as only
read (`declarations.read_only`), bufferized as such (its results are memrefs it returns),
and `lowering.lower` defines it as the kernel's call on results it allocates
(`declarations.define_returning`).

Ops of any other form stay in the module and are compiled to loops.
"""
from typing import Dict, List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo
from torch_mlir.dialects import arith, func, tensor

from blade.codegen.kernels import attention, kernel_calls
from blade.codegen.kernels.declarations import read_only
from blade.codegen.ir_queries import (SHAPE_QUERIES, as_operation, defining_op, i64_array,
                                      only_data_user, producer, rank_of)

LIBRARY_CALL = "blade.library_call"
# Element types the kernels take, each with its kernel symbols' suffix.
KERNEL_ELEMENT_TYPES = ((ir.F32Type, "f32"), (ir.F64Type, "f64"), (ir.F16Type, "f16"),
                        (ir.BF16Type, "bf16"))


def _element_suffix(value) -> Optional[str]:
    element = ir.ShapedType(value.type).element_type
    for kind, suffix in KERNEL_ELEMENT_TYPES:
        if isinstance(element, kind):
            return suffix
    return None


def _peel_matmul_operand(value, is_rhs: bool) -> Tuple[object, List, bool]:
    """Walks up broadcasts of leading dims and (for the rhs) transposes of the last two dims.
    Returns the source value, the ops peeled (producers first) and whether the source is
    transposed."""
    peeled = []
    transposed = False
    while True:
        # A dynamic engine broadcasts with a run-time shape; the kernel broadcasts the
        # weight's batch dims itself either way.
        broadcast = producer(value, "stablehlo.broadcast_in_dim") or \
            producer(value, "stablehlo.dynamic_broadcast_in_dim")
        if broadcast is not None:
            source = broadcast.operands[0]
            dims = i64_array(broadcast.attributes["broadcast_dimensions"])
            out_rank, in_rank = rank_of(value), rank_of(source)
            shapes_kept = ir.ShapedType(source.type).shape == \
                ir.ShapedType(value.type).shape[out_rank - in_rank:]
            if in_rank >= 2 and dims == list(range(out_rank - in_rank, out_rank)) \
                    and shapes_kept:
                peeled.insert(0, broadcast)
                value = source
                continue
        transpose = producer(value, "stablehlo.transpose")
        if transpose is not None and is_rhs:
            perm = i64_array(transpose.attributes["permutation"])
            rank = len(perm)
            if rank >= 2 and perm == list(range(rank - 2)) + [rank - 1, rank - 2]:
                peeled.insert(0, transpose)
                value = transpose.operands[0]
                transposed = not transposed
                continue
        return value, peeled, transposed


def _matmul_form(op) -> Optional[Tuple[object, object, List, dict]]:
    """(lhs source, rhs source, peeled ops, attributes) for a dot_general the RAL runs."""
    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = op.operands[0], op.operands[1]
    rank = rank_of(lhs)
    batch = list(range(rank - 2))
    if rank < 2 or rank_of(rhs) != rank or _element_suffix(lhs) is None:
        return None
    if list(dims.lhs_batching_dimensions) != batch or \
            list(dims.rhs_batching_dimensions) != batch or \
            list(dims.lhs_contracting_dimensions) != [rank - 1]:
        return None
    if list(dims.rhs_contracting_dimensions) == [rank - 2]:
        transposed = False
    elif list(dims.rhs_contracting_dimensions) == [rank - 1]:
        transposed = True
    else:
        return None
    if ir.ShapedType(op.result.type).element_type != ir.ShapedType(lhs.type).element_type:
        return None
    lhs_source, lhs_peeled, _ = _peel_matmul_operand(lhs, is_rhs=False)
    rhs_source, rhs_peeled, flipped = _peel_matmul_operand(rhs, is_rhs=True)
    return lhs_source, rhs_source, lhs_peeled + rhs_peeled, {
        "kind": "matmul", "transpose_b": int(transposed != flipped)}


def _conv_form(op) -> Optional[dict]:
    """The attributes of a 2-d convolution the RAL runs, or None: OIHW weights, and NCHW
    data and result (`conv2d`) or NHWC ones (`conv2d_nhwc`, see layouts.py)."""
    dims = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    if _element_suffix(op.operands[0]) is None or rank_of(op.operands[0]) != 4:
        return None
    data = (dims.input_batch_dimension, dims.input_feature_dimension,
            list(dims.input_spatial_dimensions))
    result = (dims.output_batch_dimension, dims.output_feature_dimension,
              list(dims.output_spatial_dimensions))
    oihw = (dims.kernel_output_feature_dimension, dims.kernel_input_feature_dimension,
            list(dims.kernel_spatial_dimensions)) == (0, 1, [2, 3])
    if not oihw or data != result or data not in ((0, 1, [2, 3]), (0, 3, [1, 2])):
        return None
    kind = "conv2d" if data == (0, 1, [2, 3]) else "conv2d_nhwc"
    attrs = op.attributes

    def ints(name, default):
        return i64_array(attrs[name]) if name in attrs else default

    if ints("lhs_dilation", [1, 1]) != [1, 1]:
        return None
    if "batch_group_count" in attrs and ir.IntegerAttr(attrs["batch_group_count"]).value != 1:
        return None
    if "window_reversal" in attrs:
        return None
    padding = [0, 0, 0, 0]
    if "padding" in attrs:
        pad = ir.DenseIntElementsAttr(attrs["padding"])
        padding = [pad[i] for i in range(len(pad))]
    if min(padding) < 0:
        return None
    stride = ints("window_strides", [1, 1])
    dilation = ints("rhs_dilation", [1, 1])
    groups = ir.IntegerAttr(attrs["feature_group_count"]).value \
        if "feature_group_count" in attrs else 1
    return {"kind": kind, "stride_h": stride[0], "stride_w": stride[1],
            "pad_top": padding[0], "pad_bottom": padding[1], "pad_left": padding[2],
            "pad_right": padding[3], "dilation_h": dilation[0], "dilation_w": dilation[1],
            "groups": groups}


def _channel_bias(value, channels: int) -> Optional[Tuple[object, List]]:
    """(the source, the ops peeled) of a per-channel vector that `value` broadcasts over an
    NHWC tensor's last dim: a broadcast_in_dim of a tensor whose one non-unit dim holds
    the `channels` values, through reshapes and transposes that only move unit dims."""
    broadcast = producer(value, "stablehlo.broadcast_in_dim") or \
        producer(value, "stablehlo.dynamic_broadcast_in_dim")
    if broadcast is None or channels < 2:
        return None
    source = broadcast.operands[0]
    shape = ir.ShapedType(source.type).shape
    dims = i64_array(broadcast.attributes["broadcast_dimensions"])
    non_unit = [i for i, size in enumerate(shape) if size != 1]
    if non_unit != [i for i, size in enumerate(shape) if size == channels] or \
            len(non_unit) != 1 or dims[non_unit[0]] != rank_of(value) - 1:
        return None
    peeled = [broadcast]
    while True:
        move = producer(source, "stablehlo.reshape") or producer(source, "stablehlo.transpose")
        if move is None or [size for size in ir.ShapedType(move.operands[0].type).shape
                            if size != 1] != [channels]:
            return source, peeled
        peeled.insert(0, move)
        source = move.operands[0]


def _zero_splat(value) -> Optional[List]:
    """The ops (a constant, then broadcasts of it) that make `value` a splat of 0.0, in
    block order; None when it is anything else."""
    ops = []
    while True:
        op = producer(value, "stablehlo.broadcast_in_dim") or \
            producer(value, "stablehlo.dynamic_broadcast_in_dim") or \
            producer(value, "stablehlo.constant")
        if op is None:
            return None
        ops.insert(0, op)
        if op.name == "stablehlo.constant":
            attr = op.attributes["value"]
            zero = isinstance(attr, ir.DenseFPElementsAttr) and attr.is_splat and \
                float(ir.FloatAttr(attr.get_splat_value()).value) == 0.0
            return ops if zero else None
        value = op.operands[0]


def _conv_epilogue(conv) -> Optional[Tuple[object, List, object, bool]]:
    """For an NHWC convolution followed by a per-channel bias add (and a ReLU) that nothing
    else reads in between: (the bias source, the ops between, the last op, relu?), which
    the kernel runs as the convolution's own bias and an in-place ReLU (NaN-preserving)
    instead of a pass of loops over its result. None otherwise."""
    add = only_data_user(conv.result)
    if add is None or add.name != "stablehlo.add":
        return None
    other = add.operands[1] if add.operands[0] == conv.result else add.operands[0]
    bias = _channel_bias(other, ir.ShapedType(conv.result.type).shape[-1])
    if bias is None:
        return None
    source, peeled = bias
    relu = only_data_user(add.result)
    if relu is not None and relu.name == "stablehlo.maximum":
        zero = _zero_splat(relu.operands[1] if relu.operands[0] == add.result else
                           relu.operands[0])
        if zero is not None:
            return source, peeled + zero + [add], relu, True
    return source, peeled, add, False


# The integer arguments each kernel takes after its memrefs, in order.
KERNEL_ARGUMENTS = {
    "matmul": ["transpose_b"],
    "conv2d": ["stride_h", "stride_w", "pad_top", "pad_bottom", "pad_left", "pad_right",
               "dilation_h", "dilation_w", "groups"],
}
KERNEL_ARGUMENTS["conv2d_nhwc"] = KERNEL_ARGUMENTS["conv2d"]
KERNEL_ARGUMENTS["conv2d_nhwc_bias"] = KERNEL_ARGUMENTS["conv2d"] + ["relu"]
KERNEL_ARGUMENTS["attention"] = ["transpose_k", "transpose_v", "scale",  # scale: f64
                                  "zero_masked_rows"]
KERNEL_ARGUMENTS["attention_masked"] = KERNEL_ARGUMENTS["attention"]
KERNEL_ARGUMENTS["sort"] = ["dimension", "descending", "stable", "k"]  # k: 0, or topk's
# The element types sort takes (its values' type names the kernel, as for the others).
SORT_ELEMENT_TYPES = ("f32", "f64", "f16", "bf16", "i32", "i64")
# A kernel that writes its result through strides (attention) may take the transpose that
# follows it into its function: the function returns the transposed tensor, and
# `lowering.lower` hands the kernel a view of that buffer in the kernel's own dim order (see
# `_output_permutation`).
OUT_PERMUTATION = "blade.out_permutation"
# An attention scale computed at run time (attention._run_time_scalar): the function's
# operand at this index is a one-element tensor holding it, which `lowering.lower` reads and
# passes as the kernel's scale (its reciprocal when SCALE_DIVIDES is 1) instead of a memref.
SCALE_OPERAND = "blade.scale_operand"
SCALE_DIVIDES = "blade.scale_divides"


def _result_sizes(attributes, arguments, result_type) -> List:
    """Index values of the result's dynamic sizes, computed from the arguments: what a
    function of dynamic size allocates for the kernel to write (see `_outline_one`)."""
    index = ir.IndexType.get()
    result = ir.RankedTensorType(result_type)

    def dim(value, d):
        return tensor.DimOp(value, arith.ConstantOp(index, d).result).result

    def const(v):
        return arith.ConstantOp(index, v).result

    lhs, rhs = arguments[0], arguments[1]
    rank, rhs_rank = result.rank, ir.RankedTensorType(rhs.type).rank
    sizes = []
    for d in range(rank):
        if not result.is_dynamic_dim(d):
            continue
        if attributes["kind"] == "matmul":
            if d < rank - 1:            # batch dims and rows come with the lhs
                sizes.append(dim(lhs, d))
            else:                       # columns: the rhs's last dim, or its rows if transposed
                sizes.append(dim(rhs, rhs_rank - 2 if attributes["transpose_b"] else
                                 rhs_rank - 1))
        elif attributes["kind"].startswith("attention"):
            if d < rank - 1:            # batch dims and query rows come with q
                sizes.append(dim(lhs, d))
            else:                       # v's last dim, or its rows if stored transposed
                sizes.append(dim(arguments[2], rank - 2 if attributes["transpose_v"] else
                                 rank - 1))
        elif d == 0:                    # conv2d: the batch
            sizes.append(dim(lhs, 0))
        elif d == (3 if attributes["kind"].startswith("conv2d_nhwc") else 1):
            sizes.append(dim(rhs, 0))   # the channels (the weight is OIHW in both layouts)
        else:                           # (in + pads - dilation * (k - 1) - 1) / stride + 1
            first_spatial = 1 if attributes["kind"].startswith("conv2d_nhwc") else 2
            axis = "h" if d == first_spatial else "w"
            kernel_dim = 2 if axis == "h" else 3
            pads = attributes["pad_top"] + attributes["pad_bottom"] if axis == "h" else \
                attributes["pad_left"] + attributes["pad_right"]
            span = arith.MulIOp(const(attributes[f"dilation_{axis}"]),
                                arith.SubIOp(dim(rhs, kernel_dim), const(1)).result).result
            reach = arith.SubIOp(arith.AddIOp(dim(lhs, d), const(pads)).result,
                                 arith.AddIOp(span, const(1)).result).result
            sizes.append(arith.AddIOp(
                arith.FloorDivSIOp(reach, const(attributes[f"stride_{axis}"])).result,
                const(1)).result)
    return sizes


def _outline_one(module, main, op, sources, peeled, attributes, index: int,
                 same_shape=()) -> None:
    """Moves `op` and the `peeled` ops it is computed from into a function of its own
    (see the module docstring). `same_shape` are peeled ops whose result has the shape of
    `op`'s: what still asks for their shape (a dynamic engine's broadcasts) asks the
    call's result instead, so they can go."""
    name = f"blade_library_call_{index}"
    result_type = op.result.type
    # A result of static size becomes an out-parameter its caller allocates (bufferize
    # pipelines, buffer-results-to-out-params, which takes private functions); one of
    # dynamic size cannot, so that function stays public and allocates its result itself.
    dynamic = not ir.ShapedType(result_type).has_static_shape
    with ir.InsertionPoint(module.body):
        function = func.FuncOp(name, ([s.type for s in sources], [result_type]),
                               visibility="public" if dynamic else "private")
    function.operation.move_after(main)
    block = function.add_entry_block()
    mapping = {source: arg for source, arg in zip(sources, block.arguments)}
    with ir.InsertionPoint(block):
        if dynamic:
            # StableHLO's linalg lowering takes no dot/convolution of dynamic sizes; the
            # body only has to allocate the result, which `lowering.lower` keeps for the kernel.
            dynamic_sizes = iter(_result_sizes(attributes, list(block.arguments), result_type))
            result = ir.RankedTensorType(result_type)
            sizes = [next(dynamic_sizes) if result.is_dynamic_dim(d) else result.shape[d]
                     for d in range(result.rank)]
            empty = tensor.EmptyOp(sizes, result.element_type)
            func.ReturnOp([empty.result])
        else:
            for original in peeled + [op]:
                copy = original.clone()
                for i, operand in enumerate(copy.operands):
                    if operand in mapping:
                        copy.operands[i] = mapping[operand]
                mapping[original.result] = copy.result
            func.ReturnOp([mapping[op.result]])
    i64 = ir.IntegerType.get_signless(64)
    function.attributes[LIBRARY_CALL] = ir.StringAttr.get(attributes["kind"])
    for key in KERNEL_ARGUMENTS[attributes["kind"]]:
        value = attributes[key]
        function.attributes[f"blade.{key}"] = \
            ir.FloatAttr.get(ir.F64Type.get(), value) if isinstance(value, float) else \
            ir.IntegerAttr.get(i64, value)
    if "out_permutation" in attributes:
        function.attributes[OUT_PERMUTATION] = \
            ir.DenseI64ArrayAttr.get(attributes["out_permutation"])
    if "scale_operand" in attributes:
        function.attributes[SCALE_OPERAND] = ir.IntegerAttr.get(i64, attributes["scale_operand"])
        function.attributes[SCALE_DIVIDES] = ir.IntegerAttr.get(i64, attributes["scale_divides"])
    with ir.InsertionPoint(op):
        call = func.CallOp([result_type], ir.FlatSymbolRefAttr.get(name), list(sources))
    op.result.replace_all_uses_with(call.result)
    op.erase()
    redirected = False
    for original in same_shape:
        for use in list(original.result.uses):
            if as_operation(use.owner).name in SHAPE_QUERIES:
                use.owner.operands[use.operand_number] = call.result
                redirected = True
    for original in reversed(peeled):
        if not list(original.result.uses):
            original.erase()
    if redirected:
        _move_after_the_call(main, call)


def _move_after_the_call(main, call) -> None:
    """A shape query that asked for a peeled op's shape before the call (a dynamic
    broadcast of a convolution's bias) now asks the call's result: it moves to just after
    the call, with everything before the call that depends on it, in order. Nothing that
    stays before the call can use what moves, since it would depend on the call too."""
    moving, tainted = [], [call.result]
    for op in main.regions[0].blocks[0].operations:
        if op == call.operation:
            break
        if any(operand == value for operand in op.operands for value in tainted):
            moving.append(op)
            tainted.extend(op.results)
    anchor = call.operation
    for op in moving:
        op.move_after(anchor)
        anchor = op


def _output_permutation(op) -> Optional[Tuple[object, List[int]]]:
    """The transpose that is the only user of `op`'s static result, and its permutation
    (the heads of an attention's output moved back next to the tokens, before the output
    projection), or None."""
    uses = list(op.result.uses)
    if len(uses) != 1 or not ir.ShapedType(op.result.type).has_static_shape:
        return None
    user = as_operation(uses[0].owner)
    if user.name != "stablehlo.transpose":
        return None
    return user, i64_array(user.attributes["permutation"])




def _in_block_order(main, ops) -> List:
    listed = [as_operation(o) for o in ops]
    return [o for o in map(as_operation, main.regions[0].blocks[0].operations)
            if any(o == m for m in listed)]


def _sort_form(op) -> Optional[dict]:
    """The kernel's attributes when `op` is a stablehlo.sort as Torch-MLIR lowers
    aten::sort (argsort and topk too): the values and an iota along the sorted dim, the
    comparator one `compare LT` (ascending) or `GT` (descending) of the values; else None.
    The kernel is PyTorch's own sort, so ties and NaN come out as eager orders them."""
    if len(op.operands) != 2 or len(op.results) != 2:
        return None
    dimension = ir.IntegerAttr(op.attributes["dimension"]).value
    iota = producer(op.operands[1], "stablehlo.iota") or \
        producer(op.operands[1], "stablehlo.dynamic_iota")
    values = ir.ShapedType(op.operands[0].type)
    indices = ir.ShapedType(op.operands[1].type)
    if iota is None or ir.IntegerAttr(iota.attributes["iota_dimension"]).value != dimension \
            or str(values.element_type) not in SORT_ELEMENT_TYPES \
            or str(indices.element_type) != "i64":
        return None
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(body) != 2 or body[0].name != "stablehlo.compare" or \
            body[1].name != "stablehlo.return" or \
            list(body[0].operands) != list(block.arguments)[:2] or \
            list(body[1].operands) != [body[0].result]:
        return None
    direction = str(body[0].attributes["comparison_direction"])
    if direction.endswith("LT>"):
        descending = 0
    elif direction.endswith("GT>"):
        descending = 1
    else:
        return None
    stable = "is_stable" in op.attributes and ir.BoolAttr(op.attributes["is_stable"]).value
    return {"kind": "sort", "dimension": dimension, "descending": descending,
            "stable": int(stable), "k": _top_k(op, dimension) if not stable else 0}


def _top_k(sort, dimension: int) -> int:
    """k when every use of the sort's results is a slice of its first k along the sorted
    dim (aten::topk, as Torch-MLIR lowers it), else 0. The kernel then runs PyTorch's
    topk, which picks among equal values as eager's topk does (an unstable sort may order
    them any way)."""
    shape = ir.RankedTensorType(sort.operands[0].type)
    if not shape.has_static_shape:
        return 0
    found = set()
    for result in sort.results:
        for use in result.uses:
            user = as_operation(use.owner)
            if user.name != "stablehlo.slice":
                return 0
            start = i64_array(user.attributes["start_indices"])
            limit = i64_array(user.attributes["limit_indices"])
            strides = i64_array(user.attributes["strides"])
            if any(start) or any(s != 1 for s in strides) or \
                    any(limit[d] != shape.shape[d] for d in range(shape.rank) if d != dimension):
                return 0
            found.add(limit[dimension])
    if len(found) != 1:
        return 0
    k = found.pop()
    return k if 0 < k < shape.shape[dimension] else 0


def _outline_sort(module, main, op, attributes, index: int) -> None:
    """Replaces the sort `op` (and a topk's slices) with a call of a declaration of its own,
    marked as a library call, that only reads its operand (nothing else in the pipeline
    lowers a sort; `lowering.lower` defines it as the kernel's call, see
    `define_returning`)."""
    name = f"blade_library_call_{index}"
    source = op.operands[0]
    result_types = [r.type for r in op.results]
    if attributes["k"]:
        # topk's: the call gives what the slices took (the first k along the dim).
        result_types = []
        for r in op.results:
            t = ir.RankedTensorType(r.type)
            sizes = list(t.shape)
            sizes[attributes["dimension"]] = attributes["k"]
            result_types.append(ir.RankedTensorType.get(sizes, t.element_type))
    with ir.InsertionPoint(module.body):
        function = func.FuncOp(name, ([source.type], result_types), visibility="private")
    function.operation.move_after(main)
    read_only(function)
    i64 = ir.IntegerType.get_signless(64)
    function.attributes[LIBRARY_CALL] = ir.StringAttr.get("sort")
    for key in KERNEL_ARGUMENTS["sort"]:
        function.attributes[f"blade.{key}"] = ir.IntegerAttr.get(i64, attributes[key])
    with ir.InsertionPoint(op):
        call = func.CallOp(result_types, ir.FlatSymbolRefAttr.get(name), [source])
    iota = defining_op(op.operands[1])
    for result, replacement in zip(op.results, call.results):
        if attributes["k"]:
            for user in [as_operation(u.owner) for u in result.uses]:
                user.results[0].replace_all_uses_with(replacement)
                user.erase()
        else:
            result.replace_all_uses_with(replacement)
    op.erase()
    if not list(iota.results[0].uses):
        iota.erase()


def outline(module, main) -> Dict[str, int]:
    """Step 1 (see the module docstring); returns how many ops were outlined, by kind."""
    counts: Dict[str, int] = {}

    def take(op, sources, peeled, attributes, same_shape=()) -> None:
        _outline_one(module, main, op, sources, peeled, attributes, sum(counts.values()),
                     same_shape)
        counts[attributes["kind"]] = counts.get(attributes["kind"], 0) + 1

    def attention_chain(op):
        if op.name != "stablehlo.dot_general":
            return None
        form = attention.attention_form(main, op, _matmul_form)
        if form is None:
            return None
        sources, chain, attributes = form
        after = _output_permutation(op)
        if after is None:
            return (op, sources, chain, attributes)
        # The kernel writes the heads straight into the transposed layout.
        transpose, permutation = after
        return (transpose, sources, chain + [op],
                {**attributes, "out_permutation": permutation})

    def convolution_with_epilogue(op):
        if op.name != "stablehlo.convolution":
            return None
        attributes = _conv_form(op)
        epilogue = _conv_epilogue(op) if attributes and attributes["kind"] == "conv2d_nhwc" \
            else None
        if epilogue is None:
            return None
        bias, between, last, relu = epilogue
        return (last, list(op.operands) + [bias], _in_block_order(main, [op] + between),
                {**attributes, "kind": "conv2d_nhwc_bias", "relu": int(relu)}, [op])

    with module.context, ir.Location.unknown():
        # Chains first (their ops would otherwise be taken one by one below), one at a
        # time: outlining one erases ops later in the block.
        for find in (attention_chain, convolution_with_epilogue):
            while True:
                found = next((f for f in map(find, main.regions[0].blocks[0].operations)
                              if f is not None), None)
                if found is None:
                    break
                take(*found)
        for op in list(main.regions[0].blocks[0].operations):
            if op.name == "stablehlo.dot_general":
                form = _matmul_form(op)
                if form is not None:
                    lhs, rhs, peeled, attributes = form
                    take(op, [lhs, rhs], peeled, attributes)
            elif op.name == "stablehlo.convolution":
                attributes = _conv_form(op)
                if attributes is not None:
                    take(op, list(op.operands), [], attributes)
            elif op.name == "stablehlo.sort":
                attributes = _sort_form(op)
                if attributes is not None:
                    _outline_sort(module, main, op, attributes, sum(counts.values()))
                    counts["sort"] = counts.get("sort", 0) + 1
        calls = kernel_calls.outline(module, LIBRARY_CALL)
        if calls:
            counts[kernel_calls.KIND] = calls
    return counts
