"""The `outline-library-calls` pass (on StableHLO, before linalg): each op that a library
call runs moves into a private function of its own, marked `blade.library_call`
(library_calls.py), and main calls it; ops of any other form stay in main and are compiled
to loops.

The op families' modules say which ops of which form the kernels take (matmul.py,
convolution.py, attention.py, sort.py): chains first (attention, a convolution with its
bias and ReLU), then each remaining dot_general, convolution and sort. Transposes of the
last two dims and broadcasts of leading (batch) dims that feed a matmul move into the
function too, so the kernel reads the original weight in place (no per-call transpose or
broadcast copy). Until `lower-library-calls` (lowering.py) the function body is the real
computation, so every analysis in between (fusion, bufferization) sees the truth; with
dynamic sizes (which StableHLO's linalg lowering does not take) it only allocates the
result, and its operands are marked read (`declarations.read_only`) for bufferization.

A sort, and a kernel call (kernel_calls.py), has no computation of its own to stand in
until then: it is outlined as a declaration whose operands are marked as only read
(`declarations.read_only`), bufferized as such (its results are memrefs it returns).
"""
from typing import Dict, List

from torch_mlir import ir
from torch_mlir.dialects import arith, func, tensor

from blade.codegen.ir_queries import SHAPE_QUERIES, as_operation, defining_op
from blade.codegen.kernels import attention, convolution, kernel_calls, matmul, sort
from blade.codegen.kernels.declarations import read_only
from blade.codegen.kernels.library_calls import (HEAD_VIEWS, KERNEL_ARGUMENTS, LIBRARY_CALL,
                                                 OUT_PERMUTATION, SCALE_DIVIDES, SCALE_OPERAND)


def outline(module, main) -> Dict[str, int]:
    """The pass (see the module docstring); returns how many ops were outlined, by kind."""
    counts: Dict[str, int] = {}

    def take(op, sources, peeled, attributes, same_shape=()) -> None:
        _outline_one(module, main, op, sources, peeled, attributes, sum(counts.values()),
                     same_shape)
        counts[attributes["kind"]] = counts.get(attributes["kind"], 0) + 1

    with module.context, ir.Location.unknown():
        # Chains first (their ops would otherwise be taken one by one below), one at a
        # time: outlining one erases ops later in the block.
        for find in (attention.attention_chain, convolution.convolution_with_epilogue):
            while True:
                ops = main.regions[0].blocks[0].operations
                found = next((f for f in (find(main, op) for op in ops) if f is not None),
                             None)
                if found is None:
                    break
                take(*found)
        for op in list(main.regions[0].blocks[0].operations):
            if op.name == "stablehlo.dot_general":
                form = matmul.matmul_form(op)
                if form is not None:
                    lhs, rhs, peeled, attributes = form
                    take(op, [lhs, rhs], peeled, attributes)
            elif op.name == "stablehlo.convolution":
                attributes = convolution.conv_form(op)
                if attributes is not None:
                    take(op, list(op.operands), [], attributes)
            elif op.name == "stablehlo.sort":
                attributes = sort.sort_form(op)
                if attributes is not None:
                    _outline_sort(module, main, op, attributes, sum(counts.values()))
                    counts["sort"] = counts.get("sort", 0) + 1
        calls = kernel_calls.outline(module, LIBRARY_CALL)
        if calls:
            counts[kernel_calls.KIND] = calls
    return counts


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
    if dynamic:
        # A body that only allocates tells bufferization the operands are not read: two
        # operands computed into one empty tensor (CSE merges equal ones) would then share
        # a buffer, the later write landing before the call. They are marked read.
        read_only(function)
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
    for operand, view in enumerate(attributes.get("views", [])):
        if view is not None:
            function.attributes[HEAD_VIEWS[operand]] = ir.DenseI64ArrayAttr.get(
                [view["start"], *view["split"], *view["permutation"]])
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


def _result_sizes(attributes, arguments, result_type) -> List:
    """Index values of the result's dynamic sizes, computed from the arguments: what a
    function of dynamic size allocates for the kernel to write (see `_outline_one`)."""
    index = ir.IndexType.get()
    result = ir.RankedTensorType(result_type)

    def dim(value, d):
        return tensor.DimOp(value, arith.ConstantOp(index, d).result).result

    def const(v):
        return arith.ConstantOp(index, v).result

    def operand_dim(operand, d):
        """Dim d of the attention's operand: a dim of the value it views (attention.head_view;
        a dynamic dim is one of the value's kept dims), or of the argument itself."""
        views = attributes.get("views") or [None] * 3
        view = views[operand]
        if view is None:
            return dim(arguments[operand], d)
        kept = ir.RankedTensorType(arguments[operand].type).rank - 1
        before = view["permutation"][d]
        return dim(arguments[operand], before) if before < kept else \
            const(view["split"][before - kept])

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
            # Dim d of a result the kernel writes transposed is dim permutation[d] of the
            # attention's own result.
            u = attributes["out_permutation"][d] if "out_permutation" in attributes else d
            if u < rank - 1:            # batch dims and query rows come with q
                sizes.append(operand_dim(0, u))
            else:                       # v's last dim, or its rows if stored transposed
                sizes.append(operand_dim(2, rank - 2 if attributes["transpose_v"] else
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
