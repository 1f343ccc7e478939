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
`@blade_user_N` declared with the node's torch types. Torch-MLIR lowers everything around
it and converts the declaration's types to builtin tensors; `fill_bodies` then builds the
function's body by calling the converter with the function's arguments as operands, and
the call is inlined, so the user's ops fuse with their neighbours like any other.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from torch_mlir import ir
from torch_mlir.dialects import func

from blade.partition import dtypes
from blade.importer import UserCall, node_location
# constant_arguments is part of this module's API for converter authors (docs/).
from blade.partition.registry import (REGISTRY, USER_PRIORITY, Converter,  # noqa: F401
                                      constant_arguments, schema_name)


class ConverterError(Exception):
    """A user converter failed or built invalid IR; the message names it and the node, and
    `node_index` is the node's index in its cluster (see importer.node_location)."""

    def __init__(self, message: str, node_index: Optional[int] = None):
        super().__init__(message)
        self.node_index = node_index


class ConversionContext:
    """What a user converter gets: the node, its operands already converted, and helpers
    that insert StableHLO ops at the right place.

    Attributes:
        node: the TorchScript node being converted.
        operands: the node's tensor arguments, as MLIR values of builtin tensor types.
        arguments: the node's non-tensor arguments by schema name (compile-time constants).
        result_types: the MLIR types the converter must return, one per output.
    """

    def __init__(self, node, operands, arguments, result_types, block):
        self.node = node
        self.operands: List[ir.Value] = list(operands)
        self.arguments: Dict[str, Any] = arguments
        self.result_types: List[ir.Type] = list(result_types)
        self._block = block

    def op(self, name: str, operands: Sequence[ir.Value],
           result_type: Optional[ir.Type] = None,
           attributes: Optional[Dict[str, Union[ir.Attribute, str]]] = None) -> ir.Value:
        """Inserts op `name` (e.g. "stablehlo.add") and returns its single result. The
        result type defaults to the first operand's; attributes may be given as MLIR
        attribute text ("array<i64: 1, 0>")."""
        attrs = {}
        for key, value in (attributes or {}).items():
            attrs[key] = ir.Attribute.parse(value) if isinstance(value, str) else value
        with ir.InsertionPoint(self._block):
            operation = ir.Operation.create(
                name, results=[result_type or operands[0].type], operands=list(operands),
                attributes=attrs)
        return operation.result

    def splat(self, value: float, like: ir.Type) -> ir.Value:
        """A constant tensor of type `like` whose every element is `value`."""
        element = ir.ShapedType(like).element_type
        if isinstance(element, ir.IntegerType):
            scalar = ir.IntegerAttr.get(element, int(value))
        else:
            scalar = ir.FloatAttr.get(element, float(value))
        return self.op("stablehlo.constant", [], like,
                       {"value": ir.DenseElementsAttr.get_splat(like, scalar)})


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
    from blade.partition.dtypes import DtypeRule

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


def fill_bodies(module, calls: Sequence[UserCall]) -> None:
    """Builds the body of each `@blade_user_N` declaration by running its converter."""
    by_name = {c.function: c for c in calls}
    with module.context:
        for op in list(module.body.operations):
            if op.operation.name != "func.func":
                continue
            name = ir.StringAttr(op.attributes["sym_name"]).value
            call = by_name.get(name)
            if call is None:
                continue
            # The converter's ops carry the node's location, so a later stage that fails
            # on one of them names the node.
            location = ir.Location.unknown() if call.node_index is None else \
                ir.Location.name(node_location(call.node_index))
            with location:
                _fill_body(op, call)


def _fill_body(op, call: UserCall) -> None:
    function_type = ir.FunctionType(op.type)
    block = op.add_entry_block()
    what = f"converter {call.converter.origin} for {schema_name(call.node)}"
    ctx = ConversionContext(call.node, block.arguments, call.arguments, function_type.results,
                            block)
    try:
        results = call.converter.lower(ctx)
    except Exception as e:
        raise ConverterError(f"{what} raised {type(e).__name__}: {e}", call.node_index) from e
    results = [results] if isinstance(results, ir.Value) else list(results)
    expected = list(function_type.results)
    got = [r.type for r in results]
    if got != expected:
        raise ConverterError(f"{what} returned values of types {[str(t) for t in got]}, "
                             f"expected {[str(t) for t in expected]}", call.node_index)
    with ir.InsertionPoint(block):
        func.ReturnOp(results)
    try:
        op.operation.verify()
    except Exception as e:
        raise ConverterError(f"{what} built IR that does not verify: {e}",
                             call.node_index) from None
