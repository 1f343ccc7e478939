"""Questions every level asks of a TorchScript graph: walks of its nodes, which op a node
calls, whether it computes tensors, ran in the example run, or may be written, and the
user's names for inputs and attributes; and `insert_op`, the one way passes add an op. A
leaf: it imports nothing of Blade's."""
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

# The node kinds that TorchScript gives blocks: control flow, closures, autodiff's GradOf.
_KINDS_WITH_BLOCKS = frozenset(("prim::If", "prim::Loop", "prim::Closure", "prim::GradOf"))


def all_nodes(block) -> List[torch._C.Node]:
    """The nodes of `block` and of the blocks inside them, in order. Only the kinds that
    have blocks are asked for them: iterating a node's blocks costs time even when there
    are none, on every node of a large graph."""
    nodes = []
    for node in block.nodes():
        nodes.append(node)
        if node.kind() in _KINDS_WITH_BLOCKS:
            for sub in node.blocks():
                nodes.extend(all_nodes(sub))
    return nodes


def nodes_of(graph: torch._C.Graph, overloads: Iterable[str]) -> List[torch._C.Node]:
    """The nodes of `graph` (its blocks' too) whose kind is that of one of `overloads`
    ("aten::sum.dim_IntList" is of kind "aten::sum"), kind by kind, found by TorchScript's
    own walk, far faster than all_nodes for a pass that rewrites a few kinds."""
    kinds = sorted({overload.split(".")[0] for overload in overloads})
    return [node for kind in kinds for node in graph.findAllNodes(kind, True)]

def schema_name(node: torch._C.Node) -> str:
    """`aten::add.Tensor` for a node calling that overload; the kind for prim nodes."""
    schema = node.schema()
    if schema == "(no schema)":
        return node.kind()
    return schema.split("(", 1)[0]

def describe(node: torch._C.Node) -> str:
    """The node's kind and, when known, where it comes from in the user's source."""
    location = node.sourceRange().strip().splitlines()[0] if node.sourceRange() else ""
    return f"{node.kind()}" + (f" ({location})" if location else "")

def argument_name(value: torch._C.Value) -> str:
    """forward's name of a graph input (TorchScript numbers its values: `mask.1`)."""
    return re.sub(r"\.\d+$", "", value.debugName())

def ran(node: torch._C.Node) -> bool:
    """Whether the example run executed `node`: some tensor it returned was recorded (an
    op that ran may still leave a result without a type: an unused optional result that
    it returns undefined, like the attention weights of
    `aten::_native_multi_head_attention` with need_weights=False)."""
    return any(isinstance(v.type(), torch._C.TensorType) and v.type().scalarType() is not None
               for v in node.outputs())

def is_tensor_op(node: torch._C.Node) -> bool:
    """An op that computes or views tensors: what coverage counts."""
    if node.kind().startswith("prim::"):
        return False
    return any(isinstance(v.type(), torch._C.TensorType) for v in node.outputs())

def may_be_written(value: torch._C.Value, also_reading: Sequence[str] = ()) -> bool:
    """Whether some node may write to `value`: an op whose schema marks the argument as
    written, or one that writes a view of it or a container holding it (followed through
    every op whose schema says its result may alias the argument). A node without a
    schema counts as a writer, except list/tuple plumbing, the reads below and the kinds
    `also_reading`."""
    for use in value.uses():
        node = use.user
        if node.kind() in _CONTAINER_PLUMBING:
            if any(may_be_written(output, also_reading) for output in node.outputs()):
                return True
            continue
        if node.kind() in _READS_WITHOUT_SCHEMA or node.kind() in also_reading:
            continue
        schema = node.schema()
        if schema == "(no schema)":
            return True
        arguments = torch._C.parse_schema(schema).arguments
        if not arguments:
            return True
        alias = arguments[min(use.offset, len(arguments) - 1)].alias_info
        if alias is not None and (alias.is_write or any(may_be_written(output, also_reading)
                                                        for output in node.outputs())):
            return True
    return False

_CONTAINER_PLUMBING = ("prim::ListConstruct", "prim::TupleConstruct", "prim::TupleUnpack",
                       "prim::ListUnpack", "prim::TupleIndex", "prim::unchecked_cast")

_READS_WITHOUT_SCHEMA = ("prim::device", "prim::dtype", "prim::requires_grad", "prim::is_cuda",
                         "prim::layout", "prim::shape", "prim::is_nested", "prim::isinstance",
                         "aten::__isnot__", "aten::__is__")

def attribute_path(node: torch._C.Node, self_value) -> Optional[Tuple[str, ...]]:
    """The attribute names from the module (`self`) to what a GetAttr/SetAttr node names,
    outermost first; None when its owner is not reached through GetAttrs from `self`."""
    path, owner = [node.s("name")], next(iter(node.inputs()))
    while owner != self_value and owner.node().kind() == "prim::GetAttr":
        path.append(owner.node().s("name"))
        owner = owner.node().input()
    return tuple(reversed(path)) if owner == self_value else None


def constant_arguments(node: torch._C.Node) -> Dict[str, Any]:
    """The node's non-tensor arguments by schema name, as Python values (lists built by a
    prim::ListConstruct of constants included; a size computed at run time is None)."""
    values = {}
    for arg, value in zip(argument_names(node), node.inputs()):
        if isinstance(value.type(), torch._C.TensorType):
            continue
        producer = value.node()
        values[arg] = [v.toIValue() for v in producer.inputs()] \
            if producer.kind() == "prim::ListConstruct" else value.toIValue()
    return values


def argument_names(node: torch._C.Node) -> List[str]:
    schema = node.schema()
    if schema == "(no schema)":
        return [f"input{i}" for i in range(len(list(node.inputs())))]
    return [a.name for a in torch._C.parse_schema(schema).arguments]


def insert_op(graph: torch._C.Graph, kind: str, *operands) -> torch._C.Value:
    """`kind` called on `operands` (Python values become constants), at the insert point."""
    return graph.insert(kind, [v if isinstance(v, torch._C.Value) else graph.insertConstant(v)
                               for v in operands])
