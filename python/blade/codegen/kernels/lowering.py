"""The `lower-library-calls` pass (after bufferization): the body of each function that
`outline-library-calls` made (outlining.py) becomes one call to the RAL kernel
`blade_ral_<kind>_<type>` (csrc/ral/ral_kernels.h), which writes all of its result.

A function of static size has become `(inputs..., out)` on memrefs; one of dynamic size
only allocates and returns its result, which is handed to the kernel as `out`. Memrefs are
passed unranked, which the LLVM lowering turns into a (rank, descriptor pointer) pair of
arguments. A declaration (a sort, a kernel call) is defined as the kernel's call on
results it allocates (`declarations.define_returning`). The module also gets the table of
the kernel calls' specs (`kernel_calls.embed_table`) and the list of the params the code
reads only as weights (weight_arguments.py).
"""
from typing import List

from torch_mlir import ir
from torch_mlir.dialects import arith, func, memref

from blade.codegen.ir_queries import i64_array, strides_of
from blade.codegen.kernels import kernel_calls
from blade.codegen.kernels.declarations import define_returning
from blade.codegen.kernels.library_calls import (HEAD_VIEWS, KERNEL_ARGUMENTS, LIBRARY_CALL,
                                                 OUT_PERMUTATION, SCALE_DIVIDES, SCALE_OPERAND)
from blade.codegen.kernels.weight_arguments import embed_weight_arguments


def lower(module) -> None:
    """The pass: each library call's function becomes a call of its RAL kernel (see the
    module docstring)."""
    declared = set()
    calls = []
    with module.context, ir.Location.unknown():
        embed_weight_arguments(module)
        for function in list(module.body.operations):
            if function.operation.name != "func.func" or \
                    LIBRARY_CALL not in function.attributes:
                continue
            kind = ir.StringAttr(function.attributes[LIBRARY_CALL]).value
            if len(function.regions[0].blocks) == 0:  # a declaration: a sort or kernel call
                sizes = None
                if kind == kernel_calls.KIND:
                    calls.append(function)
                    callee, leading = kernel_calls.callee_of(function)
                    trailing = []
                    sizes = kernel_calls.result_sizes(function)
                else:
                    operands = ir.FunctionType(ir.TypeAttr(
                        function.attributes["function_type"]).value).inputs
                    callee = f"blade_ral_{kind}_{ir.ShapedType(operands[0]).element_type}"
                    leading = []
                    trailing = [function.attributes[f"blade.{key}"]
                                for key in KERNEL_ARGUMENTS[kind]]
                # A kernel call's buffers go as i8 memrefs: calls of one buffer count share
                # the RAL function whatever their dtypes (csrc/ral/kernel_calls.h).
                element = ir.IntegerType.get_signless(8) if kind == kernel_calls.KIND else None
                _declare(module, declared, callee,
                         define_returning(function, callee, leading, trailing, element,
                                          sizes))
                continue
            block = function.regions[0].blocks[0]
            terminator = block.operations[len(block.operations) - 1]
            returned = list(terminator.operands)
            if returned:      # dynamic: the body is the result's allocation (_outline_one)
                terminator.erase()
            else:
                for op in reversed(list(block.operations)):
                    op.erase()
            arguments = list(block.arguments) + returned
            # The kernel's symbol is named by its first operand's element type (a sort's
            # indices are i64 whatever the values are).
            element = ir.ShapedType(arguments[0].type).element_type
            callee = f"blade_ral_{kind}_{element}"
            with ir.InsertionPoint(block):
                if OUT_PERMUTATION in function.attributes:
                    arguments[-1] = _transposed_view(
                        arguments[-1], i64_array(function.attributes[OUT_PERMUTATION]))
                for operand, name in enumerate(HEAD_VIEWS):
                    if name in function.attributes:
                        arguments[operand] = _head_view(
                            arguments[operand], i64_array(function.attributes[name]))
                scale = None
                if SCALE_OPERAND in function.attributes:
                    scale = _run_time_scale(
                        arguments.pop(ir.IntegerAttr(function.attributes[SCALE_OPERAND]).value),
                        ir.IntegerAttr(function.attributes[SCALE_DIVIDES]).value == 1)
                operands = [memref.CastOp(ir.UnrankedMemRefType.get(
                    ir.ShapedType(a.type).element_type, None), a).result for a in arguments]
                for key in KERNEL_ARGUMENTS[kind]:
                    attr = function.attributes[f"blade.{key}"]
                    operands.append(scale if key == "scale" and scale is not None else
                                    arith.ConstantOp(attr.type, attr).result)
                func.CallOp([], ir.FlatSymbolRefAttr.get(callee), operands)
                func.ReturnOp(returned)
            _declare(module, declared, callee, operands)
        kernel_calls.embed_table(module, calls)


def _run_time_scale(buffer, divides: bool):
    """The f64 scale read from a one-element float memref (SCALE_OPERAND), inverted when
    the chain divides by it; built at the current insertion point."""
    index = ir.IndexType.get()
    f64 = ir.F64Type.get()
    zero = arith.ConstantOp(index, 0).result
    value = memref.LoadOp(buffer, [zero] * ir.ShapedType(buffer.type).rank).result
    if value.type != f64:
        value = arith.ExtFOp(f64, value).result
    if divides:
        value = arith.DivFOp(arith.ConstantOp(f64, 1.0).result, value).result
    return value


def _transposed_view(value, permutation: List[int]):
    """`value` (a memref of identity layout) seen with its dims in the order that
    `transpose(., permutation)` undoes: dim k of the view is dim inverse[k] of `value`."""
    inverse = [0] * len(permutation)
    for i, d in enumerate(permutation):
        inverse[d] = i
    t = ir.MemRefType(value.type)
    strides = strides_of(t)
    view = ir.MemRefType.get([t.shape[d] for d in inverse], t.element_type,
                             ir.StridedLayoutAttr.get(0, [strides[d] for d in inverse]))
    return memref.TransposeOp(view, value,
                              ir.AffineMapAttr.get(ir.AffineMap.get_permutation(inverse))
                              ).result


def _head_view(value, view: List[int]):
    """The heads that `attention.head_view` found in `value` (a memref of identity layout),
    as a strided view of it: `view` = [start, heads, head dim, *permutation]; the last dim
    from `start` on is split into [heads, head dim] and the dims are then permuted."""
    start, heads, head_dim, permutation = view[0], view[1], view[2], view[3:]
    t = ir.MemRefType(value.type)
    index = ir.IndexType.get()
    dynamic = ir.ShapedType.get_dynamic_size()
    dynamic_stride = ir.ShapedType.get_dynamic_stride_or_offset()

    def size(d):
        # (static size, or the index value of a dynamic one)
        if not t.is_dynamic_dim(d):
            return t.shape[d], None
        return dynamic, memref.DimOp(value, arith.ConstantOp(index, d).result).result

    # Sizes and strides of [kept dims..., heads, head dim], each (static or dynamic marker,
    # its value if dynamic); identity layout: each kept dim's stride is the product of the
    # sizes after it.
    kept = t.rank - 1
    sizes = [size(d) for d in range(kept)] + [(heads, None), (head_dim, None)]
    strides = [None] * (kept + 2)
    strides[kept], strides[kept + 1] = (head_dim, None), (1, None)
    running = (t.shape[kept], None)  # the stride after dim d: the base's last dim first
    for d in reversed(range(kept)):
        strides[d] = running
        static, dynamic_size = sizes[d]
        if running[1] is None and dynamic_size is None:
            running = (running[0] * static, None)
        else:
            left = running[1] if running[1] is not None else \
                arith.ConstantOp(index, running[0]).result
            right = dynamic_size if dynamic_size is not None else \
                arith.ConstantOp(index, static).result
            running = (dynamic_stride, arith.MulIOp(left, right).result)
    sizes = [sizes[p] for p in permutation]
    strides = [strides[p] for p in permutation]
    view_type = ir.MemRefType.get(
        [s for s, _ in sizes], t.element_type,
        ir.StridedLayoutAttr.get(start, [s for s, _ in strides]))
    return memref.ReinterpretCastOp(
        view_type, value, [], [v for _, v in sizes if v is not None],
        [v for _, v in strides if v is not None], [start], [s for s, _ in sizes],
        [s for s, _ in strides]).result


def _declare(module, declared: set, callee: str, operands) -> None:
    """Declares the RAL function `callee` once per module."""
    if callee not in declared:
        declared.add(callee)
        with ir.InsertionPoint.at_block_begin(module.body):
            func.FuncOp(callee, ([o.type for o in operands], []), visibility="private")
