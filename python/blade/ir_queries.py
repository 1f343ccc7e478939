"""Questions about MLIR values that several code generation steps ask (library calls,
attention, layouts, shape assumptions): which op produced a value, which ops use it, and
which ops have a name."""
from torch_mlir import ir


def as_operation(op):
    """The generic Operation of an op view (ops compare equal only in that form)."""
    return op.operation if hasattr(op, "operation") else op


def defining_op(value):
    """The op that defines `value` (as an Operation), or None for a block argument."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else as_operation(owner)


def only_user(value):
    """The one op that uses `value`, or None when it has no use or several."""
    uses = list(value.uses)
    return as_operation(uses[0].owner) if len(uses) == 1 else None


def producer(value, name: str):
    """The op named `name` that defines `value`, or None (a block argument, another op).

    Example:
        >>> transpose = producer(operand, "stablehlo.transpose")
    """
    op = defining_op(value)
    return op if op is not None and op.name == name else None


def ops_named(module, name: str) -> list:
    """Every op named `name` in `module`, in walk order.

    Example:
        >>> reshapes = ops_named(module, "stablehlo.dynamic_reshape")
    """
    found = []

    def visit(op):
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found
