"""Cluster compilation: each cluster of the graph becomes an engine, or goes back to
TorchScript.

A cluster's way, one `ClusterJob` each, in explicit phases:

    prepare  its subgraph is imported into the torch dialect; its compile cache key is known
    compile  its code is compiled (MLIR's passes here, LLVM's on the worker pool) or read from
             the compile cache, and its engine is made and loaded
    check    the engine runs on the cluster's example and must agree (blade.self_check)
    install  the engine becomes an attribute of the module and replaces the cluster

Clusters go through the phases in rounds: all are prepared, their examples are recorded
while the compilations begin, then each is finished in turn (the workers compile one
cluster's code while the next goes through MLIR). A failure in any phase dissolves the
cluster; when it names its node, the nodes of the clusters dissolved in the round are
clustered again without it, and the new clusters compiled in the next round.
"""
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade._runtime import RUNTIME_LIBRARY
from blade.codegen.cache import CodeCache
from blade.codegen.llvm import native
from blade.config import Config
from blade.dtypes import SCALAR_TYPE_NAMES, dtype_name
from blade.dump import Dumper, Progress
from blade.graph_queries import all_nodes, is_tensor_op, schema_name
from blade.importer import import_subgraph
from blade.partition.clustering import (MAX_RECLUSTER_ROUNDS, dissolve_failed, edge_ops,
                                        form_clusters)
from blade.partition.kernel_calls import BLADE_OPS
from blade.partition.registry import REGISTRY, Verdict
from blade.report import ClusterReport, CodeOrigin, Report
from blade.self_check import CheckTime, ClusterExamples, check_engine

ENGINE_PREFIX = "blade_engine_"
# csrc/passes/functionalize_input_writes.h
WRITE_BACK = "blade::write_back"
PREFIX_SUFFIX = "_prefix"  # of the engines a bisection compiles


def specs(*groups, unnamed_dtype: Optional[str] = None) -> List[List[str]]:
    """Per group of values, their specs, `float32[s0,128,768]`: a dynamic dim is named by
    its shape symbol (`s0`, `s1`, ... in order of appearance across all groups), so dims
    that must be equal share a name; see csrc/ral/tensor_spec.h. A dtype the runtime cannot
    name (complex64, ...) is written `unnamed_dtype` (the guard's stand-in); without one it
    is an error."""
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


def signatures(inputs, outputs) -> Tuple[str, str]:
    """The engine's input and output specs, one symbol naming across both."""
    specs_in, specs_out = specs(list(inputs), list(outputs))
    return ";".join(specs_in), ";".join(specs_out)


def engine_precision(subgraph, config: Config) -> str:
    """An engine's precision (Engine::precision): "int8" when it runs int8 layers, whatever
    made them (Config.precision="int8", or a model quantized before); otherwise
    Config.precision, "float32" for the float engines of an int8 model."""
    if config.precision != "bf16" and \
            any(n.kind() in BLADE_OPS for n in subgraph.nodes()):
        return "int8"
    return "float32" if config.precision == "int8" else config.precision


def op_counts(cluster) -> Dict[str, int]:
    """The cluster's ops by overload: its subgraph's and those of its edge views."""
    counts: Dict[str, int] = {}
    for node in all_nodes(cluster.g("Subgraph")):
        if is_tensor_op(node):
            counts[schema_name(node)] = counts.get(schema_name(node), 0) + 1
    for name in edge_ops(cluster):
        counts[name] = counts.get(name, 0) + 1
    return counts


@dataclass
class EngineBuild:
    """One engine's compilation, of a cluster's subgraph or of a prefix of it (the
    bisection's): what the import made and the engine needs. `key` is the compile cache key
    (None: compiled apart from the cache); `finish` is set when the compilation begins."""

    name: str
    input_specs: str
    output_specs: str
    precision: str
    params: List[torch.Tensor]
    fallback_ir: str
    imported: Any                 # importer.ImportedModule
    num_buffers: int
    returns_outputs: bool
    writes: Sequence[Tuple[int, int]]
    key: Optional[str]
    finish: Optional[Callable] = None  # -> codegen.driver.CompiledCluster
    shares_with: str = ""              # the engine of this model whose cached code it runs


@dataclass
class ClusterJob:
    """One cluster's way to an engine: its report entry (name, ops, signature), its dump,
    the inputs it writes (`writes`, absorbable_write_backs: (output, input) pairs), and
    its build once prepared."""

    cluster: Any  # the prim::FusionGroup node
    entry: ClusterReport
    ops: Dict[str, int]
    dump: Any     # dump.ClusterDump
    writes: List[Tuple[int, int]]
    start: float
    build: Optional[EngineBuild] = None


class EngineCompiler:
    """What every engine of one optimize is compiled with: the config, the CPU features the
    code is compiled for, the compile cache, the LLVM worker pool and the engine check's
    counters."""

    def __init__(self, module, config: Config, cpu_features: str, code_cache: CodeCache,
                 pool: native.CompilerPool, check_time: CheckTime):
        self.module = module
        self.config = config
        self.cpu_features = cpu_features
        self.code_cache = code_cache
        self.pool = pool
        self.check_time = check_time

    def prepare(self, subgraph, name: str, dump, boundary=None,
                writes: Sequence[Tuple[int, int]] = ()) -> EngineBuild:
        """Imports `subgraph` (changed: its constants become params). `boundary` is the
        (inputs, outputs) whose types the engine's signature names, the subgraph's own by
        default; `writes`, the engine's (output, input) pairs (Engine::writes)."""
        dump.write("0_torchscript.txt", str(subgraph))
        start = time.perf_counter()
        # Positions in the cluster, taken before constants are lifted out: the ops of node
        # k are located at codegen.errors.node_location(k), which a CodegenError reports.
        node_indices = {node: k for k, node in enumerate(subgraph.nodes())}
        inputs, outputs = boundary or (list(subgraph.inputs()), list(subgraph.outputs()))
        input_specs, output_specs = signatures(inputs, outputs)
        precision = engine_precision(subgraph, self.config)
        params = _C.lift_tensor_constants(subgraph)
        fallback_ir = _C.fallback_ir(subgraph)
        # Outputs of dynamic size are allocated and returned by the code, not passed to it.
        returns_outputs = any(s < 0 for v in outputs for s in v.type().symbolic_sizes())
        num_buffers = len(list(subgraph.inputs())) + \
            (0 if returns_outputs else len(list(subgraph.outputs())))
        imported = import_subgraph(subgraph, converter_for=self._converter_for, params=params,
                                   node_indices=node_indices)
        dump.seconds["import"] = time.perf_counter() - start
        # A user converter's StableHLO comes from Python the key cannot see, and a dump
        # wants every pass's IR: those clusters are always compiled.
        key = None
        if not imported.user_calls and not dump.enabled:
            key = self.code_cache.key(torch_ir=imported.text, num_buffers=num_buffers,
                                      returns_outputs=returns_outputs,
                                      parallel=self.config.parallel,
                                      cpu_features=self.cpu_features)
        return EngineBuild(name, input_specs, output_specs, precision, params, fallback_ir,
                           imported, num_buffers, returns_outputs, list(writes), key)

    def _converter_for(self, node):
        # The clusterer's verdicts died with the node handles; re-check only the ops that a
        # converter with its own lowering, or a kernel call, may take.
        if not REGISTRY.has_lowering(schema_name(node)) and not REGISTRY.may_call_kernel(node):
            return None
        return REGISTRY.check(node, self.config.excluded_ops,
                              static_shapes=not self.config.dynamic,
                              kernel_calls=self.config.kernel_calls).converter

    def begin(self, build: EngineBuild, dump) -> None:
        """Begins the compilation, or takes the code from the compile cache."""
        def compile_now():
            # The workers get ready while MLIR loads and its passes run.
            self.pool.expect(len(build.imported.text))
            # Imported here (MLIR is heavy): a model whose code is all in the compile cache
            # never loads MLIR.
            from blade.codegen import driver

            return driver.start_compiling(build.imported.text, build.num_buffers,
                                          returns_outputs=build.returns_outputs,
                                          user_calls=build.imported.user_calls, dump=dump,
                                          parallel_loops=self.config.parallel, pool=self.pool)

        if build.key is None:
            build.finish = compile_now()
            return
        # A bisection's prefix engine (self_check) is no engine of the model: the model's
        # first engine with this code is the one the others share it with.
        build.shares_with = self.code_cache.first_user.get(build.key, build.name)
        if not build.name.endswith(PREFIX_SUFFIX):
            self.code_cache.first_user.setdefault(build.key, build.name)
        build.finish = self.code_cache.start(build.key, compile_now)

    def finish(self, build: EngineBuild):
        """Waits for the code and loads the engine; returns the CompiledCluster, the Engine
        and where its code came from: (CodeOrigin, the engine it shares code with)."""
        compiled = build.finish()
        if build.key is None:
            code = torch.frombuffer(bytearray(compiled.library), dtype=torch.uint8)
            origin = (CodeOrigin.COMPILED, "")
        else:
            code = self.code_cache.code_tensor(build.key)
            origin = (self.code_cache.origin[build.key], "") \
                if build.shares_with == build.name else (CodeOrigin.SHARED, build.shares_with)
        engine = _C.create_signed_engine(
            build.name, code, build.input_specs, build.output_specs, build.fallback_ir,
            build.params, self.config.fallback, self.cpu_features, build.precision,
            self.config.signing_key or "", ";".join(f"{o}:{i}" for o, i in build.writes))
        if not engine.is_compiled():
            raise RuntimeError(f"the compiled code does not load: {engine.load_error()}")
        return compiled, engine, origin

    def compile_prefix(self, name: str, prefix):
        """An engine of a prefix of cluster `name`'s subgraph (self_check's bisection)."""
        dump = Dumper(None).cluster(name)
        build = self.prepare(prefix, name + PREFIX_SUFFIX, dump)
        self.begin(build, dump)
        return self.finish(build)[1]

    # The phases of one cluster.

    def prepare_job(self, job: ClusterJob) -> None:
        job.build = self.prepare(job.cluster.g("Subgraph").copy(), job.entry.name, job.dump,
                                 boundary=(list(job.cluster.inputs()),
                                           list(job.cluster.outputs())),
                                 writes=job.writes)

    def compile_and_check(self, job: ClusterJob, example_of: Callable):
        """Finishes the job's compilation, checks the engine and installs it; returns the
        CompiledCluster and the code's origin. Raises on any failure, leaving the graph
        untouched."""
        compiled, engine, origin = self.finish(job.build)
        check_engine(job.entry.name, engine, origin, job.build.key, job.cluster.g("Subgraph"),
                     example_of, self.config, self.code_cache, self.check_time,
                     lambda prefix: self.compile_prefix(job.entry.name, prefix))
        self.install(job, engine)
        return compiled, origin

    def install(self, job: ClusterJob, engine) -> None:
        self.module._c._register_attribute(job.entry.name, engine._type(), engine)
        _C.replace_cluster_with_engine(job.cluster, job.entry.name, job.writes)


def compile_clusters(module, graph, clusters: List, config: Config, report: Report, dump: Dumper,
                     progress: Progress, inputs: Tuple, results: List,
                     resized: bool = False) -> None:
    """Swaps each cluster for an engine, or dissolves it back into TorchScript when it fails
    (in rounds: see the module's docstring). `results` are what the graph returned in the
    run that recorded the types; `resized`, whether other runs (of resized inputs, for
    dynamic dims) recorded types too."""
    cpu_features = ""
    if clusters and not config.dry_run:
        cpu_features = native.host_cpu_features()
        # Every engine is signed (docs/security.md): a key that cannot sign fails here,
        # once, rather than every cluster alike.
        _C.signing_public_key(config.signing_key or "")
    code_cache = CodeCache.for_config(config)
    progress.begin(0 if config.dry_run else len(clusters), "compiling clusters")
    # LLVM's part of each compilation runs on worker processes too (codegen.llvm.native);
    # they start at the first cluster that is compiled and stop when all are done.
    with native.CompilerPool(native.default_workers(config.compile_workers),
                             str(RUNTIME_LIBRARY)) as pool:
        compiler = EngineCompiler(module, config, cpu_features, code_cache, pool, CheckTime())
        rounds = _Rounds(compiler, graph, report, dump, progress, inputs, results, resized)
        for number in range(MAX_RECLUSTER_ROUNDS + 1):
            clusters = rounds.run(clusters, may_retry=number < MAX_RECLUSTER_ROUNDS)
            if not clusters:
                break
    check_time = compiler.check_time
    report.checked_engines = check_time.engines
    report.engines_sharing_checked_code = check_time.sharing
    report.engines_checked_before = check_time.checked_before
    report.engines_not_reached_by_the_check = check_time.unreached
    report.check_seconds = round(check_time.total, 3)


class _Rounds:
    """The rounds of one optimize's cluster compilation (compile_clusters)."""

    def __init__(self, compiler: EngineCompiler, graph, report: Report, dump: Dumper,
                 progress: Progress, inputs: Tuple, results: List, resized: bool):
        self.compiler, self.config = compiler, compiler.config
        self.graph, self.report, self.dump, self.progress = graph, report, dump, progress
        self.inputs, self.results, self.resized = inputs, results, resized
        self.index = 0  # of the next engine's name

    def run(self, clusters: List, may_retry: bool) -> List:
        """One round; returns the clusters formed again from the nodes of those that failed
        with a node to blame."""
        self.retry: Dict[torch._C.Node, Verdict] = {}
        self.may_retry = may_retry
        # Writes of the clusters' results into the caller's tensors that the engines do
        # themselves (a cluster may gain an input for one: before its signature is taken
        # and its examples are recorded).
        writes = {c: [] if self.config.dry_run else _C.absorbable_write_backs(c)
                  for c in clusters}
        jobs = [self._job(c, writes[c]) for c in clusters]
        prepared = [job for job in jobs if job is not None and
                    self._try(job, self.compiler.prepare_job)]
        examples = None
        if self.config.check_engines and prepared:
            # Code that passed the check in the optimize that compiled it (its compile cache
            # entry says so) needs no example. A branch's nodes have types because the
            # example inputs ran it, unless resized inputs recorded types too.
            unchecked = [job.cluster for job in prepared if not self.compiler.code_cache
                         .checked_before(job.build.key, self.config.precision)]
            examples = ClusterExamples(self.compiler.module, self.graph, unchecked,
                                       self.inputs, self.results, not self.resized,
                                       self.compiler.check_time)
            self.report.examples_from_type_run += len(examples.known)
        begun = [job for job in prepared
                 if self._try(job, lambda j: self.compiler.begin(j.build, j.dump))]
        if examples is not None:
            examples.wait()
        for job in begun:
            example_of = (lambda c=job.cluster: examples.of(c)) if examples else lambda: None
            self._try(job, lambda j: self._finish(j, example_of), step_on_failure=False)
            self.progress.step(job.entry.name)
        if not self.retry:
            return []
        clusters = form_clusters(self.graph, self.retry, self.config, self.report)
        self.progress.total += len(clusters)
        return clusters

    def _job(self, cluster, writes: List[Tuple[int, int]]) -> Optional[ClusterJob]:
        ops = op_counts(cluster)
        input_specs, output_specs = signatures(cluster.inputs(), cluster.outputs())
        entry = ClusterReport(name=f"{ENGINE_PREFIX}{self.index}", ops=ops,
                              inputs=input_specs, outputs=output_specs)
        self.index += 1
        if self.config.dry_run:
            entry.compiled = False
            entry.status = "dry run: not compiled"
            self.report.clusters.append(entry)
            _C.dissolve_cluster(cluster)
            return None
        return ClusterJob(cluster, entry, ops, self.dump.cluster(entry.name), writes,
                          time.perf_counter())

    def _finish(self, job: ClusterJob, example_of: Callable) -> None:
        compiled, origin = self.compiler.compile_and_check(job, example_of)
        job.entry.code, job.entry.code_shared_with = origin
        job.entry.code_key = job.build.key or ""
        if job.writes:
            # The in-place ops' writes into the caller's tensors, done by the engine.
            job.ops[WRITE_BACK] = len(job.writes)
            self.report.total_ops += len(job.writes)
        job.entry.take(compiled.statistics)
        self.report.compiled_ops += sum(job.ops.values())
        self.report.clusters.append(job.entry)
        job.dump.finish({**job.dump.seconds, "total": time.perf_counter() - job.start})

    def _try(self, job: ClusterJob, phase: Callable[[ClusterJob], None],
             step_on_failure: bool = True) -> bool:
        """Runs one phase of the job; on any failure the cluster stays TorchScript."""
        try:
            phase(job)
            return True
        except Exception as error:
            message = f"{job.entry.name} ({', '.join(sorted(job.ops))}): " \
                f"{type(error).__name__}: {error}"
            job.dump.finish({**job.dump.seconds, "total": time.perf_counter() - job.start},
                            error=message)
            self.retry.update(dissolve_failed(job.cluster, error, message, job.ops,
                                              self.config, self.report,
                                              may_retry=self.may_retry))
            if step_on_failure:
                self.progress.step(job.entry.name)
            return False
