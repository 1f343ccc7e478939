"""Row gathers (index_select, embedding, indexing by a tensor) as linalg loops Blade
writes itself.

Torch-MLIR lowers these ops to `stablehlo.gather` when every size is static, and to
`stablehlo.dynamic_gather` otherwise, with the slice sizes as an operand computed at run
time. StableHLO's linalg lowering takes only the first (so in a dynamic engine the op was
left unconverted and its node stayed in TorchScript), and clamps an index outside the
table into it, where PyTorch raises an error: a wrong answer instead of an error.
`lower_gathers` rewrites each gather of either kind that takes whole slices along one
indexed dim d (slice sizes 1 at d and the operand's own size elsewhere, which is how
Torch-MLIR writes all three ops) as

    out = linalg.generic over the result's dims, reading indices[batch dims]:
              i = indices[b]; if i is outside [0, size(operand, d)): report it to the RAL
              out[r] = operand[offset dims of r, with clamp(i) at d]

A reported index makes the engine call run its TorchScript fallback, whose op raises
PyTorch's own error; the clamp keeps the read inside the table meanwhile.

`stablehlo.reverse` (flip) of a dynamic size is left unconverted too;
`lower_dynamic_reverses` writes it as out[r] = operand[r with size(d) - 1 - r_d at each
reversed dim d].
"""
from typing import Optional

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from torch_mlir.dialects import func

from blade.codegen.ir_queries import defining_op, generic_text, rewrite_each


# The RAL function a gather calls with an index outside its table (csrc/ral/ral_kernels.h):
# the engine call then falls back to TorchScript, whose op raises PyTorch's error.
OUT_OF_RANGE = "blade_ral_index_out_of_range"


def _constant_int(value) -> Optional[int]:
    op = defining_op(value)
    if op is None or op.name != "arith.constant":
        return None
    attr = op.attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _is_size_of(value, operand, dim: int, static_size: Optional[int]) -> bool:
    """Whether `value` (an i64 slice size) is the size of `operand`'s dim `dim`."""
    if static_size is not None:
        return _constant_int(value) == static_size
    cast = defining_op(value)
    if cast is None or cast.name != "arith.index_cast":
        return False
    size = defining_op(cast.operands[0])
    return size is not None and size.name == "tensor.dim" and \
        size.operands[0] == operand and _constant_int(size.operands[1]) == dim


def _whole_slices(op, dim: int) -> bool:
    """Whether the gather's slice sizes are 1 at `dim` and whole elsewhere."""
    operand = op.operands[0]
    operand_type = ir.RankedTensorType(operand.type)
    if op.name == "stablehlo.gather":            # static sizes, as an attribute
        sizes = list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"]))
        return len(sizes) == operand_type.rank and all(
            size == 1 if d == dim else
            not operand_type.is_dynamic_dim(d) and size == operand_type.shape[d]
            for d, size in enumerate(sizes))
    sizes = defining_op(op.operands[2])
    if sizes is None or sizes.name != "tensor.from_elements" or \
            len(sizes.operands) != operand_type.rank:
        return False
    for d, size in enumerate(sizes.operands):
        if d == dim:
            if _constant_int(size) != 1:
                return False
            continue
        static = None if operand_type.is_dynamic_dim(d) else operand_type.shape[d]
        if not _is_size_of(size, operand, d, static):
            return False
    return True


def _replacement(op) -> Optional[str]:
    """The text of a function computing `op` with one loop nest, or None when `op` is not
    a gather of whole slices along one dim (see the module docstring)."""
    numbers = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    collapsed = list(numbers.collapsed_slice_dims)
    index_map = list(numbers.start_index_map)
    offset_dims = list(numbers.offset_dims)
    operand_type = ir.RankedTensorType(op.operands[0].type)
    indices_type = ir.RankedTensorType(op.operands[1].type)
    result_type = ir.RankedTensorType(op.results[0].type)
    if list(numbers.operand_batching_dims) or len(index_map) != 1 or \
            collapsed != index_map or numbers.index_vector_dim != indices_type.rank or \
            not isinstance(indices_type.element_type, ir.IntegerType):
        return None
    dim = index_map[0]
    batch_dims = [r for r in range(result_type.rank) if r not in offset_dims]
    kept = [d for d in range(operand_type.rank) if d != dim]
    if len(offset_dims) != len(kept) or len(batch_dims) != indices_type.rank or \
            not _whole_slices(op, dim):
        return None
    index_element = str(indices_type.element_type)
    x, idx, result = (str(t) for t in (operand_type, indices_type, result_type))
    lines = [f"func.func private @gather(%x: {x}, %idx: {idx}) -> {result} {{",
             f"  %dim = arith.constant {dim} : index",
             f"  %rows = tensor.dim %x, %dim : {x}",
             "  %one = arith.constant 1 : index",
             "  %zero = arith.constant 0 : index",
             "  %last = arith.subi %rows, %one : index"]
    sizes = []
    for r in range(result_type.rank):
        if not result_type.is_dynamic_dim(r):
            continue
        if r in batch_dims:
            source, source_dim = "%idx", batch_dims.index(r)
            source_type = idx
        else:
            source, source_dim = "%x", kept[offset_dims.index(r)]
            source_type = x
        lines += [f"  %c{r} = arith.constant {source_dim} : index",
                  f"  %size{r} = tensor.dim {source}, %c{r} : {source_type}"]
        sizes.append(f"%size{r}")
    loops = [f"d{r}" for r in range(result_type.rank)]
    domain = "(" + ", ".join(loops) + ")"
    maps = [f"affine_map<{domain} -> ({', '.join(loops[r] for r in batch_dims)})>",
            f"affine_map<{domain} -> ({', '.join(loops)})>"]
    element = str(result_type.element_type)
    reads = []
    for d in range(operand_type.rank):
        reads.append("%row" if d == dim else f"%o{d}")
    body = [f"    %i = arith.index_cast %in : {index_element} to index",
            "    %below = arith.cmpi slt, %i, %zero : index",
            "    %above = arith.cmpi sgt, %i, %last : index",
            "    %outside = arith.ori %below, %above : i1",
            "    scf.if %outside {",
            "      %bad = arith.index_cast %i : index to i64",
            "      %size = arith.index_cast %rows : index to i64",
            f"      func.call @{OUT_OF_RANGE}(%bad, %size) : (i64, i64) -> ()",
            "    }",
            "    %low = arith.maxsi %i, %zero : index",
            "    %row = arith.minsi %low, %last : index"]
    for d in kept:
        body.append(f"    %o{d} = linalg.index {offset_dims[kept.index(d)]} : index")
    body.append(f"    %v = tensor.extract %x[{', '.join(reads)}] : {x}")
    lines.append(f"  %empty = tensor.empty({', '.join(sizes)}) : {result}")
    lines += generic_text("out", maps, ['"parallel"'] * result_type.rank, [("%idx", idx)],
                          [("%empty", result)], [("%in", index_element), ("%unused", element)],
                          body, "%v", element)
    lines += [f"  return %out : {result}", "}",
              f"func.func private @{OUT_OF_RANGE}(i64, i64)"]   # for the text to verify
    return "\n".join(lines)


def lower_gathers(module) -> int:
    """Rewrites each `stablehlo.gather` and `stablehlo.dynamic_gather` this module takes
    (see its docstring) in place; returns how many were rewritten."""
    rewritten = rewrite_each(module, "stablehlo.gather", _replacement) + \
        rewrite_each(module, "stablehlo.dynamic_gather", _replacement)
    if rewritten:
        with module.context, ir.Location.unknown(), ir.InsertionPoint(module.body):
            i64 = ir.IntegerType.get_signless(64)
            func.FuncOp(OUT_OF_RANGE, ([i64, i64], []), visibility="private")
    return rewritten


def _reverse_replacement(op) -> Optional[str]:
    """The text of a function computing a reverse of dynamic size with one loop nest."""
    t = ir.RankedTensorType(op.results[0].type)
    if t.has_static_shape:
        return None               # StableHLO's lowering takes it
    dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
    x, element = str(t), str(t.element_type)
    lines = [f"func.func private @reverse(%x: {x}) -> {x} {{",
             "  %one = arith.constant 1 : index"]
    sizes = []
    for d in range(t.rank):
        if t.is_dynamic_dim(d) or d in dims:
            lines += [f"  %c{d} = arith.constant {d} : index",
                      f"  %size{d} = tensor.dim %x, %c{d} : {x}",
                      f"  %last{d} = arith.subi %size{d}, %one : index"]
        if t.is_dynamic_dim(d):
            sizes.append(f"%size{d}")
    body, reads = [], []
    for d in range(t.rank):
        body.append(f"    %i{d} = linalg.index {d} : index")
        if d in dims:
            body.append(f"    %r{d} = arith.subi %last{d}, %i{d} : index")
        reads.append(f"%r{d}" if d in dims else f"%i{d}")
    body.append(f"    %v = tensor.extract %x[{', '.join(reads)}] : {x}")
    loops = ", ".join(f"d{d}" for d in range(t.rank))
    lines.append(f"  %empty = tensor.empty({', '.join(sizes)}) : {x}")
    lines += generic_text("out", [f"affine_map<({loops}) -> ({loops})>"],
                          ['"parallel"'] * t.rank, [], [("%empty", x)],
                          [("%unused", element)], body, "%v", element)
    lines += [f"  return %out : {x}", "}"]
    return "\n".join(lines)


def lower_dynamic_reverses(module) -> int:
    """Rewrites each `stablehlo.reverse` of dynamic size in place (see the module
    docstring); returns how many were rewritten."""
    return rewrite_each(module, "stablehlo.reverse", _reverse_replacement)
