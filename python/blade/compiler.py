"""The compiler driver: `blade.optimize`.

    script/trace -> freeze -> simplify + materialize types -> registry verdicts
    -> acyclic clustering (C++) -> per cluster: import -> StableHLO -> native -> Engine
"""
import contextlib
import dataclasses
import difflib
import functools
import inspect
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.partition import converters  # noqa: F401  (importing it registers the built-ins)
from blade.frontend import exported_program
from blade.codegen.llvm import native
from blade.codegen.cache import CodeCache
from blade.config import Config
from blade.partition.dtypes import dtype_name
from blade.tools.dump import Dumper, Progress
from blade.frontend.exported_program import is_exported_program
from blade.codegen.llvm.native import CompilerPool, default_workers
from blade._runtime import RUNTIME_LIBRARY
from blade.quiet import quiet_torchscript
from blade.partition.registry import (REGISTRY, SCALAR_TYPE_NAMES, Verdict, argument_name,
                                      describe, ran, schema_name)
from blade.report import GUARD_ATTRIBUTE, REPORT_ATTRIBUTE, ClusterReport, Report

ENGINE_PREFIX = "blade_engine_"
# If-branches of more nodes than this become functions (csrc/passes/outline_branches.h).
OUTLINED_BRANCH_MIN_NODES = 1


def _split_example_inputs(example_inputs, example_kwarg_inputs) -> Tuple[Tuple, Dict]:
    """The example inputs as (positional, keyword): a tensor, a tuple or list of inputs, or
    a dict of forward's arguments by name, plus `example_kwarg_inputs`."""
    kwargs = dict(example_kwarg_inputs or {})
    if example_kwarg_inputs is not None and not isinstance(example_kwarg_inputs, dict):
        raise TypeError("blade.optimize: example_kwarg_inputs must be a dict of forward's "
                        f"arguments by name, got {type(example_kwarg_inputs).__name__}")
    if isinstance(example_inputs, dict):
        if kwargs:
            raise TypeError("blade.optimize: give the keyword inputs either as a dict of "
                            "example_inputs or as example_kwarg_inputs, not both")
        return (), dict(example_inputs)
    if example_inputs is None:
        return (), kwargs
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), kwargs
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs), kwargs
    raise TypeError("blade.optimize: example_inputs must be a tensor, a tuple of the "
                    "model's inputs or a dict of them by argument name, got "
                    f"{type(example_inputs).__name__}")


def private_copy(value):
    """`value` with every tensor in it, inside tuples, lists and dicts too, replaced by a
    copy of its own (same values and requires_grad; a dense tensor keeps its strides):
    what `optimize` runs the model on, so that a model writing into its inputs
    (`x.add_(1)`) leaves the caller's example inputs as they were.

    Example:
        >>> xs = private_copy((x, {"mask": mask}))
    """
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_() if value.requires_grad else copy
    if isinstance(value, tuple):
        items = [private_copy(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [private_copy(item) for item in value]
    if isinstance(value, dict):
        return {key: private_copy(item) for key, item in value.items()}
    return value


@contextlib.contextmanager
def preserved_random_state():
    """Running the model draws from the global random generators (`torch.rand_like` in
    forward, Python's `random` in a traced forward); `optimize` gives them back as it found
    them on every exit, so `torch.manual_seed(0); blade.optimize(...); torch.rand(3)` draws
    what it draws without `optimize`. numpy's generator is kept when numpy is loaded."""
    torch_state = torch.random.get_rng_state()
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


def _signature_text(arguments) -> str:
    return ", ".join(a.name + (f"={a.default_value!r}" if a.has_default_value() else "")
                     for a in arguments)


def _bind_inputs(scripted: torch.jit.ScriptModule, args: Tuple, kwargs: Dict) -> Tuple:
    """The example inputs in the order of forward's arguments, keyword inputs placed by
    name and arguments not given completed with their default values (the types of the
    graph are materialized from a run with exactly these)."""
    arguments = scripted.forward.schema.arguments[1:]  # the module itself first
    names = [a.name for a in arguments]
    signature = f"forward({_signature_text(arguments)})"
    if len(args) > len(arguments):
        raise TypeError(f"blade.optimize: {signature} takes {len(arguments)} inputs, "
                        f"{len(args)} example inputs were given")
    for name in kwargs:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise TypeError(f"blade.optimize: {signature} has no argument '{name}'{hint}")
        if names.index(name) < len(args):
            raise TypeError(f"blade.optimize: forward's argument '{name}' was given twice, "
                            "as a positional and as a keyword example input")
    completed = list(args)
    for arg in arguments[len(args):]:
        if arg.name in kwargs:
            completed.append(kwargs[arg.name])
        elif arg.has_default_value():
            completed.append(arg.default_value)
        else:
            raise TypeError(f"blade.optimize: no example input for forward's argument "
                            f"'{arg.name}' of {signature}, which has no default value")
    return tuple(completed)


def _dynamic_dims_by_position(scripted: torch.jit.ScriptModule, config: Config) -> Config:
    """Config.dynamic_dims with the inputs it names by forward's argument names replaced by
    their positions."""
    if not config.dynamic_dims or all(isinstance(k, int) for k in config.dynamic_dims):
        return config
    arguments = scripted.forward.schema.arguments[1:]
    names = [a.name for a in arguments]
    by_position = {}
    for key, dims in config.dynamic_dims.items():
        if isinstance(key, str) and key not in names:
            raise ValueError(f"Config.dynamic_dims names '{key}', which is not an argument of "
                             f"forward({_signature_text(arguments)})")
        by_position[names.index(key) if isinstance(key, str) else key] = list(dims)
    return dataclasses.replace(config, dynamic_dims=by_position)


def _keyword_trace_inputs(model: torch.nn.Module, args: Tuple, kwargs: Dict) -> Dict:
    """Positional and keyword example inputs as one dict by forward's parameter names, in
    forward's order, for `torch.jit.trace(example_kwarg_inputs=...)`; arguments left at
    None are left out (tracing takes tensors only), so forward's default applies."""
    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"blade.optimize: the example inputs do not fit "
                        f"{type(model).__name__}.forward: {e}") from None
    parameters = signature.parameters
    variadic = [name for name in bound.arguments
                if parameters[name].kind in (inspect.Parameter.VAR_POSITIONAL,
                                             inspect.Parameter.VAR_KEYWORD)]
    if variadic:
        raise TypeError(f"blade.optimize: tracing with keyword example inputs needs named "
                        f"parameters; {type(model).__name__}.forward takes "
                        f"'{variadic[0]}' as *args/**kwargs")
    return {name: value for name, value in bound.arguments.items() if value is not None}


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def _each_method_parsed_once():
    """While `torch.jit.script` runs, each method's source is parsed once. Scripting parses
    the methods of every module instance again (torch.jit._recursive.make_stub, called
    for every submodule even when its class is compiled already): 152 parses for 12
    encoder layers, 190 for a ResNet-50, about a third of scripting's time. The parse of
    a function under one name and `self` type is the same for every instance, so one
    serves all, for the length of this block only (an edited source is parsed again on
    the next optimize)."""
    recursive = torch.jit._recursive
    parse = getattr(recursive, "get_jit_def", None)
    if parse is None:  # another torch: scripting as it is
        yield
        return
    parsed = {}

    def get_jit_def(fn, def_name, self_name=None, is_classmethod=False):
        key = (getattr(fn, "__func__", fn), def_name, self_name, is_classmethod)
        if key not in parsed:
            parsed[key] = parse(fn, def_name, self_name=self_name,
                                is_classmethod=is_classmethod)
        return parsed[key]

    recursive.get_jit_def = get_jit_def
    try:
        yield
    finally:
        recursive.get_jit_def = parse


def _to_torchscript(model, args: Tuple, kwargs: Dict,
                    config: Config) -> torch.jit.ScriptModule:
    if isinstance(model, torch.jit.ScriptModule):
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError("blade.optimize: model must be a torch.nn.Module or a "
                        f"torch.jit.ScriptModule, got {type(model).__name__}")
    with _eval_mode(model):
        if config.allow_tracing and kwargs:
            return torch.jit.trace(
                model, example_kwarg_inputs=private_copy(_keyword_trace_inputs(model, args,
                                                                                kwargs)),
                check_trace=False)
        if config.allow_tracing:
            return torch.jit.trace(model, private_copy(args), check_trace=False)
        try:
            return torch.jit.script(model)
        except Exception as e:
            raise RuntimeError(
                f"blade.optimize: TorchScript could not script {type(model).__name__}: {e}\n"
                "Make the model scriptable, or pass Config(allow_tracing=True) to trace it "
                "with the example inputs instead.") from e


# The node kinds that TorchScript gives blocks: control flow, closures, autodiff's GradOf.
_KINDS_WITH_BLOCKS = frozenset(("prim::If", "prim::Loop", "prim::Closure", "prim::GradOf"))


def _all_nodes(block) -> List[torch._C.Node]:
    """The nodes of `block` and of the blocks inside them, in order. Only the kinds that
    have blocks are asked for them: iterating a node's blocks costs 7 us even when there
    are none (a frozen BERT-base encoder walked this way six times: 0.2 s -> 0.1)."""
    nodes = []
    for node in block.nodes():
        nodes.append(node)
        if node.kind() in _KINDS_WITH_BLOCKS:
            for sub in node.blocks():
                nodes.extend(_all_nodes(sub))
    return nodes


def is_tensor_op(node: torch._C.Node) -> bool:
    """An op that computes or views tensors: what coverage counts."""
    if node.kind().startswith("prim::"):
        return False
    return any(isinstance(v.type(), torch._C.TensorType) for v in node.outputs())


def _writes(value: torch._C.Value) -> bool:
    """Whether some node may write to `value`: an op whose schema marks the argument as
    written, or one that writes a view of it or a container holding it (followed through
    every op whose schema says its result may alias the argument). A node without a
    schema counts as a writer, except list/tuple plumbing and the reads below."""
    for use in value.uses():
        node = use.user
        if node.kind() in _CONTAINER_PLUMBING:
            if any(_writes(output) for output in node.outputs()):
                return True
            continue
        if node.kind() in _READS_WITHOUT_SCHEMA:
            continue
        schema = node.schema()
        if schema == "(no schema)":
            return True
        arguments = torch._C.parse_schema(schema).arguments
        if not arguments:
            return True
        alias = arguments[min(use.offset, len(arguments) - 1)].alias_info
        if alias is not None and (alias.is_write or
                                  any(_writes(output) for output in node.outputs())):
            return True
    return False


_CONTAINER_PLUMBING = ("prim::ListConstruct", "prim::TupleConstruct", "prim::TupleUnpack",
                       "prim::ListUnpack", "prim::TupleIndex", "prim::unchecked_cast")
_READS_WITHOUT_SCHEMA = ("prim::device", "prim::dtype", "prim::requires_grad", "prim::is_cuda",
                         "prim::layout", "prim::shape", "prim::is_nested", "prim::isinstance",
                         "aten::__isnot__", "aten::__is__")


def _attribute_path(node: torch._C.Node, self_value) -> Optional[Tuple[str, ...]]:
    """The attribute names from the module (`self`) to what a GetAttr/SetAttr node names,
    outermost first; None when its owner is not reached through GetAttrs from `self`."""
    path, owner = [node.s("name")], next(iter(node.inputs()))
    while owner != self_value and owner.node().kind() == "prim::GetAttr":
        path.append(owner.node().s("name"))
        owner = owner.node().input()
    return tuple(reversed(path)) if owner == self_value else None


def fold_tensor_attributes(graph: torch._C.Graph, module: torch.jit.ScriptModule) -> int:
    """Module tensors that freezing left as `prim::GetAttr` (it keeps an attribute that is
    put in a list or tuple, as nn.MultiheadAttention's `in_proj_weight` is for its fast path
    checks) become constants when nothing in the graph writes to them through any of its
    reads, nor assigns it: engines then get them as params, prepared once (packed
    weights), instead of as inputs on every call. Returns how many were folded."""
    self_value = next(iter(graph.inputs()))
    reads, written = [], set()
    for node in _all_nodes(graph):
        if node.kind() == "prim::SetAttr":
            written.add(_attribute_path(node, self_value))
        elif node.kind() == "prim::GetAttr" and \
                isinstance(node.output().type(), torch._C.TensorType):
            path = _attribute_path(node, self_value)
            reads.append((node, path))
            if _writes(node.output()):
                written.add(path)
    folded = 0
    for node, path in reads:
        if path is None or path in written:
            continue
        obj = module._c
        for name in path:
            obj = obj.getattr(name)
        if not isinstance(obj, torch.Tensor):
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(obj.detach())
        node.output().replaceAllUsesWith(constant)
        folded += 1
    return folded


def simplify(graph: torch._C.Graph, module: torch.jit.ScriptModule, inputs: Tuple,
             excluded_ops=(), dump: Optional[Dumper] = None,
             resized_inputs: Sequence[Tuple] = (), dynamic: bool = False,
             none_inputs: Sequence[int] = ()) -> Tuple[Dict[str, int], torch._C.Graph]:
    """Cleans the frozen graph, applies the decompositions and materializes its types from
    the example inputs (and `resized_inputs`: dims that differ there become dynamic).
    Optional tensor inputs at `none_inputs` (graph positions) are taken to be None.
    Returns how many nodes of each op were decomposed, and a copy of the graph from before
    the decompositions and the example inputs were used (the model for any input). `dump` gets the graph
    after every pass that changed it."""
    from blade.frontend.decompositions import decompose

    dump = dump or Dumper(None)
    dump.graph("frozen", graph, always=True)

    def run(name, fn):
        result = fn()
        dump.graph(name, graph)
        return result

    def to_fixed_point(passes):
        for _ in range(8):
            before = str(graph)
            for name, fn in passes:
                run(name, fn)
            if str(graph) == before:
                break

    run("inline", lambda: torch._C._jit_pass_inline(graph))
    run("remove_dropout", lambda: torch._C._jit_pass_remove_dropout(module._c))
    run("fold_tensor_attributes", lambda: fold_tensor_attributes(graph, module))
    run("constant_propagation", lambda: torch._C._jit_pass_constant_propagation(graph))
    # The model for any input is taken before Blade's decompositions, which are written for
    # the compiler, not for every input eager takes (SDPA's amax over zero keys raises).
    unspecialized = graph.copy()
    decomposed = run("decompose", lambda: decompose(graph, excluded_ops, dynamic))
    # Python structure that needs no shapes: in-place ops on fresh values, writes through
    # views, dicts and appended lists, list idioms, loops with constant trip counts.
    structure = [
        ("constant_propagation", lambda: torch._C._jit_pass_constant_propagation(graph)),
        ("remove_mutation", lambda: torch._C._jit_pass_remove_mutation(graph)),
        ("functionalize_view_writes", lambda: _C.functionalize_view_writes(graph)),
        ("fold_structures", lambda: _C.fold_structures(graph)),
        ("list_idioms", lambda: torch._C._jit_pass_peephole_list_idioms(graph, True)),
        ("constant_loop_unrolling",
         lambda: torch._C._jit_pass_constant_loop_unrolling(graph)),
        ("dce", lambda: torch._C._jit_pass_dce(graph)),
    ]
    to_fixed_point(structure)
    if none_inputs:
        # Optional inputs that are None in the example: `if mask is not None` folds.
        none = graph.insertConstant(None)
        none.node().moveBefore(next(iter(graph.nodes())))
        for position in none_inputs:
            list(graph.inputs())[position].replaceAllUsesWith(none)
        dump.graph("specialize_none_inputs", graph)
        to_fixed_point(structure)
    # Blade compiles for inference: the types are recorded under no_grad, so branches a
    # model takes only when autograd is on (nn.TransformerEncoderLayer's slow path) are
    # not the ones compiled.
    with torch.no_grad():
        run("materialize_types",
            lambda: _C.materialize_types(
                graph, (module._c,) + private_copy(inputs), True,
                [(module._c,) + private_copy(more) for more in resized_inputs]))
    # With shapes known: size()/dim() fold, splits of known sizes become slices, which
    # opens more of the above.
    to_fixed_point([
        ("split_to_slices", lambda: _C.split_to_slices(graph)),
        ("peephole", lambda: torch._C._jit_pass_peephole(graph, False)),
        ("fold_numel", lambda: _C.fold_numel(graph)),
        ("fold_sizes", lambda: _C.fold_sizes(graph)),
    ] + structure)
    return _still_decomposed(decomposed, graph), unspecialized


def _still_decomposed(decomposed: Dict[str, int], graph) -> Dict[str, int]:
    """`decomposed` less the nodes of each op that the simplified graph still calls: a
    decomposition that applies to some arguments only (upsampling by whole factors) keeps
    the op in its other branch, and the report must not count an op as decomposed that
    runs as it was (it is listed as not compiled instead)."""
    remaining: Dict[str, int] = {}
    for node in _all_nodes(graph):
        name = schema_name(node)
        if name in decomposed:
            remaining[name] = remaining.get(name, 0) + 1
    counts = {op: n - remaining.get(op, 0) for op, n in decomposed.items()}
    return {op: n for op, n in counts.items() if n > 0}


def _verdicts(nodes: Sequence[torch._C.Node], config: Config,
              failed: Dict[torch._C.Node, str] = None) -> Dict[torch._C.Node, Verdict]:
    """The registry's verdict on each node (constants left out); the `failed` ones, nodes
    whose code failed to compile, are refused with the given reason."""
    verdicts = {}
    failed = failed or {}
    for node in nodes:
        if node.kind() == "prim::Constant":
            continue
        if node in failed:
            verdicts[node] = Verdict(None, "conversion_failed", failed[node])
            continue
        verdicts[node] = REGISTRY.check(node, config.excluded_ops,
                                        static_shapes=not config.dynamic)
    # List plumbing joins a cluster only with its users, so it needs every user supported.
    for node in nodes:
        v = verdicts.get(node)
        if node.kind() == "prim::ListConstruct" and v is not None and v.supported:
            users = [u.user for u in node.output().uses()]
            if not users or not all(verdicts.get(u, Verdict(None)).supported for u in users):
                verdicts[node] = Verdict(None, "not_needed", "list used outside compiled ops")
    return verdicts


def _specs(*groups, unnamed_dtype: Optional[str] = None) -> List[List[str]]:
    """Per group of values, their specs, `float32[s0,128,768]`: a dynamic dim is named by
    its shape symbol (`s0`, `s1`, ... in order of appearance across all groups), so dims
    that must be equal share a name; see csrc/ral/tensor_spec.h. A dtype the runtime cannot
    name (complex64, ...) is written `unnamed_dtype` (the guard's stand-in, see `_guard`);
    without one it is an error."""
    names: Dict[int, str] = {}

    def spec(v) -> str:
        t = v.type()
        dims = [str(s) if s >= 0 else names.setdefault(s, f"s{len(names)}")
                for s in t.symbolic_sizes()]
        name = SCALAR_TYPE_NAMES.get(t.scalarType(), unnamed_dtype)
        if name is None:
            raise ValueError(f"blade: %{v.debugName()} has dtype {dtype_name(t.dtype())}, "
                             "which the runtime's tensor specs cannot name")
        return f"{name}[{','.join(dims)}]"

    return [[spec(v) for v in group] for group in groups]


# How many times the nodes of one cluster are clustered again after a failure named a node.
MAX_RECLUSTER_ROUNDS = 4


def _input_signature(node: torch._C.Node) -> Tuple:
    return tuple((str(v.type()), repr(v.toIValue()) if v.node().kind() == "prim::Constant"
                  else None) for v in node.inputs())


def _failed_nodes(moved: Sequence[torch._C.Node], size: int,
                  node_index: Optional[int]) -> List[torch._C.Node]:
    """The dissolved cluster's node that a compile error named, followed by the nodes of the
    same op on inputs of the same types and constants (which would fail alike); empty when
    the error names no compute node."""
    if node_index is None or len(moved) != size or not 0 <= node_index < size:
        return []
    node = moved[node_index]
    if not is_tensor_op(node) or node.kind() == "prim::ListConstruct":
        return []
    twins = [n for n in moved if n is not node and schema_name(n) == schema_name(node) and
             _input_signature(n) == _input_signature(node)]
    return [node] + twins


def _cluster(graph, verdicts: Dict[torch._C.Node, Verdict], config: Config,
             report: Report) -> List:
    """Clusters the supported nodes of `verdicts`; the ops of clusters dissolved again (too
    small, non-tensor boundary) are reported. The caller's node handles are invalid after
    this: clustering moves nodes into subgraphs."""
    supported = [n for n, v in verdicts.items() if v.supported]
    compute = [n for n in supported if verdicts[n].converter.compute]
    clusters, dissolved = _C.cluster_supported_nodes(graph, supported, compute,
                                                     config.min_cluster_size)
    for d in dissolved:
        for op in d.node_kinds:  # overloads, like the registry's verdicts
            report.add_unsupported(op, f"supported, but not compiled: {d.reason}")
    return clusters


def _dissolve_failed(cluster, error: Exception, message: str, ops: Dict[str, int],
                     config: Config, report: Report,
                     may_retry: bool) -> Dict[torch._C.Node, Verdict]:
    """Puts a cluster that failed to compile back into TorchScript and reports why. When
    `may_retry` and the error names its node, returns the verdicts to cluster the other
    nodes again with (that node and its twins refused); else only reports the ops."""
    size = len(list(cluster.g("Subgraph").nodes()))
    moved = _C.dissolve_cluster(cluster)
    summary = getattr(error, "summary", None) or (str(error).splitlines() or [""])[0]
    reason = f"conversion failed: {summary}"
    failed = _failed_nodes(moved, size, getattr(error, "node_index", None)) if may_retry \
        else []
    if not failed:
        report.compile_errors.append(message)
        for kind, count in ops.items():
            for _ in range(count):
                report.add_unsupported(kind, reason)
        return {}
    twins = f" and {len(failed) - 1} like it" if len(failed) > 1 else ""
    report.compile_errors.append(f"{message}\n(left in TorchScript: {describe(failed[0])}"
                                 f"{twins}; the rest of the cluster is compiled again)")
    for node in failed:
        report.add_unsupported(schema_name(node), reason)
    return _verdicts(moved, config, {n: reason for n in failed})


def _compile_clusters(module, graph, clusters: List, config: Config, report: Report,
                      dump: Dumper, progress: Progress) -> None:
    """Swaps each cluster for an engine, or dissolves it back into TorchScript when it
    fails to compile. In rounds: when a failure names its node, the nodes of the clusters
    that failed so are clustered again without those nodes once the round is over (when
    no cluster node is left in the graph to merge with), and the new clusters compiled."""
    cpu_features = ""
    if clusters and not config.dry_run:
        cpu_features = native.host_cpu_features()
        # Every engine is signed (docs/security.md): a key that cannot sign fails here,
        # once, rather than every cluster alike.
        _C.signing_public_key(config.signing_key or "")
    code_cache = CodeCache.for_config(config)
    progress.begin(0 if config.dry_run else len(clusters), "compiling clusters")
    # LLVM's part of each compilation runs on worker processes too (blade.codegen.llvm.native); they
    # start at the first cluster that is compiled and stop when all are done.
    with CompilerPool(default_workers(config.compile_workers), str(RUNTIME_LIBRARY)) as pool:
        _compile_in_rounds(module, graph, clusters, config, report, dump, progress,
                           cpu_features, code_cache, pool)


def _compile_in_rounds(module, graph, clusters: List, config: Config, report: Report,
                       dump: Dumper, progress: Progress, cpu_features: str,
                       code_cache: CodeCache, pool: CompilerPool) -> None:
    index = 0
    for rounds in range(MAX_RECLUSTER_ROUNDS + 1):
        retry: Dict[torch._C.Node, Verdict] = {}

        def failed(entry, cluster, ops, cluster_dump, start, error) -> None:
            # Any failure of one cluster: it stays TorchScript.
            message = f"{entry.name} ({', '.join(sorted(ops))}): {type(error).__name__}: " \
                f"{error}"
            cluster_dump.finish({**cluster_dump.seconds, "total": time.perf_counter() - start},
                                error=message)
            retry.update(_dissolve_failed(cluster, error, message, ops, config, report,
                                          may_retry=rounds < MAX_RECLUSTER_ROUNDS))

        # Each cluster's compilation is begun (MLIR's stages here, LLVM's handed to the
        # pool), then each is finished in turn: the workers compile one cluster's code
        # while the next goes through MLIR.
        begun = []
        for cluster in clusters:
            ops = _op_counts(cluster.g("Subgraph"))
            entry = ClusterReport(f"{ENGINE_PREFIX}{index}", ops,
                                  *_signatures(cluster.inputs(), cluster.outputs()))
            index += 1
            if config.dry_run:
                entry.compiled = False
                entry.status = "dry run: not compiled"
                report.clusters.append(entry)
                _C.dissolve_cluster(cluster)
                continue
            cluster_dump = dump.cluster(entry.name)
            start = time.perf_counter()
            try:
                finish = _start_cluster(module, cluster, index - 1, config, cpu_features,
                                        cluster_dump, code_cache, pool)
            except Exception as e:
                failed(entry, cluster, ops, cluster_dump, start, e)
                progress.step(entry.name)
                continue
            begun.append((entry, cluster, ops, cluster_dump, start, finish))
        for entry, cluster, ops, cluster_dump, start, finish in begun:
            try:
                compiled, entry.code = finish()
                entry.library_calls = compiled.library_calls
                entry.fused_attention = compiled.fused_attention
                entry.parallel_loops = compiled.parallel_loops
                entry.tiled_transposes = compiled.tiled_transposes
                report.compiled_ops += sum(ops.values())
                report.clusters.append(entry)
                cluster_dump.finish({**cluster_dump.seconds,
                                     "total": time.perf_counter() - start})
            except Exception as e:
                failed(entry, cluster, ops, cluster_dump, start, e)
            progress.step(entry.name)
        if not retry:
            return
        clusters = _cluster(graph, retry, config, report)
        del retry
        progress.total += len(clusters)


def _account_for_ops_outside_engines(graph, report: Report) -> None:
    """Every op that ran outside an engine must have a reason in the report. The stages
    above record one wherever they leave an op out; an op they missed (a bug) is listed
    here rather than silently lowering the coverage."""
    outside: Dict[str, int] = {}
    for node in _all_nodes(graph):
        if is_tensor_op(node) and ran(node):
            outside[schema_name(node)] = outside.get(schema_name(node), 0) + 1
    for op, count in outside.items():
        entry = report.unsupported.get(op)
        for _ in range(count - (entry.count if entry else 0)):
            report.add_unsupported(op, "left outside every engine, and Blade recorded no "
                                   "reason (please report this)")


def _signatures(inputs, outputs) -> Tuple[str, str]:
    """The engine's input and output specs, one symbol naming across both."""
    specs_in, specs_out = _specs(list(inputs), list(outputs))
    return ";".join(specs_in), ";".join(specs_out)


def _has_dynamic_dims(values) -> bool:
    return any(s < 0 for v in values for s in v.type().symbolic_sizes())


def _op_counts(subgraph) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for node in _all_nodes(subgraph):
        if is_tensor_op(node):
            counts[schema_name(node)] = counts.get(schema_name(node), 0) + 1
    return counts


def _start_cluster(module, cluster, index: int, config: Config, cpu_features: str,
                   dump, code_cache: CodeCache, pool: CompilerPool):
    """Begins compiling one cluster; returns the function that finishes it and swaps the
    cluster for an engine call, returning the CompiledCluster and where its code came
    from (compiled, the compile cache, or another engine of this model with the same
    code). Either raises on any failure, leaving the graph untouched. `dump` (a
    ClusterDump) receives the IR of every stage."""
    from blade.importer import import_subgraph

    subgraph = cluster.g("Subgraph").copy()
    dump.write("0_torchscript.txt", str(subgraph))
    start = time.perf_counter()
    # Positions in the cluster, taken before constants are lifted out: the ops of node k
    # are located at importer.node_location(k), which a CodegenError reports back.
    node_indices = {node: k for k, node in enumerate(subgraph.nodes())}
    params = _C.lift_tensor_constants(subgraph)
    fallback_ir = _C.fallback_ir(subgraph)

    def converter_for(node):
        # The clusterer's verdicts died with the node handles; re-check only the ops that a
        # converter with its own lowering may take.
        if not REGISTRY.has_lowering(schema_name(node)):
            return None
        return REGISTRY.check(node, config.excluded_ops,
                              static_shapes=not config.dynamic).converter

    imported = import_subgraph(subgraph, converter_for=converter_for, params=params,
                               node_indices=node_indices)
    dump.seconds["import"] = time.perf_counter() - start
    input_specs, output_specs = _signatures(cluster.inputs(), cluster.outputs())
    # Outputs of dynamic size are allocated and returned by the code, not passed to it.
    returns_outputs = _has_dynamic_dims(cluster.outputs())
    num_buffers = len(list(subgraph.inputs())) + \
        (0 if returns_outputs else len(list(subgraph.outputs())))

    def start_build():
        # The workers get ready while MLIR loads and its stages run.
        pool.expect(len(imported.text))
        # Imported here: a model whose code is all in the compile cache never loads MLIR.
        from blade.codegen import driver as codegen

        return codegen.start_compiling(imported.text, num_buffers,
                                       returns_outputs=returns_outputs,
                                       user_calls=imported.user_calls, dump=dump,
                                       parallel_loops=config.parallel, pool=pool)

    # A user converter's StableHLO comes from Python the key cannot see, and a dump wants
    # every stage's IR: those clusters are always compiled.
    name = f"{ENGINE_PREFIX}{index}"
    if imported.user_calls or dump.enabled:
        finish_build = start_build()

        def finish_code():
            compiled = finish_build()
            code = torch.frombuffer(bytearray(compiled.library), dtype=torch.uint8)
            return compiled, code, "compiled"
    else:
        key = code_cache.key(torch_ir=imported.text, num_buffers=num_buffers,
                             returns_outputs=returns_outputs, parallel=config.parallel,
                             cpu_features=cpu_features)
        sharing = code_cache.first_user.setdefault(key, name)
        finish_cached = code_cache.start(key, start_build)

        def finish_code():
            compiled = finish_cached()
            origin = code_cache.origin[key] if sharing == name else f"same code as {sharing}"
            return compiled, code_cache.code_tensor(key), origin

    def finish():
        compiled, code, origin = finish_code()
        signature = _C.sign_engine(name, code, input_specs, output_specs, fallback_ir,
                                   params, config.fallback, cpu_features,
                                   config.signing_key or "")
        engine = torch.classes.blade.Engine(
            name, code, input_specs, output_specs, fallback_ir, params, config.fallback,
            cpu_features, signature)
        if not engine.is_compiled():
            raise RuntimeError(f"the compiled code does not load: {engine.load_error()}")
        module._c._register_attribute(name, engine._type(), engine)
        _C.replace_cluster_with_engine(cluster, name)
        return compiled, origin

    return finish


def _guard(module, graph, unspecialized, none_inputs: Sequence[int], config: Config,
           report: Report) -> None:
    """The optimized graph runs under a guard of its inputs (csrc/ral/guard.h): tensor
    inputs as typed, optional ones specialized to None (`none_inputs`, graph positions)
    must be None; other inputs run `unspecialized`, the graph from before the example
    inputs were used. An input of a dtype the guard cannot name (complex64, uint16,
    float8_e4m3fn, ...) is checked through a stand-in (see `_dtype_stand_in`)."""
    inputs = list(graph.inputs())
    tensors = [i for i, v in enumerate(inputs)
               if i > 0 and isinstance(v.type(), torch._C.TensorType)]
    complete = [i for i in tensors if inputs[i].type().scalarType() is not None and
                inputs[i].type().symbolic_sizes() is not None]
    unnamed = {i: inputs[i].type().dtype() for i in complete
               if inputs[i].type().scalarType() not in SCALAR_TYPE_NAMES}
    specs = dict(zip(complete, _specs([inputs[i] for i in complete],
                                      unnamed_dtype="bool")[0]))
    guarded = sorted(tensors + list(none_inputs))
    report.guard_inputs = [argument_name(inputs[i]) for i in guarded]
    text = ";".join("None" if i in none_inputs else specs.get(i, "*") for i in guarded)
    guard = torch.classes.blade.Guard(text, config.fallback)
    module._c._register_attribute(GUARD_ATTRIBUTE, guard._type(), guard)
    _C.guard_specialization(graph, unspecialized, GUARD_ATTRIBUTE, guarded)
    if unnamed:
        _check_dtypes_through_stand_ins(
            graph, {guarded.index(i): dtype for i, dtype in unnamed.items()})
        for i, dtype in unnamed.items():
            report.guard_notes.append(
                f"input {guarded.index(i)} ({dtype_name(dtype)}): the guard checks its shape "
                f"as {specs[i]}, and TorchScript its dtype; another dtype there shows as "
                "'the tensor is undefined'")


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


def _read_weights_from_engines(module, graph, report: Report) -> None:
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
    for node in _all_nodes(graph) if owners else []:
        if node.kind() != "prim::Constant" or \
                not isinstance(node.output().type(), torch._C.TensorType):
            continue
        weight = node.t("value")
        if weight.numel() == 0 or weight.untyped_storage().data_ptr() not in owners:
            continue
        name, index, param = owners[weight.untyped_storage().data_ptr()]
        if weight.dtype != param.dtype:
            continue
        with graph.insert_point_guard(node):
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
        node.output().replaceAllUsesWith(read)
        node.destroy()


def _none_inputs(graph, inputs: Tuple) -> List[int]:
    """Graph positions of the optional tensor inputs that are None in the example."""
    found = []
    for position, (value, example) in enumerate(zip(list(graph.inputs())[1:], inputs), 1):
        t = value.type()
        if example is None and isinstance(t, torch._C.OptionalType) and \
                isinstance(t.getElementType(), torch._C.TensorType):
            found.append(position)
    return found


def _dynamic_groups(module, inputs: Tuple, config: Config):
    """The groups of input dims that vary (see blade.frontend.dynamic_shapes) and copies of the
    example inputs resized along all of them (`resized_variants`), for materialize_types;
    nothing without Config.dynamic."""
    if not config.dynamic:
        return [], []
    from blade.frontend.dynamic_shapes import find_dynamic_groups, resized_variants

    # A function of its own over a copy of the graph: running `module` itself would make
    # TorchScript cache an execution plan of the graph that simplify is about to rewrite.
    probe = torch._C._create_function_from_graph("blade_probe_shapes", module.graph.copy())

    def run(xs):
        with torch.no_grad():
            probe(module._c, *private_copy(xs))

    groups = find_dynamic_groups(run, inputs, config.dynamic_dims)
    return groups, (resized_variants(run, inputs, groups) if groups else [])


def optimize(model, example_inputs=None, config: Config = None, *,
             example_kwarg_inputs: Optional[Dict[str, Any]] = None) -> torch.jit.ScriptModule:
    """Compiles what it can of `model` and returns a ScriptModule computing the same results.

    `model` is an nn.Module (scripted, or traced with `Config(allow_tracing=True)`), a
    ScriptModule, or a `torch.export.ExportedProgram` (whose own example inputs serve when
    none are given; see `blade.frontend.exported_program`). `example_inputs` is a tensor, a tuple
    of forward's inputs, or a dict of them by argument name; `example_kwarg_inputs` adds
    inputs by name to positional ones. The optimized model takes its inputs as forward did,
    by position or by name.

    Example:
        >>> optimized = blade.optimize(model.eval(), (torch.randn(8, 64),))
        >>> optimized = blade.optimize(model, (ids,), example_kwarg_inputs={"mask": mask})
        >>> torch.jit.save(optimized, "model.pt")
    """
    # No side effects: the model runs on private copies of the example inputs, the random
    # generators are restored on every exit, and a ScriptModule keeps its training flags.
    # TorchScript's deprecation notices are silenced for the whole of it (blade/quiet.py).
    with preserved_random_state(), quiet_torchscript():
        return _optimize(model, example_inputs, example_kwarg_inputs, config or Config())


def _optimize(model, example_inputs, example_kwarg_inputs, config: Config):
    args, kwargs = _split_example_inputs(example_inputs, example_kwarg_inputs)
    progress = Progress(Progress.wanted(config.progress))
    try:
        return _optimize_with_progress(model, args, kwargs, config, progress)
    finally:
        progress.finish()


def _optimize_with_progress(model, args: Tuple, kwargs: Dict, config: Config,
                            progress: Progress) -> torch.jit.ScriptModule:
    if is_exported_program(model):
        progress.stage("tracing the exported program")
        scripted, args, config = exported_program.to_torchscript(model, args, kwargs, config)
        kwargs = {}
    else:
        if not args and not kwargs:
            raise TypeError("blade.optimize: example inputs are needed: a tensor, a tuple of "
                            "forward's inputs or a dict of them by argument name")
        progress.stage("tracing" if config.allow_tracing else "scripting")
        with _each_method_parsed_once():
            scripted = _to_torchscript(model, args, kwargs, config)
    progress.stage("freezing")
    with _eval_mode(scripted):
        inputs = _bind_inputs(scripted, args, kwargs)
        config = _dynamic_dims_by_position(scripted, config)
        module = torch.jit.freeze(scripted, preserved_attrs=list(config.preserved_attributes))
    graph = module.graph
    dump = Dumper.for_config(config.dump_dir)
    if config.dynamic:
        progress.stage("finding dynamic dims")
    groups, resized_inputs = _dynamic_groups(module, inputs, config)
    none_inputs = _none_inputs(graph, inputs)
    progress.stage("simplifying, recording types")
    decomposed, unspecialized = simplify(graph, module, inputs, config.excluded_ops, dump,
                                         resized_inputs, config.dynamic, none_inputs)
    if config.dynamic:
        _C.duplicate_shape_arithmetic(graph)
        dump.graph("duplicate_shape_arithmetic", graph)

    graph_inputs = list(graph.inputs())
    report = Report(dry_run=config.dry_run, decomposed=decomposed,
                    dynamic_dims=[[f"input {p} ('{argument_name(graph_inputs[p + 1])}') dim {d}"
                                   for p, d in g.dims] for g in groups])
    verdicts = _verdicts(_all_nodes(graph), config)
    for node, verdict in verdicts.items():
        if not is_tensor_op(node):
            continue
        if verdict.category == "not_materialized":
            # Never ran on the example inputs (an untaken branch): listed, but not counted
            # in the coverage of what the example inputs run.
            report.add_unreached(schema_name(node), verdict.reason)
            continue
        report.total_ops += 1
        if not verdict.supported:
            report.add_unsupported(schema_name(node), verdict.reason)
    progress.stage("clustering")
    clusters = _cluster(graph, verdicts, config, report)
    del verdicts
    dump.graph("clustered", graph, always=True)

    _compile_clusters(module, graph, clusters, config, report, dump, progress)
    torch._C._jit_pass_dce(graph)
    if not config.dry_run:
        _account_for_ops_outside_engines(graph, report)
    _guard(module, graph, unspecialized, none_inputs, config, report)
    if not config.dry_run:
        _read_weights_from_engines(module, graph, report)
    # Loading the saved model compiles its code again, at a cost quadratic in the code of
    # large branches (csrc/passes/outline_branches.h); as functions they cost what they hold.
    _C.outline_branches(graph, OUTLINED_BRANCH_MIN_NODES)
    dump.graph("final", graph, always=True)
    module._c._register_attribute(REPORT_ATTRIBUTE, torch._C.StringType.get(), report.to_json())
    if config.verbose or dump.enabled:
        from blade.report import report as read_report
        text = str(read_report(module))
        dump.text("report.txt", text + "\n")
        if config.verbose:
            print(text)
    return module
