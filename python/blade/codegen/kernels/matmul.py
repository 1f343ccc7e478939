"""Matrix products that the RAL runs as PyTorch's GEMM (`blade_ral_matmul_<type>`): the
`stablehlo.dot_general` forms the kernel takes, with the transposes of the last two dims
and broadcasts of leading (batch) dims that feed its operands, which move into the call so
that the kernel reads a weight in place (a transpose flag; the kernel broadcasts batch
dims itself) instead of a copy made per call. attention.py recognizes an attention chain's
two products the same way.
"""
from typing import List, Optional, Tuple

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo

from blade.codegen.ir_queries import i64_array, producer, rank_of
from blade.codegen.kernels.library_calls import element_suffix


def _peel_operand(value, is_rhs: bool) -> Tuple[object, List, bool]:
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


def matmul_form(op) -> Optional[Tuple[object, object, List, dict]]:
    """(lhs source, rhs source, peeled ops, attributes) for a dot_general the RAL runs, or
    None.

    Example:
        >>> matmul_form(dot)   # dot_general(%x, transpose(%w)), nn.Linear's
        (%x, %w, [transpose], {'kind': 'matmul', 'transpose_b': 1})
    """
    dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = op.operands[0], op.operands[1]
    rank = rank_of(lhs)
    batch = list(range(rank - 2))
    if rank < 2 or rank_of(rhs) != rank or element_suffix(lhs) is None:
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
    lhs_source, lhs_peeled, _ = _peel_operand(lhs, is_rhs=False)
    rhs_source, rhs_peeled, flipped = _peel_operand(rhs, is_rhs=True)
    return lhs_source, rhs_source, lhs_peeled + rhs_peeled, {
        "kind": "matmul", "transpose_b": int(transposed != flipped)}
