"""Converters written by users: `blade.register_converter`.

A user converter turns one TorchScript node into StableHLO ops, built with the MLIR Python
bindings of the torch-mlir wheel:

    @blade.register_converter("mylib::scaled_tanh", priority=100,
                              dtypes={"*": ("float32",)})
    def convert(ctx):
        x = ctx.operands[0]
        scale = ctx.splat(ctx.arguments["scale"], ctx.result_types[0])
        return ctx.op("stablehlo.multiply", [ctx.op("stablehlo.tanh", [x]), scale])

How it is compiled: the importer writes the node as a call of a private function
`@blade_user_N` declared with the node's torch types. Torch-MLIR lowers everything around it
and converts the declaration's types to builtin tensors; `codegen.stablehlo.user_calls` then
builds the function's body by calling the converter with the function's arguments as
operands, and the call is inlined, so the user's ops fuse with their neighbours like any
other.
"""
from typing import Callable, Dict, Optional, Sequence

from blade import dtypes
# ConversionContext and constant_arguments are part of this module's API for converter
# authors (docs/adding_a_converter.md).
from blade.codegen.stablehlo.user_calls import ConversionContext  # noqa: F401
from blade.graph_queries import constant_arguments  # noqa: F401
from blade.partition.registry import REGISTRY, USER_PRIORITY, Converter
from blade.dtypes import DtypeRule


def register_converter(schema: str, capability_validator: Optional[Callable] = None,
                       priority: int = USER_PRIORITY,
                       dtypes: Optional[Dict[str, Sequence[str]]] = None,
                       result_dtype: str = "same", compute: bool = True):
    """Decorator: `fn(ctx: ConversionContext)` converts nodes calling `schema` (an exact
    overload, "aten::gelu" or "mylib::op" for a torch.library custom op) to StableHLO and
    returns the result value (or a list, one per output).

    `capability_validator(node)` returns None to accept a node or the reason it refuses;
    the highest `priority` accepting converter wins (built-ins have 0). `dtypes` gives the
    allowed dtypes per tensor argument name ("*" for the rest), the dtype table's entry
    for this converter; by default float32 only.

    Returns the registered `Converter`, which `blade.unregister_converter` removes.

    Example:
        >>> @blade.register_converter("mylib::scaled_tanh")
        ... def convert(ctx):
        ...     return ctx.op("stablehlo.tanh", ctx.operands)
    """

    rule = DtypeRule(args={k: tuple(v) for k, v in (dtypes or {"*": ("float32",)}).items()},
                     result=result_dtype)
    for allowed in rule.args.values():
        unknown = [d for d in allowed if d not in _KNOWN_DTYPES]
        if unknown:
            raise ValueError(f"register_converter({schema!r}): unknown dtype(s) {unknown}; "
                             f"use names from {sorted(_KNOWN_DTYPES)}")
    if "(" in schema or "::" not in schema:
        raise ValueError(f"register_converter: {schema!r} is not an op overload name like "
                         "'aten::add.Tensor' or 'mylib::op'")

    def wrap(fn):
        return REGISTRY.register(Converter(schema, lower=fn, validator=capability_validator,
                                           priority=priority, compute=compute,
                                           dtype_rule=rule, origin=_origin(fn)))
    return wrap


_KNOWN_DTYPES = set(dtypes.DTYPE_NAMES.values())


def unregister_converter(converter: Converter) -> None:
    REGISTRY.unregister(converter)


def _origin(fn) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
    return f"user: {getattr(fn, '__qualname__', fn)}{where}"
