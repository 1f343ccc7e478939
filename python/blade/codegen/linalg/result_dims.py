"""Size queries of loop nests' results asked of where the size comes from, so that
elementwise fusion sees producers of one use.

Upstream's `linalg-fuse-elementwise-ops` fuses a producer into its consumer only when the
producer's result has one use. With dynamic sizes, the empty tensor a consumer writes is
sized by `tensor.dim` of the producer's result (or of an `expand_shape` of it): a second
use. A bias add and the transpose of attention heads after it then stayed two loop nests
in a dynamic engine, one in a static one. This rewrite points each such query at the
size's source:

    %r = linalg.generic ... outs(%init)            %r = linalg.generic ... outs(%init)
    %d = tensor.dim %r, %c1                 ==>    %d = tensor.dim %init, %c1
    %e = tensor.expand_shape %r ... output_shape [1, %n, 12, 64]
    %m = tensor.dim %e, %c1                 ==>    (uses of %m read %n)

Upstream's `resolve-ranked-shaped-type-result-dims` resolves the sizes of every op; run
there, the dynamic engine of a BERT layer disagreed with TorchScript, so only these two
kinds of query are resolved.
"""
from torch_mlir import ir

from blade.codegen.ir_queries import defining_op, i64_array, ops_named, output_count


def _constant_index(value):
    """The integer an `arith.constant` of index type defines, or None."""
    op = defining_op(value)
    if op is None or op.name != "arith.constant":
        return None
    return ir.IntegerAttr(op.attributes["value"]).value


def resolve_result_dims(module) -> int:
    """Rewrites the queries in `module` as above; returns how many."""
    resolved = 0
    for dim in ops_named(module, "tensor.dim"):
        source = dim.operands[0]
        owner = defining_op(source)
        if owner is None:
            continue
        if owner.name.startswith("linalg.") and "operandSegmentSizes" in owner.attributes:
            # Result i of a linalg op has the sizes of its init i (the last operands).
            first_init = len(owner.operands) - output_count(owner)
            dim.operands[0] = owner.operands[first_init + ir.OpResult(source).result_number]
            resolved += 1
        elif owner.name == "tensor.expand_shape":
            position = _constant_index(dim.operands[1])
            if position is None:
                continue
            sizes = i64_array(owner.attributes["static_output_shape"])
            if sizes[position] != ir.ShapedType.get_dynamic_size():
                continue   # a static size: canonicalization folds the query to it
            # The dynamic sizes follow the source among the operands, in order.
            k = sum(1 for size in sizes[:position] if size == ir.ShapedType.get_dynamic_size())
            dim.result.replace_all_uses_with(owner.operands[1 + k])
            dim.erase()
            resolved += 1
    return resolved
