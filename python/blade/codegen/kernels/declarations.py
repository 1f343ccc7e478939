"""Library calls kept as declarations through bufferization (a sort, a kernel call): they
have no computation of their own to stand in for them until library calls are lowered, and
a body that only allocated their results would tell bufferization their operands are not
read (see codegen/kernels/outlining.py and lowering.py). The same mark serves the library
calls of dynamic size, whose bodies do only allocate their results."""
from typing import List

from torch_mlir import ir
from torch_mlir.dialects import arith, builtin, func, memref


def read_only(function) -> None:
    """Marks the arguments of `function` (a declaration, or a body that only allocates its
    results) as only read; bufferization takes the mark over any body and keeps their
    buffers unwritten until the call (a declaration's are read and written as far as it
    knows, and a body that only allocates results would say they are not read, letting a
    later write into an operand's buffer happen before the call)."""
    arguments = len(ir.FunctionType(ir.TypeAttr(function.attributes["function_type"]).value)
                    .inputs)
    access = ir.DictAttr.get({"bufferization.access": ir.StringAttr.get("read")})
    function.attributes["arg_attrs"] = ir.ArrayAttr.get([access] * arguments)


def define_returning(function, callee: str, leading=(), trailing=(), element=None,
                     sizes=None) -> List:
    """Defines the bufferized declaration `function`, `(memrefs...) -> (memrefs...)`, as a
    call of the RAL function `callee` with the constants `leading` (attributes), its
    operands and its results as unranked memrefs, then the constants `trailing`; the
    results are allocated here (a dynamic size is that of the same dim of the first
    operand, or with `sizes`, `sizes(arguments, result_type)`'s values) and returned. With
    `element` (an MLIR type), every buffer is passed as an unranked memref of that element
    type: one declaration of `callee` then serves calls whose buffers differ in dtype (an
    unranked memref is (rank, descriptor) whatever its element type; the RAL reads the
    dtypes elsewhere). Returns the call's operands (for its declaration)."""
    function_type = ir.FunctionType(ir.TypeAttr(function.attributes["function_type"]).value)
    block = function.regions[0].blocks.append(*function_type.inputs)
    with ir.InsertionPoint(block):
        index = ir.IndexType.get()
        results = []
        for t in function_type.results:
            result = ir.MemRefType(t)
            dynamic = sizes(list(block.arguments), result) if sizes is not None else [
                memref.DimOp(block.arguments[0], arith.ConstantOp(index, d).result).result
                for d in range(result.rank) if result.is_dynamic_dim(d)]
            results.append(memref.AllocOp(result, dynamic, []).result)
        buffers = [memref.CastOp(ir.UnrankedMemRefType.get(
            ir.ShapedType(b.type).element_type, None), b).result
            for b in list(block.arguments) + results]
        if element is not None:
            common = ir.UnrankedMemRefType.get(element, None)
            buffers = [b if b.type == common else
                       builtin.UnrealizedConversionCastOp([common], [b]).result
                       for b in buffers]
        operands = [arith.ConstantOp(a.type, a).result for a in leading] + buffers + \
            [arith.ConstantOp(a.type, a).result for a in trailing]
        func.CallOp([], ir.FlatSymbolRefAttr.get(callee), operands)
        func.ReturnOp(results)
    return operands
