"""Channels-last convolutions: NCHW models run their convolutions on NHWC data.

oneDNN convolves NHWC (PyTorch's channels_last) data directly; given NCHW it reorders the
input into a blocked layout and the output back on every call (on this kind of host a
3x3 64-channel convolution takes about 30% longer). `to_channels_last` rewrites each
2-d NCHW convolution in StableHLO as

    transpose(x, NHWC) -> convolution on NHWC -> transpose(y, NCHW)

and then sinks the transposes back to NCHW down through elementwise ops (the bias, the
activation, a residual add), window reductions (pooling, its window permuted),
concatenations (a U-Net's skip connection), broadcasts that widen size-1 dims and
reshapes that split or merge dims lying in order in the NHWC value (a nearest
upsampling's), rebuilding broadcast and splat operands in the NHWC layout, until they
meet the next convolution's transpose to NHWC and cancel. Only the model's own NCHW inputs and
outputs are transposed (once each, fused into the loops that read or write them).
The library calls (codegen/kernels/convolution.py) then run the NHWC convolutions through
PyTorch with channels_last tensors (`blade_ral_conv2d_nhwc_<type>`).

Blade's int8 convolutions, kernel calls of `blade::quantized_conv2d(_add)`, join in
(`_Int8Convolutions`): a float32 result is made NHWC and read through a transpose to NCHW
that sinks as a convolution's does, and a float32 input that arrives as a transpose of NHWC
data to NCHW is passed as that data. So the int8 layers of a MobileNet and the float
depthwise convolutions and activations between them pass NHWC data without a transpose.

Dynamic engines get the same rewrite once their StableHLO has no shape.assuming regions
and no broadcasts that keep their operand's shape (codegen's assume_shapes step): a
dynamic broadcast of a bias or a splat is rebuilt in NHWC with its run-time shape
permuted, reshapes and broadcasts static but for the batch dim sink as static ones do
(their run-time shapes permuted), and shape queries of the transposes move to the NHWC
values.
"""
from typing import List, Optional

import numpy as np
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo
from torch_mlir.dialects import arith, tensor

from blade.codegen.ir_queries import clone_ops, defining_op, producer
from blade.kernel_call_spec import SPEC_ATTRIBUTE

TO_NHWC = [0, 2, 3, 1]   # NHWC dim i is NCHW dim TO_NHWC[i]
TO_NCHW = [0, 3, 1, 2]   # NCHW dim i is NHWC dim TO_NCHW[i]

# Ops that apply one scalar function lane by lane to operands of the result's shape (a
# clamp's bounds may be scalars: rank 0, taken as they are).
ELEMENTWISE = frozenset(f"stablehlo.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "negate", "abs",
    "exponential", "log", "logistic", "tanh", "sqrt", "rsqrt", "convert", "clamp",
    "round_nearest_even"))


def _permutation(op) -> List[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))


def _inverse(p: List[int]) -> List[int]:
    inverse = [0] * len(p)
    for i, d in enumerate(p):
        inverse[d] = i
    return inverse


def _permuted_type(t, p: List[int]):
    """The type of `transpose(value of type t, p)`."""
    shaped = ir.RankedTensorType(t)
    return ir.RankedTensorType.get([shaped.shape[d] for d in p], shaped.element_type)


def _transpose(value, p: List[int]):
    return ir.Operation.create(
        "stablehlo.transpose", results=[_permuted_type(value.type, p)], operands=[value],
        attributes={"permutation": ir.DenseI64ArrayAttr.get(p)}).result


def _attributes(op) -> dict:
    return {name: op.attributes[name] for name in op.attributes}


def _nchw_convolution(op) -> bool:
    """A 2-d convolution with NCHW data, OIHW weights and an NCHW result."""
    d = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    return (d.input_batch_dimension, d.input_feature_dimension,
            list(d.input_spatial_dimensions)) == (0, 1, [2, 3]) and \
        (d.kernel_output_feature_dimension, d.kernel_input_feature_dimension,
         list(d.kernel_spatial_dimensions)) == (0, 1, [2, 3]) and \
        (d.output_batch_dimension, d.output_feature_dimension,
         list(d.output_spatial_dimensions)) == (0, 1, [2, 3])


def _convolve_nhwc(op) -> None:
    data, weight = op.operands[0], op.operands[1]
    attributes = _attributes(op)
    # NHWC data and result, OIHW weights.
    attributes["dimension_numbers"] = stablehlo.ConvDimensionNumbers.get(
        input_batch_dimension=0, input_feature_dimension=3, input_spatial_dimensions=[1, 2],
        kernel_input_feature_dimension=1, kernel_output_feature_dimension=0,
        kernel_spatial_dimensions=[2, 3], output_batch_dimension=0,
        output_feature_dimension=3, output_spatial_dimensions=[1, 2])
    with ir.InsertionPoint(op), op.location:
        nhwc = ir.Operation.create(
            "stablehlo.convolution", results=[_permuted_type(op.results[0].type, TO_NHWC)],
            operands=[_transpose(data, TO_NHWC), weight], attributes=attributes).result
        back = _transpose(nhwc, TO_NCHW)
    op.results[0].replace_all_uses_with(back)
    op.erase()


def _is_transpose(value, p: List[int]) -> bool:
    source = producer(value, "stablehlo.transpose")
    return source is not None and _permutation(source) == p


def _permuted_shape(shape, p: List[int]):
    """A run-time shape (a 1-d tensor of sizes) with its elements in the order of
    `transpose(., p)`."""
    index = ir.IndexType.get()
    sizes = [tensor.ExtractOp(shape, [arith.ConstantOp(index, d).result]).result for d in p]
    return tensor.FromElementsOp(shape.type, sizes).result


def _operand_in_layout(value, p: List[int], before) -> Optional[object]:
    """`value` (of the elementwise op's NCHW-side shape) as it is before `transpose(., p)`:
    the transpose's source, a splat or broadcast rebuilt in that layout (a dynamic one with
    its run-time shape permuted), or an existing `transpose(value, inverse(p))` defined
    before `before`. None if it would take a new transpose of data."""
    source = producer(value, "stablehlo.transpose")
    if source is not None and _permutation(source) == p:
        return source.operands[0]
    inverse = _inverse(p)
    target = _permuted_type(value.type, inverse)
    constant = producer(value, "stablehlo.constant")
    if constant is not None:
        dense = ir.DenseElementsAttr(constant.attributes["value"])
        if dense.is_splat:
            return ir.Operation.create("stablehlo.constant", results=[target], attributes={
                "value": ir.DenseElementsAttr.get_splat(target, dense.get_splat_value())
            }).result
    broadcast = producer(value, "stablehlo.broadcast_in_dim") or \
        producer(value, "stablehlo.dynamic_broadcast_in_dim")
    if broadcast is not None:
        small = broadcast.operands[0]
        # operand dim k lands on dim p[dims[k]] of the layout before the transpose
        dims = [p[d] for d in ir.DenseI64ArrayAttr(broadcast.attributes["broadcast_dimensions"])]
        order = sorted(range(len(dims)), key=lambda k: dims[k])
        if order != list(range(len(dims))):
            small = _transpose(small, order)
        operands = [small] if broadcast.name == "stablehlo.broadcast_in_dim" else \
            [small, _permuted_shape(broadcast.operands[1], inverse)]
        return ir.Operation.create(
            broadcast.name, results=[target], operands=operands,
            attributes={"broadcast_dimensions": ir.DenseI64ArrayAttr.get(sorted(dims))}).result
    for use in value.uses:
        user = use.owner
        if user.name == "stablehlo.transpose" and _permutation(user) == inverse and \
                user.operation.is_before_in_block(before.operation):
            return user.results[0]
    return None


def _sink(op, attributes: Optional[dict] = None) -> bool:
    """Rewrites elementwise `op` with an operand transposed back to NCHW as a transpose to
    NCHW of the same op on NHWC operands (with `attributes`, when given, for the NHWC op);
    False when it cannot without a new transpose of data. Only this direction moves:
    transposes to NHWC stay where the convolutions need them (moving both ways would undo
    each other)."""
    p = TO_NCHW
    if len(op.results) != 1 or ir.RankedTensorType(op.results[0].type).rank != len(p) or \
            not any(_is_transpose(v, p) for v in op.operands):
        return False
    with ir.InsertionPoint(op), op.location:
        operands = [v if ir.RankedTensorType(v.type).rank == 0 else
                    _operand_in_layout(v, p, op) for v in op.operands]
        if any(v is None for v in operands):
            return False
        inner = ir.Operation.create(
            op.name, results=[_permuted_type(op.results[0].type, _inverse(p))],
            operands=operands,
            attributes=_attributes(op) if attributes is None else attributes).result
        result = _transpose(inner, p)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


# The window attributes of a reduce_window, one value per dim.
_WINDOW_ATTRIBUTES = ("window_dimensions", "window_strides", "base_dilations",
                      "window_dilations")


def _sink_window(op) -> bool:
    """Rewrites a window reduction (pooling) of a value transposed back to NCHW as the same
    reduction of the NHWC value, its window permuted, transposed to NCHW after; False when
    `op` is not one."""
    p = TO_NCHW
    if op.name != "stablehlo.reduce_window" or len(op.operands) != 2 or \
            len(op.results) != 1 or not _is_transpose(op.operands[0], p):
        return False
    source = producer(op.operands[0], "stablehlo.transpose").operands[0]
    to_nhwc = _inverse(p)   # NHWC dim i is dim to_nhwc[i] of the op's NCHW operand
    attributes = _attributes(op)
    for name in _WINDOW_ATTRIBUTES:
        if name in attributes:
            values = list(ir.DenseI64ArrayAttr(attributes[name]))
            attributes[name] = ir.DenseI64ArrayAttr.get([values[d] for d in to_nhwc])
    if "padding" in attributes:
        flat = ir.DenseIntElementsAttr(attributes["padding"])
        rows = [[flat[2 * d], flat[2 * d + 1]] for d in to_nhwc]
        attributes["padding"] = ir.DenseIntElementsAttr.get(
            np.array(rows, dtype=np.int64), type=ir.RankedTensorType.get(
                [len(p), 2], ir.IntegerType.get_signless(64)))
    body = op.regions[0].blocks[0]
    with ir.InsertionPoint(op), op.location:
        window = ir.Operation.create(
            op.name, results=[_permuted_type(op.results[0].type, to_nhwc)],
            operands=[source, op.operands[1]], attributes=attributes, regions=1)
        block = window.regions[0].blocks.append(*[a.type for a in body.arguments])
        mapping = dict(zip(body.arguments, block.arguments))
        with ir.InsertionPoint(block):
            clone_ops(body.operations, mapping)
        result = _transpose(window.results[0], p)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _sink_concatenate(op) -> bool:
    """Rewrites a concatenation of values transposed back to NCHW (a U-Net's skip connection
    and upsampled features) as one transpose of the NHWC concatenation along the permuted
    dim; False when an operand would take a new transpose of data."""
    attributes = _attributes(op)
    dimension = ir.IntegerAttr(attributes["dimension"]).value
    attributes["dimension"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                 TO_NCHW[dimension])
    return _sink(op, attributes)


def _shape(value) -> List[Optional[int]]:
    """The sizes of a ranked tensor, None where dynamic."""
    t = ir.RankedTensorType(value.type)
    return [None if t.is_dynamic_dim(d) else t.shape[d] for d in range(t.rank)]


def _leading_dynamic_groups(before, after):
    """`_reshape_groups` for shapes static but for a leading dim (a dynamic engine's batch)
    that the reshape keeps: that dim is a group of its own. None otherwise."""
    if None not in before and None not in after:
        return _reshape_groups(before, after)
    if before[0] is not None or after[0] is not None or None in before[1:] + after[1:]:
        return None
    groups = _reshape_groups(before[1:], after[1:])
    if groups is None:
        return None
    return [([0], [0])] + [([d + 1 for d in b], [d + 1 for d in a]) for b, a in groups]


def _reshape_groups(before: List[int], after: List[int]):
    """The dims of a reshape in groups [(dims before, dims after)] whose sizes multiply
    alike (splits and merges), size-1 dims left out; None if the sizes do not group."""
    left = [d for d, n in enumerate(before) if n != 1]
    right = [d for d, n in enumerate(after) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(left) or j < len(right):
        if i == len(left) or j == len(right):
            return None
        group_left, group_right = [left[i]], [right[j]]
        size_left, size_right = before[left[i]], after[right[j]]
        i, j = i + 1, j + 1
        while size_left != size_right:
            if size_left < size_right and i < len(left):
                size_left *= before[left[i]]
                group_left.append(left[i])
                i += 1
            elif size_right < size_left and j < len(right):
                size_right *= after[right[j]]
                group_right.append(right[j])
                j += 1
            else:
                return None
        groups.append((group_left, group_right))
    return groups


def _sink_reshape(op) -> bool:
    """Rewrites `reshape(transpose(x, p))` as `transpose(reshape(x), p')` when each group of
    dims the reshape splits or merges lies in order, side by side, in x as well (the
    reshapes around a nearest upsampling's broadcast, a flatten of 1 x 1 pooled features);
    False otherwise. Shapes are static, or static but for a leading dim that both the
    transpose and the reshape keep in place (a `stablehlo.dynamic_reshape`, whose run-time
    shape is then permuted alike)."""
    source = producer(op.operands[0], "stablehlo.transpose")
    if source is None:
        return False
    p = _permutation(source)
    x = source.operands[0]
    before, after = _shape(op.operands[0]), _shape(op.results[0])
    dynamic = op.name == "stablehlo.dynamic_reshape"
    if (None in before or None in after) and (not dynamic or p[0] != 0):
        return False
    groups = _leading_dynamic_groups(before, after)
    if groups is None:
        return False
    x_shape = [-1 if n is None else n for n in _shape(x)]
    # Where each group starts in x; its dims of x must be consecutive (size-1 dims aside).
    real = [d for d, n in enumerate(x_shape) if n != 1]
    starts = {}
    for index, (group_before, _) in enumerate(groups):
        dims = [p[d] for d in group_before]
        at = real.index(dims[0])
        if dims != real[at:at + len(dims)]:
            return False
        starts[dims[0]] = index
    # The reshaped x: the groups' result sizes in x's order, each size-1 result dim right
    # after the group of the result dim before it (first when none is).
    follows = {}    # group index (-1: none) -> size-1 result dims after it
    group_of = {d: k for k, (_, group_after) in enumerate(groups) for d in group_after}
    previous = -1
    for d, n in enumerate(after):
        if n == 1:
            follows.setdefault(previous, []).append(d)
        else:
            previous = group_of[d]
    order = list(follows.get(-1, []))    # result dim held by each dim of the reshaped x
    for d in real:
        if d in starts:
            order += groups[starts[d]][1] + follows.get(starts[d], [])
    result_type = ir.RankedTensorType(op.results[0].type)
    new_shape = [result_type.shape[d] for d in order]
    permutation = [order.index(d) for d in range(len(after))]
    with ir.InsertionPoint(op), op.location:
        new_type = ir.RankedTensorType.get(new_shape, result_type.element_type)
        operands = [x, _permuted_shape(op.operands[1], order)] if dynamic else [x]
        reshaped = ir.Operation.create(op.name, results=[new_type], operands=operands).result
        result = reshaped if permutation == list(range(len(permutation))) else \
            _transpose(reshaped, permutation)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


# Attributes of stablehlo.dynamic_broadcast_in_dim that list operand dims.
_KNOWN_DIMS = ("known_expanding_dimensions", "known_nonexpanding_dimensions")


def _sink_broadcast(op) -> bool:
    """Rewrites a broadcast that keeps rank and dim order (it only widens size-1 dims) of
    `transpose(x, p)` as `transpose(broadcast of x, p)`, a dynamic broadcast's run-time
    shape permuted; False otherwise."""
    source = producer(op.operands[0], "stablehlo.transpose")
    if source is None:
        return False
    dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
    if dims != list(range(ir.RankedTensorType(op.results[0].type).rank)):
        return False
    p = _permutation(source)
    to_x = _inverse(p)     # dim i of the broadcast of x is dim to_x[i] of op's result
    attributes = _attributes(op)
    for name in _KNOWN_DIMS:
        if name in attributes:
            attributes[name] = ir.DenseI64ArrayAttr.get(
                sorted(p[d] for d in ir.DenseI64ArrayAttr(attributes[name])))
    with ir.InsertionPoint(op), op.location:
        operands = [source.operands[0]]
        if op.name == "stablehlo.dynamic_broadcast_in_dim":
            operands.append(_permuted_shape(op.operands[1], to_x))
        inner = ir.Operation.create(
            op.name, results=[_permuted_type(op.results[0].type, to_x)],
            operands=operands, attributes=attributes).result
        result = _transpose(inner, p)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _fold_transpose_pair(op) -> bool:
    source = producer(op.operands[0], "stablehlo.transpose")
    if source is None:
        return False
    first, second = _permutation(source), _permutation(op)
    composed = [first[d] for d in second]
    with ir.InsertionPoint(op), op.location:
        result = source.operands[0] if composed == list(range(len(composed))) else \
            _transpose(source.operands[0], composed)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return True


def _hoist_shape_queries(block) -> None:
    """Moves each `shape.shape_of` of a transpose or an elementwise op to the value that
    op is computed from (permuted for a transpose): a dynamic engine's broadcasts ask for
    shapes, and a transpose kept only to be asked its shape would keep the convolution
    that feeds it from taking its epilogue (codegen/kernels/convolution.py)."""
    changed = True
    while changed:
        changed = False
        for op in list(block.operations):
            if op.name != "shape.shape_of" or not isinstance(op.results[0].type,
                                                             ir.RankedTensorType):
                continue
            source = op.operands[0]
            producer_op = producer(source, "stablehlo.transpose")
            elementwise = defining_op(source)
            # An elementwise op's operand of its own rank (clamp's bounds may be scalars).
            same_rank = None
            if elementwise is not None and elementwise.name in ELEMENTWISE:
                same_rank = next((v for v in elementwise.operands
                                  if isinstance(v.type, ir.RankedTensorType) and
                                  v.type.rank == source.type.rank), None)
            if same_rank is None:
                elementwise = None
            if producer_op is None and elementwise is None:
                continue
            with ir.InsertionPoint(op), op.location:
                if producer_op is not None:
                    inner = ir.Operation.create(
                        "shape.shape_of", results=[op.results[0].type],
                        operands=[producer_op.operands[0]]).result
                    shape = _permuted_shape(inner, _permutation(producer_op))
                else:
                    shape = ir.Operation.create(
                        "shape.shape_of", results=[op.results[0].type],
                        operands=[same_rank]).result
            op.results[0].replace_all_uses_with(shape)
            op.erase()
            changed = True


_PURE = ELEMENTWISE | {"stablehlo.transpose", "stablehlo.broadcast_in_dim",
                       "stablehlo.dynamic_broadcast_in_dim", "stablehlo.constant",
                       "stablehlo.reshape"}


def _erase_dead(block) -> None:
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.operations)):
            if op.name in _PURE and all(len(list(r.uses)) == 0 for r in op.results):
                op.erase()
                changed = True


class _Int8Convolutions:
    """Main's kernel calls of Blade's int8 convolutions (blade::quantized_conv2d and _add),
    whose float32 results and inputs can be NHWC buffers: the op makes and reads them as
    channels_last [N, C, H, W] tensors, which lie in memory as NHWC ones, so the call's
    spec marks them `float32:nhwc` (csrc/ral/kernel_calls.h) and neither the RAL nor the
    code transposes them. Each call has its own declaration (importer.kernel_call), whose
    type and spec change with its call."""

    def __init__(self, module, block):
        self.declarations = {}
        for op in module.body.operations:
            if op.operation.name == "func.func" and SPEC_ATTRIBUTE in op.attributes and \
                    ir.StringAttr(op.attributes[SPEC_ATTRIBUTE]).value.startswith(
                        "blade::quantized_conv2d"):
                self.declarations[ir.StringAttr(op.attributes["sym_name"]).value] = op

    def declaration(self, op):
        if op.name != "func.call":
            return None
        return self.declarations.get(ir.FlatSymbolRefAttr(op.attributes["callee"]).value)

    def calls(self, block):
        return [op for op in block.operations if self.declaration(op) is not None]

    def result_to_nhwc(self, op) -> bool:
        """Makes the call's float32 4-d result NHWC, read as NCHW through a transpose that
        then sinks like a convolution's."""
        if len(op.results) != 1 or not _float_4d(op.results[0].type):
            return False
        declaration = self.declaration(op)
        nhwc = _permuted_type(op.results[0].type, TO_NHWC)
        with ir.InsertionPoint(op), op.location:
            call = self._recreate(op, list(op.operands), [nhwc])
            back = _transpose(call.results[0], TO_NCHW)
        self._mark(declaration, results=[0])
        self._retype(declaration, list(op.operands), [nhwc])
        op.results[0].replace_all_uses_with(back)
        op.erase()
        return True

    def take_nhwc_operands(self, op) -> bool:
        """Passes each float32 4-d operand that is a transpose of NHWC data to NCHW as that
        NHWC data."""
        declaration = self.declaration(op)
        operands = list(op.operands)
        marked = self._marked(declaration)
        taken = [i for i, v in enumerate(operands)
                 if i not in marked and _float_4d(v.type) and _is_transpose(v, TO_NCHW)]
        if not taken:
            return False
        for i in taken:
            operands[i] = producer(operands[i], "stablehlo.transpose").operands[0]
        with ir.InsertionPoint(op), op.location:
            call = self._recreate(op, operands, [r.type for r in op.results])
        self._mark(declaration, operands=taken)
        self._retype(declaration, operands, [r.type for r in op.results])
        for old, new in zip(op.results, call.results):
            old.replace_all_uses_with(new)
        op.erase()
        return True

    @staticmethod
    def _recreate(op, operands, results):
        return ir.Operation.create("func.call", results=results, operands=operands,
                                   attributes=_attributes(op))

    @staticmethod
    def _retype(declaration, operands, results) -> None:
        declaration.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([v.type for v in operands], results))

    @staticmethod
    def _marked(declaration) -> set:
        """The operand positions the spec already marks NHWC (taken once only)."""
        dtypes = ir.StringAttr(declaration.attributes[SPEC_ATTRIBUTE]).value.split(" ")[1]
        return {i for i, d in enumerate(dtypes.split(",")) if d.endswith(":nhwc")}

    @staticmethod
    def _mark(declaration, operands=(), results=()) -> None:
        fields = ir.StringAttr(declaration.attributes[SPEC_ATTRIBUTE]).value.split(" ")
        for field, positions in ((1, operands), (2, results)):
            dtypes = fields[field].split(",")
            for i in positions:  # unmarked: results once, operands past _marked
                dtypes[i] += ":nhwc"
            fields[field] = ",".join(dtypes)
        declaration.attributes[SPEC_ATTRIBUTE] = ir.StringAttr.get(" ".join(fields))


def _float_4d(t) -> bool:
    return isinstance(t, ir.RankedTensorType) and t.rank == 4 and \
        isinstance(t.element_type, ir.F32Type)


def to_channels_last(module, main) -> int:
    """The rewrite described in the module docstring, on function `main`; returns how many
    convolutions (int8 ones' kernel calls too) now run on NHWC data."""
    block = main.regions[0].blocks[0]
    with module.context:
        convolutions = [op for op in block.operations
                        if op.name == "stablehlo.convolution" and _nchw_convolution(op)]
        for op in convolutions:
            _convolve_nhwc(op)
        int8 = _Int8Convolutions(module, block)
        int8_calls = int8.calls(block)
        nhwc_results = sum(int8.result_to_nhwc(op) for op in int8_calls)
        if not convolutions and not nhwc_results:
            return 0  # nothing of this pass's own to sink: the model's transposes stay
        for _ in range(4 * len(list(block.operations))):
            changed = False
            for op in list(block.operations):
                if op.name == "stablehlo.transpose":
                    changed = _fold_transpose_pair(op) or changed
                elif op.name in ELEMENTWISE:
                    changed = _sink(op) or changed
                elif op.name == "stablehlo.reduce_window":
                    changed = _sink_window(op) or changed
                elif op.name == "stablehlo.concatenate":
                    changed = _sink_concatenate(op) or changed
                elif op.name in ("stablehlo.reshape", "stablehlo.dynamic_reshape"):
                    changed = _sink_reshape(op) or changed
                elif op.name in ("stablehlo.broadcast_in_dim",
                                 "stablehlo.dynamic_broadcast_in_dim"):
                    changed = _sink_broadcast(op) or changed
                elif int8.declaration(op) is not None:
                    changed = int8.take_nhwc_operands(op) or changed
            if not changed:
                break
        _hoist_shape_queries(block)
        _erase_dead(block)
    return len(convolutions) + len(int8_calls)
