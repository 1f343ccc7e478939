"""Blade's TorchScript importer: a cluster's subgraph as a function in Torch-MLIR's
`torch` dialect.

The torch-mlir wheel has no TorchScript importer, so Blade writes the MLIR itself, from
each node's schema: `aten::add.Tensor` becomes the op `torch.aten.add.Tensor`, with the
node's operands in schema order and the materialized types as `!torch.vtensor<[4,?],f32>`
(a `?` is a dynamic dimension). Ops are written in MLIR's generic form, which every op
accepts, so no per-op printing code is needed. The text is parsed and verified by MLIR.
"""
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from blade.dtypes import ELEMENT_TYPES
from blade.codegen.errors import node_location
from blade.kernel_call_spec import SPEC_ATTRIBUTE, spec
from blade.graph_queries import constant_arguments, describe, schema_name

class ImportError_(Exception):
    """A node that the importer cannot express in the torch dialect."""


def tensor_type(t: torch._C.TensorType) -> str:
    dtype = t.scalarType()
    if dtype not in ELEMENT_TYPES:
        raise ImportError_(f"dtype {dtype} has no torch-dialect element type")
    sizes = t.symbolic_sizes()
    if sizes is None:
        raise ImportError_("a tensor of unknown rank cannot be imported")
    dims = ",".join(str(s) if s >= 0 else "?" for s in sizes)
    return f"!torch.vtensor<[{dims}],{ELEMENT_TYPES[dtype]}>"


def value_type(t) -> str:
    if isinstance(t, torch._C.TensorType):
        return tensor_type(t)
    if isinstance(t, torch._C.IntType):
        return "!torch.int"
    if isinstance(t, torch._C.FloatType):
        return "!torch.float"
    if isinstance(t, torch._C.BoolType):
        return "!torch.bool"
    if isinstance(t, torch._C.StringType):
        return "!torch.str"
    if isinstance(t, torch._C.NoneType):
        return "!torch.none"
    if isinstance(t, torch._C.DeviceObjType):
        return "!torch.Device"
    if isinstance(t, torch._C.NumberType):
        return "!torch.number"
    if isinstance(t, torch._C.ListType):
        return f"!torch.list<{_list_element(t.getElementType())}>"
    if isinstance(t, torch._C.OptionalType):
        return value_type(t.getElementType())
    raise ImportError_(f"type {t} has no torch-dialect equivalent")


def _list_element(element) -> str:
    """A list's element type as the torch dialect spells it inside `!torch.list<...>`:
    tensors without their shape (`vtensor`), `optional<vtensor>` for `Tensor?[]`."""
    if isinstance(element, torch._C.TensorType):
        return "vtensor"
    if isinstance(element, torch._C.OptionalType):
        return f"optional<{_list_element(element.getElementType())}>"
    return value_type(element)[len("!torch."):]


def _float_literal(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        # MLIR spells non-finite floats as their bit pattern.
        return "0x" + torch.tensor(x, dtype=torch.float64).view(torch.int64).item().to_bytes(
            8, "big", signed=True).hex().upper()
    # Always with a mantissa dot and an exponent (`1e-05` alone is not an MLIR float).
    return f"{float(x):.17e}"


def _string_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class UserCall:
    """One node of a cluster that a user converter lowers: the importer writes a call of
    a private function, whose body codegen/stablehlo/user_calls fills in later."""
    function: str            # the private function's name
    converter: Any  # partition.registry.Converter
    node: torch._C.Node
    arguments: Dict[str, Any]  # non-tensor arguments by schema name, as Python values
    node_index: Optional[int] = None  # the node's index in its cluster


@dataclass
class ImportedModule:
    text: str
    user_calls: List = field(default_factory=list)  # user_converters.UserCall, in order


class _Emitter:
    def __init__(self, converter_for: Optional[Callable] = None):
        self.lines: List[str] = []
        self.declarations: List[str] = []
        self.user_calls: List = []
        self.kernel_calls = 0
        self.names: Dict[torch._C.Value, str] = {}
        self.counter = 0
        self.converter_for = converter_for
        self.location = ""  # ` loc("blade_node_K")` of the node being emitted
        self.node_index: Optional[int] = None  # its K

    def fresh(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def emit(self, results: List[str], op: str, operands: List[str], operand_types: List[str],
             result_types: List[str], attrs: str = "") -> None:
        lhs = (", ".join(results) + " = ") if results else ""
        self.lines.append(
            f"    {lhs}\"{op}\"({', '.join(operands)}){attrs} : "
            f"({', '.join(operand_types)}) -> ({', '.join(result_types)}){self.location}")

    def scalar(self, name: str, t, ivalue) -> bool:
        """Emits a constant of a scalar type; False when `t` is not one."""
        if isinstance(t, torch._C.NoneType) or ivalue is None:
            self.emit([name], "torch.constant.none", [], [], ["!torch.none"])
        elif isinstance(t, torch._C.BoolType):
            self.emit([name], "torch.constant.bool", [], [], ["!torch.bool"],
                      f" {{value = {'true' if ivalue else 'false'}}}")
        elif isinstance(t, torch._C.IntType):
            self.emit([name], "torch.constant.int", [], [], ["!torch.int"],
                      f" {{value = {int(ivalue)} : i64}}")
        elif isinstance(t, torch._C.FloatType):
            self.emit([name], "torch.constant.float", [], [], ["!torch.float"],
                      f" {{value = {_float_literal(ivalue)} : f64}}")
        elif isinstance(t, torch._C.StringType):
            self.emit([name], "torch.constant.str", [], [], ["!torch.str"],
                      f" {{value = {_string_literal(ivalue)}}}")
        elif isinstance(t, torch._C.DeviceObjType):
            self.emit([name], "torch.constant.device", [], [], ["!torch.Device"],
                      f" {{value = {_string_literal(str(ivalue))}}}")
        else:
            return False
        return True

    def constant(self, value: torch._C.Value) -> None:
        t = value.type()
        ivalue = value.toIValue()
        name = self.fresh()
        self.names[value] = name
        if self.scalar(name, t, ivalue):
            return
        if isinstance(t, torch._C.ListType) and isinstance(ivalue, (list, tuple)):
            element = t.getElementType()
            items = [self.fresh() for _ in ivalue]
            for item_name, item in zip(items, ivalue):
                if item is None or not self.scalar(item_name, element, item):
                    raise ImportError_(f"constant list of {element} cannot be imported")
            self.emit([name], "torch.prim.ListConstruct", items,
                      [value_type(element)] * len(items), [value_type(t)])
            return
        raise ImportError_(f"constant of type {t} ({ivalue!r}) cannot be imported")

    def user_call(self, node: torch._C.Node, converter) -> None:
        """A call of a private function that the user's converter fills in later (see
        codegen/stablehlo/user_calls.py); only tensors are passed, other arguments are
        constants the converter reads from the node."""
        function = f"blade_user_{len(self.user_calls)}"
        self.call_of_declaration(node, function)
        self.user_calls.append(UserCall(function, converter, node, constant_arguments(node),
                                        self.node_index))

    def call_of_declaration(self, node: torch._C.Node, function: str,
                            attributes: str = "") -> None:
        """The node as a call of private function `function`, declared with the node's
        tensor operands and results (and `attributes`, MLIR attribute text)."""
        tensors = [v for v in node.inputs() if isinstance(v.type(), torch._C.TensorType)]
        operand_types = [value_type(v.type()) for v in tensors]
        result_types = [value_type(v.type()) for v in node.outputs()]
        results = [self.fresh() for _ in node.outputs()]
        self.emit(results, "func.call", [self.names[v] for v in tensors], operand_types,
                  result_types, f" {{callee = @{function}}}")
        self.declarations.append(
            f"  func.func private @{function}({', '.join(operand_types)}) -> "
            f"({', '.join(result_types)}){' attributes ' + attributes if attributes else ''}")
        for value, name in zip(node.outputs(), results):
            self.names[value] = name

    def kernel_call(self, node: torch._C.Node) -> None:
        """A call of a private declaration that carries the call of PyTorch's kernel for the
        node (blade.kernel_call_spec.spec): the code generator makes the call."""
        self.call_of_declaration(node, f"blade_kernel_{self.kernel_calls}",
                                 f"{{{SPEC_ATTRIBUTE} = {_string_literal(spec(node))}}}")
        self.kernel_calls += 1

    def factory_of_computed_size(self, node: torch._C.Node) -> None:
        """`ones/zeros/full(size, ...)` with a size computed at run time (dynamic shapes):
        Torch-MLIR lowers factories of constant sizes only, so the factory makes a tensor
        of ones in every dim and `broadcast_to` stretches it to the size."""
        size, *rest = list(node.inputs())
        rank = len(list(size.node().inputs()))
        ones = [self.fresh() for _ in range(rank)]
        for name in ones:
            self.scalar(name, torch._C.IntType.get(), 1)
        small_size = self.fresh()
        self.emit([small_size], "torch.prim.ListConstruct", ones, ["!torch.int"] * rank,
                  ["!torch.list<int>"])
        t = node.output().type()
        ones_shape = ",".join(["1"] * rank)
        small_type = f"!torch.vtensor<[{ones_shape}],{ELEMENT_TYPES[t.scalarType()]}>"
        small = self.fresh()
        self.emit([small], "torch." + schema_name(node).replace("::", "."),
                  [small_size] + [self.names[v] for v in rest],
                  ["!torch.list<int>"] + [value_type(v.type()) for v in rest], [small_type])
        result = self.fresh()
        self.emit([result], "torch.aten.broadcast_to", [small, self.names[size]],
                  [small_type, "!torch.list<int>"], [tensor_type(t)])
        self.names[node.output()] = result

    def view_sizes_from_source(self, node: torch._C.Node) -> Optional[str]:
        """For a view/reshape of dynamic size, a new size list whose dynamic entries are
        `size(source, i)` wherever the result dim has the shape symbol of source dim `i`
        (the guard keeps such dims equal): the reshape then names which of its dims pass
        through unchanged, and `shape_assumptions.lower_dynamic_reshapes` keeps them as
        they are instead of flattening the whole tensor (a copy, when the source is a
        strided slice). None when there is nothing to rebind."""
        source, size = list(node.inputs())[:2]
        if size.node().kind() != "prim::ListConstruct":
            return None
        source_dims = source.type().symbolic_sizes()
        result_dims = node.output().type().symbolic_sizes()
        elements = list(size.node().inputs())
        if source_dims is None or result_dims is None or len(elements) != len(result_dims):
            return None
        names, used, rebound = [], set(), False
        for j, symbol in enumerate(result_dims):
            matches = [i for i, s in enumerate(source_dims) if s == symbol and i not in used]
            if symbol >= 0 or not matches:
                names.append(self.names[elements[j]])
                continue
            i = j if j in matches else matches[0]
            used.add(i)
            index, name = self.fresh(), self.fresh()
            self.scalar(index, torch._C.IntType.get(), i)
            self.emit([name], "torch.aten.size.int", [self.names[source], index],
                      [value_type(source.type()), "!torch.int"], ["!torch.int"])
            names.append(name)
            rebound = True
        if not rebound:
            return None
        sizes = self.fresh()
        self.emit([sizes], "torch.prim.ListConstruct", names, ["!torch.int"] * len(names),
                  ["!torch.list<int>"])
        return sizes

    def node(self, node: torch._C.Node) -> None:
        kind = node.kind()
        if kind == "prim::Constant":
            self.constant(node.output())
            return
        converter = self.converter_for(node) if self.converter_for else None
        if converter is not None and converter.lower is not None:
            self.user_call(node, converter)
            return
        if converter is not None and converter.kernel_call:
            self.kernel_call(node)
            return
        if kind in _FACTORIES and _computed_size(node):
            self.factory_of_computed_size(node)
            return
        operands = [self.names[v] for v in node.inputs()]
        if kind in ("aten::view", "aten::reshape"):
            sizes = self.view_sizes_from_source(node)
            if sizes is not None:
                operands[1] = sizes
        operand_types = [value_type(v.type()) for v in node.inputs()]
        results = [self.fresh() for _ in node.outputs()]
        result_types = [value_type(v.type()) for v in node.outputs()]
        if kind == "prim::ListConstruct":
            op = "torch.prim.ListConstruct"
        elif kind.startswith("aten::"):
            op = "torch." + schema_name(node).replace("::", ".")
        else:
            raise ImportError_(f"{describe(node)} has no torch-dialect op")
        self.emit(results, op, operands, operand_types, result_types)
        for value, name in zip(node.outputs(), results):
            self.names[value] = name


# Factories whose first argument is the size.
_FACTORIES = ("aten::ones", "aten::zeros", "aten::full")


def _computed_size(node: torch._C.Node) -> bool:
    size = list(node.inputs())[0]
    producer = size.node()
    return producer.kind() == "prim::ListConstruct" and \
        any(v.node().kind() != "prim::Constant" for v in producer.inputs())


def import_subgraph(subgraph: torch._C.Graph, func_name: str = "main",
                    converter_for: Optional[Callable] = None,
                    params: Sequence[torch.Tensor] = (),
                    node_indices: Optional[Dict[torch._C.Node, int]] = None) -> ImportedModule:
    """The subgraph as torch-dialect MLIR text, one function `func_name` (plus a private
    declaration per node that `converter_for(node)` gives a user converter for).
    `params` are the values of the subgraph's trailing inputs (lifted constants): finite
    0-d float ones are read as literals. Each op is located at `node_location(k)`, with k
    the node's `node_indices` entry (by default its position in the subgraph).

    Example:
        >>> imported = import_subgraph(cluster_node.g("Subgraph"))
    """
    inputs = list(subgraph.inputs())
    scalar_params = {len(inputs) - len(params) + j: p for j, p in enumerate(params)
                     if p.dim() == 0 and p.dtype in (torch.float32, torch.float64) and
                     math.isfinite(p.item())}
    emitter = _Emitter(converter_for)
    args = []
    for i, value in enumerate(subgraph.inputs()):
        emitter.names[value] = f"%arg{i}"
        args.append(f"%arg{i}: {value_type(value.type())}")
        known = scalar_params.get(i)
        if known is not None:
            # The argument stays (the engine passes every param) but nothing reads it: the
            # code folds the literal (a scale traced from Python math, say).
            element = ELEMENT_TYPES[value.type().scalarType()]
            literal = emitter.fresh()
            emitter.emit([literal], "torch.vtensor.literal", [], [],
                         [f"!torch.vtensor<[],{element}>"],
                         f" {{value = dense<{_float_literal(known.item())}> : "
                         f"tensor<{element}>}}")
            emitter.names[value] = literal
    for position, node in enumerate(subgraph.nodes()):
        emitter.node_index = position if node_indices is None else node_indices[node]
        emitter.location = f' loc("{node_location(emitter.node_index)}")'
        try:
            emitter.node(node)
        except ImportError_ as e:
            raise ImportError_(f"{describe(node)}: {e}") from None
    emitter.location, emitter.node_index = "", None
    outputs = list(subgraph.outputs())
    result_types = [value_type(v.type()) for v in outputs]
    body = "\n".join(emitter.lines)
    returns = ", ".join(emitter.names[v] for v in outputs)
    declarations = "".join(d + "\n" for d in emitter.declarations)
    text = (
        "module {\n"
        f"  func.func @{func_name}({', '.join(args)}) -> ({', '.join(result_types)}) {{\n"
        f"{body}\n"
        f"    \"func.return\"({returns}) : ({', '.join(result_types)}) -> ()\n"
        "  }\n"
        f"{declarations}"
        "}\n"
    )
    return ImportedModule(text, emitter.user_calls)
