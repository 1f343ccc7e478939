"""Breadth from Torch-MLIR: an aten op that no converter of Blade's covers is compilable when
Torch-MLIR lowers it, for the node's own types and constant arguments, and the rest of
Blade's pipeline compiles what it lowers to.

The node alone is imported as a function (its tensor operands as arguments, its constant
arguments cloned) and run through the whole codegen pass pipeline (blade.codegen.pipeline:
Torch-MLIR's passes to StableHLO, then Blade's levels to the LLVM dialect; not LLVM itself);
it is compilable when every pass succeeds and Torch-MLIR left no torch-dialect op behind (an
op StableHLO has but Blade does not lower, a sort, fails a later pass). Each distinct case
(op, operand types, constant arguments, static or dynamic shapes) is asked once per process.
Blade's own converters, with their dtype rules and validators, still decide the ops they
cover. Ops that write into their operands or draw random numbers are never probed; a
lowering that Torch-MLIR gets wrong is caught by the engine check (blade.self_check) and
falls back.
"""
from typing import Dict, Optional, Tuple

import torch

from blade.dtypes import SCALAR_TYPE_NAMES
from blade.partition.node_types import type_key
from blade.importer import import_subgraph

# What the registry reports for a node the probe accepted.
ORIGIN = "torch-mlir"
# case -> None (it lowers) or why not
_ANSWERS: Dict[Tuple, Optional[str]] = {}


# Cases whose conversion crashes Torch-MLIR (a segmentation fault in
# convert-torch-to-stablehlo, which would take the process with it): op -> the dtypes of its
# first operand it crashes on. Never asked.
_CRASHES_TORCH_MLIR = {
    "aten::max_pool2d": ("Char", "Byte"),
    "aten::max_pool3d": ("Char", "Byte"),
}


def probe_refusal(node: torch._C.Node) -> Optional[str]:
    """Why `node` is not even asked (None when it may be): the probe takes aten ops with
    tensor results that neither write into their operands nor draw random numbers, and
    none that crashes Torch-MLIR."""
    if not node.kind().startswith("aten::") or node.schema() == "(no schema)":
        return "not an aten op with a schema"
    crashing = _CRASHES_TORCH_MLIR.get(node.kind(), ())
    first = next(iter(node.inputs()), None)
    if first is not None and isinstance(first.type(), torch._C.TensorType) and \
            first.type().scalarType() in crashing:
        return (f"Torch-MLIR's StableHLO conversion crashes on {node.kind()} of "
                f"{SCALAR_TYPE_NAMES[first.type().scalarType()]} tensors")
    if node.kind() == "aten::instance_norm" and _is_none(node.inputsAt(1)):
        # Its conversion without a weight aborts the process (LLVM's "SmallVector unable to
        # grow"); Blade's decomposition takes the op where it is evaluated.
        return "Torch-MLIR's StableHLO conversion aborts on aten::instance_norm without a weight"
    schema = torch._C.parse_schema(node.schema())
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "it writes into an operand"
    if node.isNondeterministic():
        return "it draws random numbers"
    if not all(isinstance(v.type(), torch._C.TensorType) for v in node.outputs()):
        return "it has a result that is not a tensor"
    return None


def _is_none(value: torch._C.Value) -> bool:
    return value.node().kind() == "prim::Constant" and value.toIValue() is None


def lowering_refusal(node: torch._C.Node, static_shapes: bool = True) -> Optional[str]:
    """None when Torch-MLIR lowers `node` to StableHLO for its types and constant
    arguments, else why not (one line)."""
    why = probe_refusal(node)
    if why is not None:
        return why
    key = _case(node, static_shapes)
    if key is None:
        return "an argument is neither a tensor nor a constant"
    if key not in _ANSWERS:
        _ANSWERS[key] = _lower_alone(node)
    return _ANSWERS[key]


def _case(node: torch._C.Node, static_shapes: bool) -> Optional[Tuple]:
    parts = [node.schema(), static_shapes]
    for value in node.inputs():
        producer = value.node()
        if isinstance(value.type(), torch._C.TensorType):
            parts.append(type_key(value))
        elif producer.kind() == "prim::Constant":
            parts.append((str(value.type()), repr(value.toIValue())))
        elif producer.kind() == "prim::ListConstruct":
            items = []
            for item in producer.inputs():
                if isinstance(item.type(), torch._C.TensorType):
                    items.append(type_key(item))
                elif item.node().kind() == "prim::Constant":
                    items.append(repr(item.toIValue()))
                else:
                    return None
            parts.append((str(value.type()), tuple(items)))
        else:
            return None
    parts.extend(type_key(v) for v in node.outputs())
    return tuple(parts)


def _lower_alone(node: torch._C.Node) -> Optional[str]:

    graph = torch._C.Graph()
    mapping = {}

    def copied(value):
        """The graph's own copy of `value`: an input for a tensor, else its constant."""
        if value not in mapping:
            if isinstance(value.type(), torch._C.TensorType):
                mapping[value] = graph.addInput()
                mapping[value].setType(value.type())
            else:
                constant = graph.createClone(value.node(), lambda x: x)
                mapping[value] = graph.insertNode(constant).output()
        return mapping[value]

    for value in node.inputs():
        producer = value.node()
        if producer.kind() == "prim::ListConstruct" and value not in mapping:
            items = {item: copied(item) for item in producer.inputs()}
            mapping[value] = graph.insertNode(
                graph.createClone(producer, items.__getitem__)).output()
        else:
            copied(value)
    clone = graph.insertNode(graph.createClone(node, mapping.__getitem__))
    for original, copy in zip(node.outputs(), clone.outputs()):
        copy.setType(original.type())
        graph.registerOutput(copy)
    try:
        text = import_subgraph(graph).text
    except Exception as e:  # an argument or type the importer cannot write
        return f"Blade's importer cannot write it: {str(e).splitlines()[0]}"
    # As the compiler calls the pipeline (compiler._start_engine): outputs of dynamic size
    # are returned, not written into buffers passed in.
    returns_outputs = any(s < 0 for v in node.outputs() for s in v.type().symbolic_sizes())
    buffers = len(list(graph.inputs())) + (0 if returns_outputs else len(list(node.outputs())))
    return _compiles(text, buffers, returns_outputs)


def _compiles(text: str, num_buffers: int, returns_outputs: bool) -> Optional[str]:
    # MLIR loads only when an op is probed (a cached model never loads it).
    from torch_mlir import ir
    # MLIR loads only when an op is probed (a cached model never loads it).
    from torch_mlir._mlir_libs._torchMlir import register_dialect as register_torch_dialect

    # The code generator loads MLIR: only when an op is probed.
    from blade.codegen import driver, pipeline

    driver.register_passes()
    context = ir.Context()
    register_torch_dialect(context)
    options = pipeline.Options(num_buffers, returns_outputs=returns_outputs)
    steps = pipeline.build(options)
    to_stablehlo = len(pipeline.torch_to_stablehlo())
    with context:
        try:
            module = ir.Module.parse(text)
            compilation = pipeline.Compilation(module, options)
            pipeline.run(compilation, steps[:to_stablehlo])
        except Exception as e:
            return f"Torch-MLIR does not lower it to StableHLO ({_summary(e)})"
        left = _torch_ops(module.operation)
        if left:
            return f"Torch-MLIR does not lower it to StableHLO (it leaves {left[0]})"
        try:
            pipeline.run(compilation, steps[to_stablehlo:])
        except Exception as e:
            return f"Blade does not compile what Torch-MLIR lowers it to ({_summary(e)})"
    return None


def _summary(error: Exception) -> str:
    return (getattr(error, "summary", None) or str(error).splitlines()[0])[:200]


def _torch_ops(operation):
    found = []
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                name = op.operation.name
                if name.startswith("torch.") or name.startswith("torch_c."):
                    found.append(name)
                found.extend(_torch_ops(op.operation))
    return found
