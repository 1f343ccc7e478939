"""Built-in converters, one module per op family. Registering is thin: each op's lowering
is Torch-MLIR's own torch-to-StableHLO conversion; what lives here is which overloads are
compiled, their dtype rules, and validators for the cases the lowering cannot take."""
from blade.partition.dtypes import DtypeRule, define
from blade.partition.registry import REGISTRY, Converter


def builtin(schemas, rule: DtypeRule, *, compute: bool = True, validator=None) -> None:
    define(schemas, rule)
    for schema in schemas:
        REGISTRY.register(Converter(schema, validator=validator, compute=compute))


from . import conv, elementwise, linalg, reduction, view  # noqa: E402,F401  (registers them)
