"""How a built-in converter is registered: its overloads, their dtype rule and an optional
validator; the lowering is Torch-MLIR's own."""
from blade.dtypes import DtypeRule, define
from blade.partition.registry import REGISTRY, Converter


def builtin(schemas, rule: DtypeRule, *, compute: bool = True, validator=None) -> None:
    """Registers each of `schemas` with `rule` in the dtype table.

    Example:
        >>> builtin(["aten::tanh"], FLOAT_SAME)
    """
    define(schemas, rule)
    for schema in schemas:
        REGISTRY.register(Converter(schema, validator=validator, compute=compute))
