"""The bodies of user converters' calls (the pipeline's inline-user-converters pass): the
importer wrote each node that a user converter lowers (blade.register_converter,
partition/user_converters) as a call of a private `@blade_user_N` declaration; here each
body is built by running the converter, and the calls are inlined."""
from typing import Any, Dict, List, Optional, Sequence, Union

from torch_mlir import ir
from torch_mlir.dialects import func

from blade.codegen.errors import node_location
from blade.graph_queries import schema_name


class ConverterError(Exception):
    """A user converter failed or built invalid IR; the message names it and the node, and
    `node_index` is the node's index in its cluster (see codegen.errors.node_location)."""

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


def fill_bodies(module, calls: Sequence) -> None:
    """Builds the body of each `@blade_user_N` declaration by running its converter
    (`calls`: importer.UserCall)."""
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


def _fill_body(op, call) -> None:
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
