"""Kernel calls (blade.partition.kernel_calls) in the generated code.

The importer declares each call as a private function `@blade_kernel_N` whose attribute
holds the call's spec, and main calls it; Torch-MLIR's passes convert the declaration's
types with main's. Then:

1. `outline` (with the other library calls, on StableHLO) marks each declaration as a
   library call of kind "kernel_call", numbers it, in module order, and marks its
   arguments as only read (`bufferization.access`). It stays a declaration through
   bufferization, which then knows the call reads its operands (no write into one of
   their buffers is moved before it) and gives it memref results it returns.
2. `lowering.lower` gives it its body (`callee_of`): the results allocated, one
   call of `blade_ral_kernel_call_<n>(call, memrefs...)` (csrc/ral/kernel_calls.h), `n`
   the number of its operands and results, and the results returned; `embed_table` writes
   the specs, one line per call in their numbers' order, into the library as the string
   its function `blade_kernel_calls()` returns, which the engine parses when it loads the
   code.
"""
from torch_mlir import ir
from torch_mlir.dialects import arith, llvm, memref

from blade.codegen.errors import CodegenError
from blade.codegen.kernels.declarations import read_only
from blade.kernel_call_spec import (MAX_TENSORS, SIZES_OF_FIRST_OPERAND, SPEC_ATTRIBUTE,
                                    WINDOWED, channel_dim, int_list)

KIND = "kernel_call"
# The call's number: its line in the table.
CALL_INDEX = "blade.call"
TABLE_SYMBOL = "blade_kernel_calls"


def outline(module, library_call_attribute: str) -> int:
    """Step 1; returns how many calls there are."""
    count = 0
    for op in module.body.operations:
        if op.operation.name != "func.func" or SPEC_ATTRIBUTE not in op.attributes or \
                len(op.regions[0].blocks) > 0:
            continue
        function_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        results = [ir.RankedTensorType(t) for t in function_type.results]
        fields = _spec_fields(op)
        what = fields[0]
        if not all(t.has_static_shape for t in results) and \
                not _sizes_follow_first_operand(what, function_type, results) and \
                not _windowed_result(fields, function_type, results):
            raise CodegenError(f"the kernel call of {what} has a result of dynamic size")
        buffers = len(function_type.inputs) + len(results)
        if buffers > MAX_TENSORS:  # blade.partition.kernel_calls refuses such nodes
            raise CodegenError(f"the kernel call of {what} takes {buffers} tensors; kernel "
                               f"calls take at most {MAX_TENSORS}")
        read_only(op)
        op.attributes[library_call_attribute] = ir.StringAttr.get(KIND)
        op.attributes[CALL_INDEX] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), count)
        count += 1
    return count


def _sizes_follow_first_operand(what: str, function_type, results) -> bool:
    """Whether the one result's dynamic dims are dims of the first operand of the same rank,
    its last dim static (SIZES_OF_FIRST_OPERAND): define_returning allocates it so."""
    if what not in SIZES_OF_FIRST_OPERAND or len(results) != 1 or not function_type.inputs:
        return False
    result, first = results[0], ir.RankedTensorType(function_type.inputs[0])
    return result.rank == first.rank and not result.is_dynamic_dim(result.rank - 1) and \
        all(not result.is_dynamic_dim(d) or first.is_dynamic_dim(d)
            for d in range(result.rank - 1))


def _windowed_result(fields, function_type, results) -> bool:
    """Whether the one result of a WINDOWED op's call (its spec's `fields`) is 4-d with
    static channels, over a 4-d first operand: result_sizes computes its other dims."""
    if fields[0].split(".")[0] not in WINDOWED or len(results) != 1 or \
            not function_type.inputs:
        return False
    first = ir.RankedTensorType(function_type.inputs[0])
    result = results[0]
    return result.rank == 4 and first.rank == 4 and \
        not result.is_dynamic_dim(channel_dim(fields[2].split(",")[0]))


def _spec_fields(declaration):
    return ir.StringAttr(declaration.attributes[SPEC_ATTRIBUTE]).value.split(" ")


def result_sizes(function):
    """For `declarations.define_returning`: how the call's result's dynamic dims are
    computed from its operands (`sizes(arguments, result_type)` gives their index values
    in order), or None where they are the first operand's dims (SIZES_OF_FIRST_OPERAND).
    A WINDOWED op's batch is its input's, and each spatial dim
    max(0, (in + 2 padding - dilation (kernel - 1) - 1) floordiv stride + 1), as PyTorch
    computes it (with ceil_mode, rounded up, less a window that would start in the right
    padding): a window that does not fit gets an empty buffer, and the op then raises its
    own error."""
    fields = _spec_fields(function)
    window = WINDOWED.get(fields[0].split(".")[0])
    if window is None:
        return None
    arguments = fields[3:]
    stride, padding, dilation = (int_list(arguments[i]) for i in
                                 (window.stride, window.padding, window.dilation))
    function_type = ir.FunctionType(ir.TypeAttr(function.attributes["function_type"]).value)
    if window.kernel is None:  # the weight's, static
        kernel = list(ir.ShapedType(function_type.inputs[1]).shape[2:])
    else:
        kernel = int_list(arguments[window.kernel])
    ceil = window.ceil_mode is not None and arguments[window.ceil_mode] == "b1"
    input_spatial = _spatial_dims(fields[1].split(",")[0])
    result_spatial = _spatial_dims(fields[2].split(",")[0])

    def sizes(operands, result_type):
        index = ir.IndexType.get()

        def constant(value):
            return arith.ConstantOp(index, value).result

        def dim(d):
            return memref.DimOp(operands[0], constant(d)).result

        values = []
        for d in range(result_type.rank):
            if not result_type.is_dynamic_dim(d):
                continue
            if d == 0:
                values.append(dim(0))
                continue
            if d not in result_spatial:
                raise CodegenError(f"the kernel call of {fields[0]} has a result whose dim "
                                   f"{d}, its channels, is dynamic")
            axis = result_spatial.index(d)
            size = dim(input_spatial[axis])
            span = 2 * padding[axis] - dilation[axis] * (kernel[axis] - 1) - 1
            steps = arith.FloorDivSIOp(
                arith.AddIOp(size, constant(span + (stride[axis] - 1 if ceil else 0))).result,
                constant(stride[axis])).result
            out = arith.AddIOp(steps, constant(1)).result
            if ceil:  # as PyTorch's pooling: no window may start in the right padding
                last_start = arith.MulIOp(steps, constant(stride[axis])).result
                past = arith.CmpIOp(arith.CmpIPredicate.sge, last_start,
                                    arith.AddIOp(size, constant(padding[axis])).result).result
                out = arith.SelectOp(past, steps, out).result
            values.append(arith.MaxSIOp(out, constant(0)).result)
        return values

    return sizes


def _spatial_dims(dtype: str):
    """The H and W dims of a WINDOWED op's 4-d tensor of spec dtype `dtype`."""
    return [1, 2] if channel_dim(dtype) == 3 else [2, 3]


def callee_of(function):
    """Step 2 for one kernel call's declaration: the RAL function its definition calls
    (`declarations.define_returning`, from `lowering.lower`) and the attributes passed
    before its buffers (its number)."""
    function_type = ir.FunctionType(ir.TypeAttr(function.attributes["function_type"]).value)
    callee = f"blade_ral_{KIND}_{len(function_type.inputs) + len(function_type.results)}"
    return callee, [function.attributes[CALL_INDEX]]


def embed_table(module, functions) -> None:
    """Step 2's table: the specs of the kernel-call `functions`, by their numbers, as the
    string the exported function `blade_kernel_calls()` returns (`embed_string`)."""
    by_index = {ir.IntegerAttr(f.attributes[CALL_INDEX]).value:
                ir.StringAttr(f.attributes[SPEC_ATTRIBUTE]).value for f in functions}
    if not by_index:
        return
    if sorted(by_index) != list(range(len(by_index))):
        raise CodegenError(f"kernel calls numbered {sorted(by_index)}: a call was lost")
    embed_string(module, TABLE_SYMBOL,
                 "\n".join(by_index[i] for i in range(len(by_index))).encode())


def embed_string(module, symbol: str, text: bytes) -> None:
    """`text` as an internal NUL-terminated string and the exported function `symbol()`
    that returns it (a function, not an exported global, so that the module still splits
    into parts that compile side by side: codegen/llvm/native.partition)."""
    ptr = llvm.PointerType.get()
    data = text + b"\0"
    with ir.InsertionPoint(module.body):
        # The bindings have no builder for LLVM's linkage attribute: made from its spelling.
        llvm.GlobalOp(llvm.ArrayType.get(ir.IntegerType.get_signless(8), len(data)),
                      f"{symbol}_text", ir.Attribute.parse("#llvm.linkage<internal>"),
                      constant=True, value=ir.StringAttr.get(data), addr_space=0)
        function = llvm.LLVMFuncOp(symbol, ir.TypeAttr.get(llvm.FunctionType.get(ptr, [])))
    with ir.InsertionPoint(function.regions[0].blocks.append()):
        llvm.ReturnOp(arg=llvm.AddressOfOp(ptr, f"{symbol}_text").result)
