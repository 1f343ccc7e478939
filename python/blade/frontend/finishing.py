"""The passes after the engines are in: ops left outside engines accounted for, the input
guard and the unspecialized graph behind it, weights read from the engines that hold them,
attributes nothing reads removed (blade.frontend.pipeline lists them in order)."""
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.config import Config
from blade.dtypes import SCALAR_TYPE_NAMES, dtype_name
from blade.engines import WRITE_BACK, specs
from blade.graph_queries import (all_nodes, argument_name, attribute_path, is_tensor_op, ran,
                                 schema_name)
from blade.partition.clustering import is_edge_view, returned_input_views
from blade.report import GUARD_ATTRIBUTE, Report

# If-branches of more nodes than this become functions (csrc/passes/outline_branches.h).
OUTLINED_BRANCH_MIN_NODES = 1


def account_for_ops_outside_engines(graph, report: Report) -> None:
    """Every op that ran outside an engine must have a reason in the report. The stages
    above record one wherever they leave an op out; an op they missed (a bug) is listed
    here rather than silently lowering the coverage."""
    outside: Dict[str, int] = {}
    input_views = set(returned_input_views(graph))  # not counted (Report.input_views)
    for node in all_nodes(graph):
        if is_edge_view(node) or node in input_views:
            continue  # counted with its engine, or not an engine's op
        if node.kind() == WRITE_BACK:
            # Not counted with the ops before clustering: the engine may do it (see
            # _compile_in_rounds).
            report.total_ops += 1
            report.add_unsupported(WRITE_BACK, _write_back_reason(node))
            continue
        if is_tensor_op(node) and ran(node):
            outside[schema_name(node)] = outside.get(schema_name(node), 0) + 1
    for op, count in outside.items():
        entry = report.unsupported.get(op)
        for _ in range(count - (entry.count if entry else 0)):
            report.add_unsupported(op, "left outside every engine, and Blade recorded no "
                                   "reason (please report this)")


def _write_back_reason(node) -> str:
    target = node.inputsAt(0)
    producer = node.inputsAt(1).node()
    what = (f"the write of an in-place op's result into %{argument_name(target)}, a tensor the "
            "caller passed or a module attribute")
    if producer.kind() != "prim::ListUnpack" or \
            producer.input().node().kind() not in ("blade::execute", "blade::execute_writing"):
        return (f"{what}: no engine computes its value (TorchScript does, or it is another "
                "tensor copied as it is), so the write stays TorchScript")
    return (f"{what}: the engine that computes its value could not do it (another read or "
            "write of that tensor comes between them, or the value's shape or dtype is not "
            "one the tensor holds)")


def guard(module, graph, unspecialized, none_inputs: Sequence[int], config: Config,
           report: Report, written: Sequence[int]) -> None:
    """The optimized graph runs under a guard of its inputs (csrc/ral/guard.h): tensor
    inputs as typed, optional ones specialized to None (`none_inputs`, graph positions)
    must be None; other inputs run `unspecialized`, the graph from before the example
    inputs were used. An input of a dtype the guard cannot name (complex64, uint16,
    float8_e4m3fn, ...) is checked through a stand-in (see `_dtype_stand_in`). Inputs the
    graph writes into (`written`, graph positions) must share memory with no other input
    (csrc/ral/guard.h)."""
    inputs = list(graph.inputs())
    tensors = [i for i, v in enumerate(inputs)
               if i > 0 and isinstance(v.type(), torch._C.TensorType)]
    complete = [i for i in tensors if inputs[i].type().scalarType() is not None and
                inputs[i].type().symbolic_sizes() is not None]
    unnamed = {i: inputs[i].type().dtype() for i in complete
               if inputs[i].type().scalarType() not in SCALAR_TYPE_NAMES}
    guarded_specs = dict(zip(complete, specs([inputs[i] for i in complete],
                                             unnamed_dtype="bool")[0]))
    guarded = sorted(tensors + list(none_inputs))
    report.guard_inputs = [argument_name(inputs[i]) for i in guarded]
    text = ";".join("None" if i in none_inputs else
                    ("!" if i in written else "") + guarded_specs.get(i, "*") for i in guarded)
    guard = torch.classes.blade.Guard(text, config.fallback)
    module._c._register_attribute(GUARD_ATTRIBUTE, guard._type(), guard)
    _C.guard_specialization(graph, unspecialized, GUARD_ATTRIBUTE, guarded)
    if unnamed:
        _check_dtypes_through_stand_ins(
            graph, {guarded.index(i): dtype for i, dtype in unnamed.items()})
        for i, dtype in unnamed.items():
            report.guard_notes.append(
                f"input {guarded.index(i)} ({dtype_name(dtype)}): the guard checks its shape "
                f"as {guarded_specs[i]}, and TorchScript its dtype; another dtype there shows "
                "as 'the tensor is undefined'")


def _dtype_stand_in(x: torch.Tensor, dtype: int) -> Optional[torch.Tensor]:
    """What the guard checks for an input of a dtype it cannot name: None when `x` has
    another dtype than `dtype` (the guard refuses it), else a bool tensor of x's shape
    and device (one element, expanded), which the guard checks against `bool[...]`."""
    if x.dtype != dtype:
        return None
    return torch.empty([1] * x.dim(), dtype=torch.bool, device=x.device).expand(x.shape)


@functools.lru_cache(maxsize=None)
def _scripted_dtype_stand_in():
    # Scripted on first use inside optimize (under quiet_torchscript), not at import: under
    # -W error::DeprecationWarning, scripting at import would make `import blade.compiler`
    # fail.
    return torch.jit.script(_dtype_stand_in)


def _check_dtypes_through_stand_ins(graph, dtypes: Dict[int, torch.dtype]) -> None:
    """Replaces the guard's inputs at the positions (in the guard's list) of `dtypes` by
    their `_dtype_stand_in` for that dtype, inlined just before the list."""
    admits = next(n for n in graph.nodes() if n.kind() == "blade::guard_admits")
    listed = admits.inputsAt(1).node()
    for position, dtype in dtypes.items():
        value = listed.inputsAt(position)
        with graph.insert_point_guard(listed):
            stand_in, = graph.insertGraph(_scripted_dtype_stand_in().graph,
                                          [value, graph.insertConstant(dtype)])
        listed.replaceInput(position, stand_in)


def read_weights_from_engines(module, graph, report: Report) -> None:
    """A weight the graph holds as a constant (the unspecialized model's, above all) that is
    an engine's param, or a view of one (freezing folds MultiheadAttention's q/k/v chunks of
    its packed weight into views), is read from the engine instead: `self.<engine>.param(i)`,
    or a view of it. `torch.jit.save` writes graph constants and engine state to separate
    tables, so each such weight was stored, and loaded, twice."""
    owners: Dict[int, Tuple[str, int, torch.Tensor]] = {}  # storage address -> param
    engines = {}
    for cluster in report.clusters:
        if cluster.compiled:
            engine = getattr(module, cluster.name)
            engines[cluster.name] = engine
            for index, param in enumerate(engine.params()):
                # (a 0-dim param comes back to Python as a number: nothing to share there)
                if isinstance(param, torch.Tensor) and param.storage_offset() == 0 and \
                        param.numel() > 0:
                    owners.setdefault(param.untyped_storage().data_ptr(),
                                      (cluster.name, index, param))
    self_value = next(iter(graph.inputs()))
    for node in all_nodes(graph) if owners else []:
        if node.kind() != "prim::Constant" or \
                not isinstance(node.output().type(), torch._C.TensorType):
            continue
        weight = node.t("value")
        if weight.numel() == 0 or weight.untyped_storage().data_ptr() not in owners:
            continue
        name, index, param = owners[weight.untyped_storage().data_ptr()]
        if weight.dtype != param.dtype:
            continue
        # Read where it is used (not where TorchScript hoisted the constant): a weight that
        # only a rarely taken branch reads (TransformerEncoderLayer's slow path) is then not
        # read on every call, and an engine that gave back its plain memory keeps it so
        # (csrc/ral/prepared_weights.h).
        for use in list(node.output().uses()):
            with graph.insert_point_guard(use.user):
                engine = graph.insertNode(graph.create("prim::GetAttr", [self_value], 1))
                engine.s_("name", name)
                engine.output().setType(engines[name]._type())
                call = graph.insertNode(graph.create(
                    "prim::CallMethod", [engine.output(), graph.insertConstant(index)], 1))
                call.s_("name", "param")
                read = call.output().setType(node.output().type())
                if (weight.shape, weight.stride(), weight.storage_offset()) != \
                        (param.shape, param.stride(), 0):
                    view = [list(weight.shape), list(weight.stride()), weight.storage_offset()]
                    read = graph.insert("aten::as_strided",
                                        [read] + [graph.insertConstant(v) for v in view])
                    read.setType(node.output().type())
            use.user.replaceInput(use.offset, read)
        node.destroy()


def remove_unread_attributes(module, graph, preserved: Sequence[str] = ()) -> int:
    """Parameters and buffers of submodules that no method of the optimized module reads
    are removed from it, as freezing removes what no method reads. Freezing keeps one
    that a list or tuple holds (nn.MultiheadAttention's `in_proj_weight`, for its fast path
    checks); `fold_tensor_attributes` then made it a constant, and an engine holds it as a
    param: left in the module too, it would be a second holder of the engine's weight
    (which then cannot give its plain memory back: csrc/ral/prepared_weights.h). `graph` is
    forward's (final) graph; the methods freezing kept (Config.preserved_attributes) are
    read too. A submodule a method uses other than through GetAttr chains keeps its own,
    and so does what `preserved` (dotted paths) names, with everything under it. Returns
    how many were removed."""
    kept = {tuple(name.split(".")) for name in preserved}
    instances: Dict[str, List[Tuple[Tuple[str, ...], Any]]] = {}
    methods = [((), graph)] + [((), module._c._get_method(name).graph)
                               for name in module._c._method_names() if name != "forward"]
    pending = [((), module._c)]
    while pending:  # (the Python wrapper of a frozen module lists no submodules)
        path, obj = pending.pop()
        for name, sub in torch._C.ModuleDict(obj).items():
            sub_path = path + (name,)
            instances.setdefault(str(sub._type()), []).append((sub_path, sub))
            pending.append((sub_path, sub))
            methods += [(sub_path, sub._get_method(m).graph) for m in sub._method_names()]
    read, escaped = set(), set()
    for owner, method_graph in methods:
        self_value = next(iter(method_graph.inputs()))
        for node in all_nodes(method_graph):
            if node.kind() != "prim::GetAttr":
                continue
            path = attribute_path(node, self_value)
            if path is None:
                return 0  # an attribute of something not reached from self: keep everything
            read.add(owner + path)
            if isinstance(node.output().type(), torch._C.ClassType) and \
                    any(use.user.kind() != "prim::GetAttr" for use in node.output().uses()):
                escaped.add(owner + path)
    removed = 0
    for modules in instances.values():
        paths = [path for path, _ in modules]
        if any(path[:k] in escaped or path[:k] in kept
               for path in paths for k in range(1, len(path) + 1)):
            continue
        first = modules[0][1]
        names = [n for n, _ in torch._C.ParameterDict(first).items()] + \
            [n for n, _ in torch._C.BufferDict(first).items()]
        for name in names:
            if all(path + (name,) not in read and path + (name,) not in kept
                   for path in paths) and \
                    _C.remove_attribute([sub for _, sub in modules], name):
                removed += 1
    return removed


def none_inputs(graph, inputs: Tuple) -> List[int]:
    """Graph positions of the optional tensor inputs that are None in the example."""
    found = []
    for position, (value, example) in enumerate(zip(list(graph.inputs())[1:], inputs), 1):
        t = value.type()
        if example is None and isinstance(t, torch._C.OptionalType) and \
                isinstance(t.getElementType(), torch._C.TensorType):
            found.append(position)
    return found
