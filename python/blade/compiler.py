"""The compiler driver: `blade.optimize`.

    script/trace -> freeze -> simplify + materialize types -> registry verdicts
    -> acyclic clustering (C++) -> per cluster: import -> StableHLO -> native -> Engine
"""
import concurrent.futures
import contextlib
import functools
import gc
import inspect
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.partition import converters  # noqa: F401  (importing it registers the built-ins)
from blade.frontend import exported_program
from blade.codegen.llvm import native
from blade.codegen.cache import CodeCache
from blade.model_cache import ModelCache
from blade.config import Config
from blade.partition.dtypes import SCALAR_TYPE_NAMES, dtype_name
from blade.tools.dump import Dumper, Progress
from blade.frontend.exported_program import is_exported_program
from blade.frontend.inputs import (bind_inputs, dynamic_dims_by_position, preserved_module_state,
                                   preserved_random_state,
                                   private_copy, split_example_inputs)
from blade.frontend.scripting import each_method_parsed_once, eval_mode, to_torchscript
from blade.frontend.graph_walk import all_nodes
from blade.frontend.quantize import QUANTIZED, int8_readers, quantize
from blade.frontend.simplify import attribute_path, is_tensor_op, simplify
from blade.partition.clustering import (MAX_RECLUSTER_ROUNDS, dissolve_failed, edge_ops,
                                       form_clusters, is_edge_view, release_edge_views,
                                        registry_verdicts)
from blade.codegen.llvm.native import CompilerPool, default_workers
from blade._runtime import RUNTIME_LIBRARY
from blade.quiet import quiet_torchscript
from blade.partition.registry import REGISTRY, Verdict, argument_name, ran, schema_name
from blade.report import (GUARD_ATTRIBUTE, REPORT_ATTRIBUTE, ClusterReport, CodeOrigin,
                          Report)
from blade.self_check import (CheckTime, EngineCheckError, Example, capture_cluster_examples,
                              compare_engine, draws_random_numbers, examples_from_results,
                              find_disagreeing_node, repetition_key)

ENGINE_PREFIX = "blade_engine_"
# csrc/passes/functionalize_input_writes.h
WRITE_BACK = "blade::write_back"
# If-branches of more nodes than this become functions (csrc/passes/outline_branches.h).
OUTLINED_BRANCH_MIN_NODES = 1


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


def _compile_clusters(module, graph, clusters: List, config: Config, report: Report,
                      dump: Dumper, progress: Progress, inputs: Tuple, results: List,
                      resized: bool = False) -> None:
    """Swaps each cluster for an engine, or dissolves it back into TorchScript when it
    fails to compile. In rounds: when a failure names its node, the nodes of the clusters
    that failed so are clustered again without those nodes once the round is over (when
    no cluster node is left in the graph to merge with), and the new clusters compiled.
    `results` are what the graph returned in the run that recorded the types; `resized`,
    whether other runs (of resized inputs, for dynamic dims) recorded types too."""
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
                           cpu_features, code_cache, pool, inputs, results, resized)


def _compile_in_rounds(module, graph, clusters: List, config: Config, report: Report,
                       dump: Dumper, progress: Progress, cpu_features: str,
                       code_cache: CodeCache, pool: CompilerPool, inputs: Tuple,
                       results: List, resized: bool) -> None:
    index = 0
    check_time = CheckTime()
    for rounds in range(MAX_RECLUSTER_ROUNDS + 1):
        retry: Dict[torch._C.Node, Verdict] = {}

        def failed(entry, cluster, ops, cluster_dump, start, error) -> None:
            # Any failure of one cluster: it stays TorchScript.
            message = f"{entry.name} ({', '.join(sorted(ops))}): {type(error).__name__}: " \
                f"{error}"
            cluster_dump.finish({**cluster_dump.seconds, "total": time.perf_counter() - start},
                                error=message)
            retry.update(dissolve_failed(cluster, error, message, ops, config, report,
                                          may_retry=rounds < MAX_RECLUSTER_ROUNDS))

        # The engine check's examples: those of clusters that take the graph's inputs and
        # give its results come from the run that recorded the types; for the others, an
        # example run runs on a thread of its own while the clusters compile (a TorchScript
        # run of the model up to its last such cluster: a good part of a small model's
        # compile time). A cluster that repeats an earlier one (a model's repeated layers:
        # the same nodes, constants and types, other weights) most likely compiles to the
        # same code, which is checked once (CheckTime.agreed): it is recorded only when its
        # engine runs code not yet checked, by a second run (`deferred`), prepared now (the
        # graph changes as engines replace clusters) and run on this thread then, once per
        # round. Writes of their results into the caller's tensors that the engines do
        # themselves (a cluster may gain an input for one: before its examples are recorded).
        writes = {c: [] if config.dry_run else _C.absorbable_write_backs(c) for c in clusters}
        # Each cluster is imported first (its compile cache key known, its entry read), and
        # the compilations are begun once the example runs are under way (MLIR's stages
        # here, LLVM's handed to the pool), then each is finished in turn: the workers
        # compile one cluster's code while the next goes through MLIR.
        imported = []
        for cluster in clusters:
            ops = _op_counts(cluster)
            input_specs, output_specs = _signatures(cluster.inputs(), cluster.outputs())
            entry = ClusterReport(name=f"{ENGINE_PREFIX}{index}", ops=ops,
                                  inputs=input_specs, outputs=output_specs)
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
                key, start_build = _start_cluster(module, cluster, index - 1, config,
                                                  cpu_features, cluster_dump, code_cache,
                                                  pool, check_time, writes[cluster])
            except Exception as e:
                failed(entry, cluster, ops, cluster_dump, start, e)
                progress.step(entry.name)
                continue
            imported.append((entry, cluster, ops, cluster_dump, start, key, start_build))
        capture = checker = run_deferred = None
        known, captured, deferred = {}, [], []
        if config.check_engines and imported:
            start = time.perf_counter()
            # Code that passed the check in the optimize that compiled it (its compile
            # cache entry says so) needs no example.
            unchecked = [c for _, c, _, _, _, key, _ in imported
                         if not code_cache.checked_before(key, config.precision)]
            # A branch's nodes have types because the example inputs ran it, unless resized
            # inputs recorded types too.
            known = examples_from_results(graph, unchecked, inputs, results,
                                          through_branches=not resized)
            kinds = set()
            for c in unchecked:
                if c not in known:
                    kind = repetition_key(c)
                    (deferred if kind in kinds else captured).append(c)
                    kinds.add(kind)
            if deferred:
                run_deferred = capture_cluster_examples(module, graph, deferred, inputs)
            if captured:
                run_example = capture_cluster_examples(module, graph, captured, inputs)
                checker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="blade-check")
                capture = checker.submit(run_example)
            check_time.capture += time.perf_counter() - start
        begun = []
        for entry, cluster, ops, cluster_dump, start, _, start_build in imported:
            try:
                finish = start_build()
            except Exception as e:
                failed(entry, cluster, ops, cluster_dump, start, e)
                progress.step(entry.name)
                continue
            begun.append((entry, cluster, ops, cluster_dump, start, finish))
        by_cluster = dict(known)
        if capture is not None:
            start = time.perf_counter()  # what the compiles did not hide of the run
            try:
                by_cluster.update(zip(captured, capture.result()))
            finally:
                checker.shutdown()
            check_time.capture += time.perf_counter() - start

        deferred_error: List[Exception] = []  # the deferred run's, raised for each cluster

        def example_of(cluster) -> Optional[Example]:
            nonlocal run_deferred
            if cluster in deferred and run_deferred is not None:
                start = time.perf_counter()
                recorded, run_deferred = run_deferred, None  # run once
                try:
                    by_cluster.update(zip(deferred, recorded()))
                except Exception as e:
                    deferred_error.append(e)
                finally:
                    check_time.capture += time.perf_counter() - start
            if cluster in deferred and deferred_error:
                # The cluster fails with it (and stays TorchScript): none runs unchecked.
                raise deferred_error[0]
            return by_cluster.get(cluster)

        for entry, cluster, ops, cluster_dump, start, finish in begun:
            try:
                compiled, origin, written, entry.code_key = finish(
                    functools.partial(example_of, cluster))
                entry.code, entry.code_shared_with = origin
                if written:
                    # The in-place ops' writes into the caller's tensors, done by the engine.
                    ops[WRITE_BACK] = len(written)
                    report.total_ops += len(written)
                entry.take(compiled.statistics)
                report.compiled_ops += sum(ops.values())
                report.clusters.append(entry)
                cluster_dump.finish({**cluster_dump.seconds,
                                     "total": time.perf_counter() - start})
            except Exception as e:
                failed(entry, cluster, ops, cluster_dump, start, e)
            progress.step(entry.name)
        report.checked_engines = check_time.engines
        report.engines_sharing_checked_code = check_time.sharing
        report.engines_checked_before = check_time.checked_before
        report.engines_not_reached_by_the_check = check_time.unreached
        report.examples_from_type_run += len(known)
        report.check_seconds = round(check_time.total, 3)
        if not retry:
            return
        clusters = form_clusters(graph, retry, config, report)
        del retry
        progress.total += len(clusters)


def _account_for_ops_outside_engines(graph, report: Report) -> None:
    """Every op that ran outside an engine must have a reason in the report. The stages
    above record one wherever they leave an op out; an op they missed (a bug) is listed
    here rather than silently lowering the coverage."""
    outside: Dict[str, int] = {}
    for node in all_nodes(graph):
        if is_edge_view(node):
            continue  # counted with its engine
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


def _signatures(inputs, outputs) -> Tuple[str, str]:
    """The engine's input and output specs, one symbol naming across both."""
    specs_in, specs_out = _specs(list(inputs), list(outputs))
    return ";".join(specs_in), ";".join(specs_out)


def _has_dynamic_dims(values) -> bool:
    return any(s < 0 for v in values for s in v.type().symbolic_sizes())


def _op_counts(cluster) -> Dict[str, int]:
    """The cluster's ops by overload: its subgraph's and those of its edge views."""
    counts: Dict[str, int] = {}
    for node in all_nodes(cluster.g("Subgraph")):
        if is_tensor_op(node):
            counts[schema_name(node)] = counts.get(schema_name(node), 0) + 1
    for name in edge_ops(cluster):
        counts[name] = counts.get(name, 0) + 1
    return counts


PREFIX_SUFFIX = "_prefix"  # of the engines a bisection compiles


def _start_cluster(module, cluster, index: int, config: Config, cpu_features: str,
                   dump, code_cache: CodeCache, pool: CompilerPool, check_time: CheckTime,
                   writes: List[Tuple[int, int]]):
    """Imports one cluster; returns its compile cache key (see _start_engine) and the
    function that begins its compilation, which returns the function that finishes it,
    checks the engine against the example that its argument gives (called only when the
    engine's code is not that of an engine already checked): what the cluster's nodes made
    of its inputs in the example run (None: not checked; see blade.self_check), and swaps
    the cluster for an engine call, returning the CompiledCluster, where its code came from
    (compiled, the compile cache, or another engine of this model with the same code) and
    `writes`, the (output, input) pairs the engine writes (absorbable_write_backs,
    csrc/passes/engine_call.h), and the code's compile cache key ("" when none). Each raises
    on any failure, leaving the graph untouched.
    `dump` (a ClusterDump) receives the IR of every pass."""
    name = f"{ENGINE_PREFIX}{index}"
    subgraph = cluster.g("Subgraph").copy()
    key, start_engine = _start_engine(
        subgraph, name, config, cpu_features, dump, code_cache, pool,
        boundary=(list(cluster.inputs()), list(cluster.outputs())), writes=writes)

    def build_prefix(prefix):
        # The same compilation for a prefix of the cluster (self_check's bisection).
        _, start_prefix = _start_engine(prefix, name + PREFIX_SUFFIX, config, cpu_features,
                                        Dumper(None).cluster(name), code_cache, pool)
        return start_prefix()()[1]

    def finish(example_of: Callable[[], Optional[Example]]):
        compiled, engine, origin, key = finish_engine()
        shares_checked_code = origin[0] == CodeOrigin.SHARED and origin[1] in check_time.agreed
        example = None
        if shares_checked_code:
            check_time.sharing += 1
        elif config.check_engines and code_cache.checked_before(key, config.precision):
            # Checked by the optimize that compiled it (its entry says so, signed), whether
            # this engine is its first user here or shares it with one that failed.
            check_time.checked_before += 1
            check_time.agreed.add(name)
        elif config.check_engines:
            example = example_of()
            if example is None:
                # The example run never reached the cluster: a branch that only the
                # resized inputs of dynamic dims took. Said in the report.
                check_time.unreached += 1
        if example is not None:
            start = time.perf_counter()
            random = draws_random_numbers(cluster.g("Subgraph"))
            problem = compare_engine(engine, example.inputs,
                                     None if random else example.outputs)
            check_time.compare += time.perf_counter() - start
            check_time.engines += 1
            if problem is not None:
                start = time.perf_counter()
                blamed = find_disagreeing_node(cluster.g("Subgraph"), example.inputs,
                                               build_prefix)
                check_time.bisect += time.perf_counter() - start
                raise EngineCheckError(
                    f"the compiled code disagrees with TorchScript on the example inputs: "
                    f"{problem}", blamed,
                    f"the compiled code disagrees with TorchScript ({problem})")
            check_time.agreed.add(name)
            if key is not None:
                code_cache.mark_checked(key, config.precision)
        module._c._register_attribute(name, engine._type(), engine)
        _C.replace_cluster_with_engine(cluster, name, writes)
        return compiled, origin, writes, key or ""

    def start():
        nonlocal finish_engine
        finish_engine = start_engine()
        return finish

    finish_engine = None
    return key, start


def _start_engine(subgraph, name: str, config: Config, cpu_features: str, dump,
                  code_cache: CodeCache, pool: CompilerPool, boundary=None,
                  writes: Sequence[Tuple[int, int]] = ()):
    """Imports `subgraph` (a copy of a cluster's, or of a prefix of it); returns its compile
    cache key (None: compiled apart from the cache) and the function that begins its
    compilation, which returns the function that finishes it and returns the
    CompiledCluster, the loaded Engine, where its code came from and the key. `boundary` is
    the (inputs, outputs) whose types the engine's signature names, the subgraph's own by
    default; `writes`, the engine's (output, input) pairs (Engine::writes). `subgraph` is
    changed (its constants become params)."""
    from blade.importer import import_subgraph

    dump.write("0_torchscript.txt", str(subgraph))
    start = time.perf_counter()
    # Positions in the cluster, taken before constants are lifted out: the ops of node k
    # are located at importer.node_location(k), which a CodegenError reports back.
    node_indices = {node: k for k, node in enumerate(subgraph.nodes())}
    inputs, outputs = boundary or (list(subgraph.inputs()), list(subgraph.outputs()))
    input_specs, output_specs = _signatures(inputs, outputs)
    precision = _engine_precision(subgraph, config)
    params = _C.lift_tensor_constants(subgraph)
    fallback_ir = _C.fallback_ir(subgraph)
    # Outputs of dynamic size are allocated and returned by the code, not passed to it.
    returns_outputs = _has_dynamic_dims(outputs)
    num_buffers = len(list(subgraph.inputs())) + \
        (0 if returns_outputs else len(list(subgraph.outputs())))

    def converter_for(node):
        # The clusterer's verdicts died with the node handles; re-check only the ops that a
        # converter with its own lowering, or a kernel call, may take.
        if not REGISTRY.has_lowering(schema_name(node)) and not REGISTRY.may_call_kernel(node):
            return None
        return REGISTRY.check(node, config.excluded_ops, static_shapes=not config.dynamic,
                              kernel_calls=config.kernel_calls).converter

    imported = import_subgraph(subgraph, converter_for=converter_for, params=params,
                               node_indices=node_indices)
    dump.seconds["import"] = time.perf_counter() - start

    def start_build():
        # The workers get ready while MLIR loads and its passes run.
        pool.expect(len(imported.text))
        # Imported here: a model whose code is all in the compile cache never loads MLIR.
        from blade.codegen import driver as codegen

        return codegen.start_compiling(imported.text, num_buffers,
                                       returns_outputs=returns_outputs,
                                       user_calls=imported.user_calls, dump=dump,
                                       parallel_loops=config.parallel, pool=pool)

    # A user converter's StableHLO comes from Python the key cannot see, and a dump wants
    # every pass's IR: those clusters are always compiled.
    key = None
    if not imported.user_calls and not dump.enabled:
        key = code_cache.key(torch_ir=imported.text, num_buffers=num_buffers,
                             returns_outputs=returns_outputs, parallel=config.parallel,
                             cpu_features=cpu_features)

    def start():
        """Begins the compilation (or takes the code from the compile cache); returns the
        function that finishes it."""
        if key is None:
            finish_build = start_build()

            def code_and_origin(compiled):
                return torch.frombuffer(bytearray(compiled.library),
                                        dtype=torch.uint8), (CodeOrigin.COMPILED, "")
        else:
            # A bisection's prefix engine (self_check) is no engine of the model: the
            # model's first engine with this code is the one the others share it with.
            sharing = code_cache.first_user.get(key, name)
            if not name.endswith(PREFIX_SUFFIX):
                code_cache.first_user.setdefault(key, name)
            finish_build = code_cache.start(key, start_build)

            def code_and_origin(compiled):
                return code_cache.code_tensor(key), (code_cache.origin[key], "") \
                    if sharing == name else (CodeOrigin.SHARED, sharing)

        def finish():
            compiled = finish_build()
            code, origin = code_and_origin(compiled)
            engine = _C.create_signed_engine(name, code, input_specs, output_specs, fallback_ir,
                                             params, config.fallback, cpu_features,
                                             precision, config.signing_key or "",
                                             ";".join(f"{o}:{i}" for o, i in writes))
            if not engine.is_compiled():
                raise RuntimeError(f"the compiled code does not load: {engine.load_error()}")
            return compiled, engine, origin, key
        return finish

    return key, start


def _engine_precision(subgraph, config: Config) -> str:
    """An engine's precision (Engine::precision): "int8" when it runs int8 layers, whatever
    made them (Config.precision="int8", or a model quantized before); otherwise
    Config.precision, "float32" for the float engines of an int8 model."""
    if config.precision != "bf16" and \
            any(n.kind() in QUANTIZED.values() for n in subgraph.nodes()):
        return "int8"
    return "float32" if config.precision == "int8" else config.precision


def _guard(module, graph, unspecialized, none_inputs: Sequence[int], config: Config,
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
    specs = dict(zip(complete, _specs([inputs[i] for i in complete],
                                      unnamed_dtype="bool")[0]))
    guarded = sorted(tensors + list(none_inputs))
    report.guard_inputs = [argument_name(inputs[i]) for i in guarded]
    text = ";".join("None" if i in none_inputs else
                    ("!" if i in written else "") + specs.get(i, "*") for i in guarded)
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


def _remove_unread_attributes(module, graph, preserved: Sequence[str] = ()) -> int:
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
    # generators and the buffers forward writes into are restored on every exit, and a
    # ScriptModule keeps its training flags.
    # TorchScript's deprecation notices are silenced for the whole of it (blade/quiet.py).
    with preserved_random_state(), quiet_torchscript(), _cyclic_collection_paused():
        return _optimize(model, example_inputs, example_kwarg_inputs, config or Config())


@contextlib.contextmanager
def _cyclic_collection_paused():
    """Python's cyclic garbage collector does not run while optimize does. Scripting,
    freezing and graph rewriting make objects by the hundred thousand, each allocation
    counting towards the next collection, so the collector kept walking every object the
    process holds (the model's modules, torch's, MLIR's): 12-15% of a warm optimize of
    ResNet-50 (0.52 -> 0.45 s) and BERT-base (1.59 -> 1.35-1.44 s). Reference counting
    still frees what optimize drops; the few cycles it leaves wait for the collector's
    next run after it returns (peak memory unchanged on the benchmark models). Other
    threads of the process are paused from collecting too, for that long."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _optimize(model, example_inputs, example_kwarg_inputs, config: Config):
    args, kwargs = split_example_inputs(example_inputs, example_kwarg_inputs)
    progress = Progress(Progress.wanted(config.progress))
    try:
        return _optimize_with_progress(model, args, kwargs, config, progress)
    finally:
        progress.finish()


def _required_forward_arguments(model) -> int:
    """How many of forward's arguments have no default (one when it cannot be told)."""
    forward = getattr(model, "forward", model)
    schema = getattr(forward, "schema", None)
    if schema is not None:  # a ScriptModule's method
        return sum(1 for a in schema.arguments[1:] if not a.has_default_value())
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return 1
    named = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
    return sum(1 for p in parameters if p.default is p.empty and p.kind in named)


def _optimize_with_progress(model, args: Tuple, kwargs: Dict, config: Config,
                            progress: Progress) -> torch.jit.ScriptModule:
    if config.precision == "bf16" and \
            "avx512_bf16" not in native.host_cpu_features().split(","):
        raise ValueError("blade.optimize: Config(precision='bf16') runs GEMMs and "
                         "convolutions with avx512_bf16 instructions, which this CPU lacks "
                         f"(it has: {native.host_cpu_features() or 'none of those Blade uses'}); "
                         "use precision='float32'")
    if config.precision == "int8" and not _C.has_int8_dot_product():
        raise ValueError("blade.optimize: Config(precision='int8') runs int8 GEMMs with "
                         "VNNI, AVX-VNNI or AMX-INT8 instructions, which this CPU lacks "
                         f"(it has: {native.host_cpu_features() or 'none of those Blade uses'}); "
                         "use precision='float32'")
    models = ModelCache.for_config(config)
    if is_exported_program(model):
        progress.stage("tracing the exported program")
        scripted, args, config = exported_program.to_torchscript(model, args, kwargs, config)
        kwargs = {}
    else:
        if not args and not kwargs and _required_forward_arguments(model) > 0:
            raise TypeError("blade.optimize: example inputs are needed: a tensor, a tuple of "
                            "forward's inputs or a dict of them by argument name")
        progress.stage("tracing" if config.allow_tracing else "scripting")
        models.hash_ahead(model)
        with each_method_parsed_once():
            scripted = to_torchscript(model, args, kwargs, config)
    with eval_mode(scripted):
        inputs = bind_inputs(scripted, args, kwargs)
        config = dynamic_dims_by_position(scripted, config)
        found = models.look_up(scripted, inputs, config)
        if found is not None:
            progress.stage("taken whole from the model cache")
            if config.verbose:
                from blade.report import report as read_report
                print(str(read_report(found)))
            return found
        calibration = [bind_inputs(scripted, *split_example_inputs(c, None))
                       for c in config.calibration or [inputs]] \
            if config.precision == "int8" else []
        progress.stage("freezing")
        # Frozen from a copy whose rank checks and BatchNorm axes survive freezing
        # (passes/keep_rank_checks.h): a wrong-rank input gets eager's error or answer.
        module = torch.jit.freeze(
            torch.jit._recursive.wrap_cpp_module(_C.copy_keeping_rank_checks(scripted._c)),
            preserved_attrs=list(config.preserved_attributes))
        _C.remove_fold_barriers(module.graph)
    # The attributes freezing kept are those forward writes into (or asked to be kept); they
    # are the model's own tensors, which the runs below must leave as they were.
    with preserved_module_state(module):
        optimized = _compile_frozen(module, inputs, config, progress, calibration)
    models.keep(optimized)
    return optimized


def _compile_frozen(module, inputs: Tuple, config: Config, progress: Progress,
                    calibration: Sequence[Tuple] = ()):
    graph = module.graph
    # Freezing frees the methods the graph's call stacks point to; an op that raises
    # (probing dynamic dims, a fallback given bad input) would read them for its traceback.
    _C.detach_inlined_functions(graph)
    dump = Dumper.for_config(config.dump_dir)
    int8 = []

    def quantize_int8(decomposed_graph):
        # After the decompositions, which turn fused layers (nn.TransformerEncoderLayer's
        # fast path) into the linears quantized here.
        progress.stage("calibrating int8 ranges")
        int8.append(quantize(module, decomposed_graph, [private_copy(c) for c in calibration],
                             config.excluded_ops, config.float_layers))
    if config.dynamic:
        progress.stage("finding dynamic dims")
    groups, resized_inputs = _dynamic_groups(module, inputs, config)
    none_inputs = _none_inputs(graph, inputs)
    progress.stage("simplifying, recording types")
    decomposed, unspecialized, results = simplify(graph, module, inputs, config.excluded_ops,
                                                  dump, resized_inputs, config.dynamic,
                                                  none_inputs, quantize_int8
                                                  if config.precision == "int8" else None)
    if config.dynamic:
        _C.duplicate_shape_arithmetic(graph)
        dump.graph("duplicate_shape_arithmetic", graph)

    graph_inputs = list(graph.inputs())
    # Inputs the graph writes into (an in-place op on the caller's tensor).
    written = sorted({graph_inputs.index(n.inputsAt(0)) for n in graph.nodes()
                      if n.kind() == WRITE_BACK and n.inputsAt(0) in graph_inputs})
    report = Report(dry_run=config.dry_run, decomposed=decomposed,
                    dynamic_dims=[[f"input {p} ('{argument_name(graph_inputs[p + 1])}') dim {d}"
                                   for p, d in g.dims] for g in groups])
    if int8:
        report.int8 = int8[0].to_dict()
    verdicts = registry_verdicts(all_nodes(graph), config)
    for node, verdict in verdicts.items():
        if not is_tensor_op(node) or node.kind() == WRITE_BACK:
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
    clusters = form_clusters(graph, verdicts, config, report)
    del verdicts
    dump.graph("clustered", graph, always=True)

    _compile_clusters(module, graph, clusters, config, report, dump, progress, inputs,
                      results, resized=bool(resized_inputs))
    torch._C._jit_pass_dce(graph)
    if not config.dry_run:
        _account_for_ops_outside_engines(graph, report)
    report.edge_views = release_edge_views(graph)
    if int8:
        # The readers of quantized weights that no calibrated layer covers (branches the
        # example never took, the model for any input) read the int8 copies too.
        int8[0].uncalibrated = int8_readers(graph, int8[0].weights)[0]
        int8_readers(unspecialized, int8[0].weights)
        report.int8 = int8[0].to_dict()
    _guard(module, graph, unspecialized, none_inputs, config, report, written)
    if not config.dry_run:
        _read_weights_from_engines(module, graph, report)
        _remove_unread_attributes(module, graph, config.preserved_attributes)
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
