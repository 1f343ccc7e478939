"""The TorchScript-level pipeline, in order: every pass from the scripted model to the
optimized module.

Before it, `blade.compiler.optimize` scripts (or traces) the model (frontend/scripting),
binds the example inputs and looks the model up in the model cache (blade.model_cache); a
hit ends there. Then, for one Config, `build` lists:

    freeze                      on a copy that keeps eager's rank checks (csrc/passes/
                                keep_rank_checks); the module's state is kept from here on
    detach_inlined_functions    call stacks that outlive freezing (csrc/passes)
    find_dynamic_dims           (Config.dynamic) the dims that vary, and resized inputs
    inline ... constant_propagation, from_dynamic_quantized, from_static_quantized
                                PyTorch's clean-up; quantize_dynamic's layers and eager
                                static quantization's linears as Blade's op
    keep_unspecialized          the graph for any input, before Blade's decompositions
    decompose                   Blade's decompositions (frontend/decompositions)
    quantized_tensor_pairs      aten quantized tensors read back at once, as integer math
    simplify_structure          in-place ops, view writes, containers, loops: to a fixed point
    specialize_none_inputs      optional inputs that are None in the example
    functionalize_input_writes  writes into the caller's tensors as values and write-backs
    quantize_int8               (precision="int8") calibrated int8 layers (frontend/quantize)
    materialize_types           every tensor's type, from a run on the example inputs
    check_in_place_casts, functionalize_small_writes, the typed rewrites, explicit_pool_windows
    simplify_shapes             with shapes known: sizes fold, splits become slices, ...
    functionalize_typed_view_writes
                                writes through slices with negative bounds, placed by types
    hand_on_uint8               (int8) int8 layers pass uint8 to the int8 layers reading them;
                                activations of float results in the layer; float inputs of
                                int8 layers rounded by graph ops
    duplicate_shape_arithmetic  (Config.dynamic) each use of a run-time size its own copy
    judge_ops                   the registry's verdict on every op; the report's counts
    cluster                     acyclic clusters of supported ops (partition/clustering)
    measure_int8_engines        (int8) each int8 cluster against its float twin, for the report
    compile_clusters            each cluster an engine, or TorchScript again (blade.engines)
    dce, account_for_ops_outside_engines, release_edge_views
    int8_readers                (int8) every reader of a quantized weight reads the int8 copy
    guard                       the input guard, and the unspecialized graph for other inputs
    read_weights_from_engines   a weight held once, by its engine
    remove_unread_attributes
    outline_branches            large branches as functions (fast loading)

`run` runs them on one GraphCompilation; with a dump directory (Config.dump_dir or
BLADE_DUMP_DIR) the graph after each pass is written to `graph/NN_<pass>.txt`. Each pass
has a unit test that names it (tests/passes, tests/frontend).
"""
import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten

from blade import _C
from blade.config import Config
from blade.dump import Dumper, Progress
from blade.engines import WRITE_BACK, compile_clusters
from blade.frontend import finishing, typed_rewrites
from blade.frontend.decompositions import decompose
from blade.frontend.dynamic_shapes import (DynamicShapesWarning, find_dynamic_groups,
                                           resized_variants, undecided_dims, untried_variants)
from blade.frontend.inputs import ExampleInputsError
from blade.frontend.int8_error import measure_engines
from blade.frontend.int8_handoffs import activate_float_results, hand_on_uint8, round_in_code
from blade.frontend.pools import POOLING_OVERLOADS, explicit_pool_windows
from blade.frontend.quant_fusion import quantized_tensor_pairs
from blade.frontend.quantize import (from_dynamic_quantized, from_static_quantized,
                                     int8_readers, quantize)
from blade.frontend.scripting import eval_mode
from blade.frontend.simplify import (SMALL_WRITE_ELEMENTS, fold_tensor_attributes,
                                     record_types, simplify_shapes, simplify_structure,
                                     specialize_none_inputs, static_write_bounds,
                                     still_decomposed)
from blade.graph_queries import all_nodes, argument_name, is_tensor_op, nodes_of, schema_name
from blade.isolation import preserved_module_state, private_copy
from blade.partition import converters  # noqa: F401  (importing it registers the built-ins)
from blade.partition.clustering import (form_clusters, registry_verdicts, release_edge_views,
                                       returned_input_views)
from blade.partition.registry import Refusal, Verdict
from blade.report import Report


@dataclass
class GraphCompilation:
    """What the passes work on and hand on. Given: the scripted model, its bound example
    inputs, the calibration inputs (int8), the config, progress and dumps. Made by passes:
    the frozen `module` (whose `graph` the passes rewrite), the dynamic dim groups and the
    resized inputs, the positions of inputs that are None, the unspecialized graph, the
    decomposed ops, what the type run returned, the int8 layers, the inputs the graph
    writes into, the report, the verdicts and the clusters."""

    scripted: torch.jit.ScriptModule
    inputs: Tuple
    config: Config
    progress: Progress
    dump: Dumper
    calibration: Sequence[Tuple] = ()
    module: Optional[torch.jit.ScriptModule] = None
    groups: List = field(default_factory=list)
    resized_inputs: List[Tuple] = field(default_factory=list)
    # resized_variants as the probes check them, for when resized_inputs (untried) fail
    tried_variants: Optional[Callable[[], List[Tuple]]] = None
    none_inputs: List[int] = field(default_factory=list)
    unspecialized: Optional[torch._C.Graph] = None
    decomposed: Dict[str, int] = field(default_factory=dict)
    results: List = field(default_factory=list)
    int8: Any = None              # frontend.quantize.Int8Summary
    written: List[int] = field(default_factory=list)
    dynamic_notes: List[str] = field(default_factory=list)
    report: Optional[Report] = None
    verdicts: Dict = field(default_factory=dict)
    clusters: List = field(default_factory=list)

    @property
    def graph(self) -> torch._C.Graph:
        return self.module.graph


@dataclass(frozen=True)
class GraphPass:
    """One step: `run` rewrites the compilation's graph (or module) in place, or raises.
    `stage` is shown as progress when it starts; `then`, a context the rest of the pipeline
    runs in, entered once the pass is done."""

    name: str
    run: Callable[[GraphCompilation], Any]
    stage: str = ""
    then: Optional[Callable[[GraphCompilation], ContextManager]] = None


def build(config: Config) -> List[GraphPass]:
    """The passes for one Config, in order."""
    passes = [
        # The attributes freezing kept are those forward writes into (or asked to be
        # kept); they are the model's own tensors, which the runs below must leave as
        # they were.
        GraphPass("freeze", _freeze, stage="freezing",
                  then=lambda c: preserved_module_state(c.module)),
        # Freezing frees the methods the graph's call stacks point to; an op that raises
        # (probing dynamic dims, a fallback given bad input) would read them.
        GraphPass("detach_inlined_functions", lambda c: _C.detach_inlined_functions(c.graph)),
    ]
    if config.dynamic:
        passes.append(GraphPass("find_dynamic_dims", _find_dynamic_dims,
                                stage="finding dynamic dims"))
    passes += [
        GraphPass("inline", lambda c: torch._C._jit_pass_inline(c.graph),
                  stage="simplifying, recording types"),
        GraphPass("remove_dropout", lambda c: torch._C._jit_pass_remove_dropout(c.module._c)),
        GraphPass("fold_tensor_attributes", lambda c: fold_tensor_attributes(c.graph, c.module)),
        GraphPass("constant_propagation",
                  lambda c: torch._C._jit_pass_constant_propagation(c.graph)),
    ]
    if _C.has_int8_dot_product():
        # Layers quantize_dynamic made, before the model for any input is taken: both run
        # the same int8 op.
        passes.append(GraphPass("from_dynamic_quantized",
                                lambda c: from_dynamic_quantized(c.graph)))
        passes.append(GraphPass("from_static_quantized",
                                lambda c: from_static_quantized(c.graph)))
    passes += [
        # The model for any input is taken before Blade's decompositions, which are
        # written for the compiler, not for every input eager takes.
        GraphPass("keep_unspecialized", _keep_unspecialized),
        GraphPass("decompose", _decompose),
        GraphPass("quantized_tensor_pairs", lambda c: quantized_tensor_pairs(c.graph)),
        GraphPass("simplify_structure", lambda c: simplify_structure(c.graph)),
        GraphPass("specialize_none_inputs",
                  lambda c: specialize_none_inputs(c.graph, c.none_inputs)),
        # Before the types are recorded: the new ops get theirs.
        GraphPass("functionalize_input_writes",
                  lambda c: _C.functionalize_input_writes(c.graph)),
    ]
    if config.precision == "int8":
        # After the decompositions, which turn fused layers (nn.TransformerEncoderLayer's
        # fast path) into the linears quantized here.
        passes.append(GraphPass("quantize_int8", _quantize_int8,
                                stage="calibrating int8 ranges"))
    passes += [
        GraphPass("materialize_types", _materialize_types),
        GraphPass("check_in_place_casts", lambda c: _C.check_in_place_casts(c.graph)),
        GraphPass("functionalize_small_writes",
                  lambda c: _C.functionalize_input_writes(c.graph, SMALL_WRITE_ELEMENTS)),
    ]
    passes += [GraphPass(rewrite.__name__, lambda c, rewrite=rewrite: rewrite(c.graph))
               for rewrite in typed_rewrites.REWRITES]
    passes += [
        GraphPass("explicit_pool_windows", lambda c: explicit_pool_windows(
            c.graph, nodes_of(c.graph, POOLING_OVERLOADS))),
        GraphPass("simplify_shapes", _simplify_shapes),
        GraphPass("functionalize_typed_view_writes", _functionalize_typed_view_writes),
    ]
    if config.precision == "int8":
        # Once the rank checks of folded batch norms, which read the layers' results, fold.
        passes.append(GraphPass("hand_on_uint8", _hand_on_uint8))
    if config.dynamic:
        passes.append(GraphPass("duplicate_shape_arithmetic",
                                lambda c: _C.duplicate_shape_arithmetic(c.graph)))
    passes += [
        GraphPass("judge_ops", _judge_ops),
        GraphPass("cluster", _cluster, stage="clustering"),
    ]
    if config.precision == "int8" and not config.dry_run:
        passes.append(GraphPass("measure_int8_engines", _measure_int8_engines,
                                stage="measuring int8 engines"))
    passes += [
        GraphPass("compile_clusters", _compile_clusters),
        GraphPass("dce", lambda c: torch._C._jit_pass_dce(c.graph)),
    ]
    if not config.dry_run:
        passes.append(GraphPass("account_for_ops_outside_engines", lambda c: finishing
                                .account_for_ops_outside_engines(c.graph, c.report)))
    passes.append(GraphPass("release_edge_views", _release_edge_views))
    if config.precision == "int8":
        passes.append(GraphPass("int8_readers", _int8_readers))
    passes.append(GraphPass("guard", lambda c: finishing.guard(
        c.module, c.graph, c.unspecialized, c.none_inputs, c.config, c.report, c.written)))
    if not config.dry_run:
        passes += [
            GraphPass("read_weights_from_engines", lambda c: finishing
                      .read_weights_from_engines(c.module, c.graph, c.report)),
            GraphPass("remove_unread_attributes", lambda c: finishing.remove_unread_attributes(
                c.module, c.graph, c.config.preserved_attributes)),
        ]
    # Loading the saved model compiles its code again, at a cost quadratic in the code of
    # large branches (csrc/passes/outline_branches.h); as functions they cost what they hold.
    passes.append(GraphPass("outline_branches", lambda c: _C.outline_branches(
        c.graph, finishing.OUTLINED_BRANCH_MIN_NODES)))
    return passes


def run(c: GraphCompilation, passes: Sequence[GraphPass]) -> torch.jit.ScriptModule:
    """Runs `passes` in order on `c`; returns the optimized module."""
    with contextlib.ExitStack() as held:
        for index, step in enumerate(passes):
            if step.stage:
                c.progress.stage(step.stage)
            step.run(c)
            if c.module is not None:
                c.dump.graph_pass(index, step.name, c.graph)
            if step.then is not None:
                held.enter_context(step.then(c))
    return c.module


def _freeze(c: GraphCompilation) -> None:
    # Frozen from a copy whose rank checks and BatchNorm axes survive freezing
    # (csrc/passes/keep_rank_checks.h): a wrong-rank input gets eager's error or answer.
    with eval_mode(c.scripted):
        c.module = torch.jit.freeze(
            torch.jit._recursive.wrap_cpp_module(_C.copy_keeping_rank_checks(c.scripted._c)),
            preserved_attrs=list(c.config.preserved_attributes))
    _C.remove_fold_barriers(c.module.graph)
    c.none_inputs = finishing.none_inputs(c.graph, c.inputs)


def _find_dynamic_dims(c: GraphCompilation) -> None:
    """The groups of input dims that vary (frontend/dynamic_shapes) and copies of the
    example inputs resized along all of them, for materialize_types."""
    # A function of its own over a copy of the graph: running the module itself would
    # make TorchScript cache an execution plan of the graph the passes are about to rewrite.
    probe = torch._C._create_function_from_graph("blade_probe_shapes", c.graph.copy())
    # Probes resize the example inputs, so sizes alone tell two probes apart: each is run
    # once, and a repeat gives its first answer (the error again, if it failed).
    answers: Dict[Tuple, Optional[Exception]] = {}

    def run_probe(xs):
        key = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in xs)
        if key not in answers:
            try:
                with torch.no_grad():
                    probe(c.module._c, *private_copy(xs))
                answers[key] = None
            except Exception as e:  # the probe's callers judge any error
                answers[key] = e
        if answers[key] is not None:
            raise answers[key]

    c.groups = find_dynamic_groups(run_probe, c.inputs, c.config.dynamic_dims)
    if c.groups:
        c.resized_inputs = untried_variants(c.inputs, c.groups)
        c.tried_variants = lambda: resized_variants(run_probe, c.inputs, c.groups)
    c.dynamic_notes = [_undecided_note(c, u) for u in
                       undecided_dims(run_probe, c.inputs, c.groups, c.config.dynamic_dims)]
    for note in c.dynamic_notes:
        warnings.warn(f"blade.optimize: Config(dynamic=True): {note}", DynamicShapesWarning,
                      stacklevel=2)


def _dim_name(graph: torch._C.Graph, position: int, dim: int) -> str:
    """`input 0 ('ids') dim 1`: dim `dim` of the model's input `position`."""
    return f"input {position} ('{argument_name(list(graph.inputs())[position + 1])}') dim {dim}"


def _undecided_note(c: GraphCompilation, undecided) -> str:
    """What the example inputs could not tell, what the engine does for it, and the fix."""
    names = [_dim_name(c.graph, p, d) for p, d in undecided.dims]
    listed = " and ".join(names)
    if undecided.kind == "size one":
        return (f"{listed} {'has' if len(names) == 1 else 'have'} size 1 in the example, so "
                f"{'it stays' if len(names) == 1 else 'they stay'} static (a size-1 dim may "
                "be a broadcast), though the model also runs at size 2: calls with another "
                "size run TorchScript. If it varies, give an example where it is larger, or "
                "name it in Config.dynamic_dims")
    return (f"{listed} are equal in the example, so they share one size symbol, though the "
            "model also runs with them apart: calls where they differ run TorchScript. If "
            "they vary apart, give an example where they differ")


def _keep_unspecialized(c: GraphCompilation) -> None:
    c.unspecialized = c.graph.copy()


def _decompose(c: GraphCompilation) -> None:
    c.decomposed = decompose(c.graph, c.config.excluded_ops, c.config.dynamic)


def _quantize_int8(c: GraphCompilation) -> None:
    c.int8 = quantize(c.module, c.graph, [private_copy(x) for x in c.calibration],
                      c.config.excluded_ops, c.config.float_layers)


def _materialize_types(c: GraphCompilation) -> None:
    try:
        c.results = record_types(c.graph, c.module, c.inputs, c.resized_inputs)
    except ExampleInputsError:
        if c.tried_variants is None:
            raise
        # A variant the probes did not run (frontend/dynamic_shapes.untried_variants) may be
        # one the model refuses: the variants it takes, and the types again (recorded only
        # when every run succeeds, so nothing of the failed one stays).
        c.resized_inputs = c.tried_variants()
        c.results = record_types(c.graph, c.module, c.inputs, c.resized_inputs)
    c.tried_variants = None


def _functionalize_typed_view_writes(c: GraphCompilation) -> int:
    """Writes through slices with negative bounds, functionalized once the types place the
    bounds; the new nodes' types are recorded again (a run on the example inputs, only
    when a write was rewritten). Returns how many writes were rewritten."""
    if not static_write_bounds(c.graph):
        return 0
    rewritten = _C.functionalize_view_writes(c.graph)
    if rewritten:
        torch._C._jit_pass_dce(c.graph)
        c.results = record_types(c.graph, c.module, c.inputs, c.resized_inputs)
    return rewritten


def _hand_on_uint8(c: GraphCompilation) -> None:
    """int8 layers that hand uint8 on, apply the activation of their float results, and
    whose inputs graph ops round (frontend/int8_handoffs); the new types (uint8 bytes, NHWC
    for convolutions) recorded by a run on the example inputs."""
    c.int8.chained = hand_on_uint8(c.graph)
    activated = activate_float_results(c.graph)
    c.int8.rounded_in_code = round_in_code(c.graph)
    if c.int8.chained or activated or c.int8.rounded_in_code:
        torch._C._jit_pass_dce(c.graph)
        c.results = record_types(c.graph, c.module, c.inputs, c.resized_inputs)
    if (c.int8.chained or c.int8.residual_adds) and not c.config.dynamic and \
            all(_same_shapes(x, c.inputs) for x in c.calibration):
        # The report's agreement with every rounding to uint8 in place; the graph is now
        # specialized to the example's shapes, so only where the calibration has them.
        c.int8.measure_agreement(c.module, c.graph, [private_copy(x) for x in c.calibration])


def _same_shapes(a: Tuple, b: Tuple) -> bool:
    """Whether two inputs have one structure, with tensors of the same shapes and dtypes
    and equal other values at the same places."""
    (xs, a_spec), (ys, b_spec) = tree_flatten(a), tree_flatten(b)

    def alike(x, y) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.shape == y.shape and x.dtype == y.dtype
        return not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor) and x == y

    return a_spec == b_spec and all(alike(x, y) for x, y in zip(xs, ys))


def _simplify_shapes(c: GraphCompilation) -> None:
    simplify_shapes(c.graph)
    # A decomposition that applies to some arguments only keeps the op in its other
    # branch: the report counts only the nodes really decomposed.
    c.decomposed = still_decomposed(c.decomposed, c.graph)


def _judge_ops(c: GraphCompilation) -> None:
    """The registry's verdict on every node, and the report they start: tensor ops counted,
    the unsupported and the unreached listed. Also the inputs the graph writes into (an
    in-place op on the caller's tensor), before engines take over the writes."""
    graph_inputs = list(c.graph.inputs())
    c.written = sorted({graph_inputs.index(n.inputsAt(0)) for n in c.graph.nodes()
                        if n.kind() == WRITE_BACK and n.inputsAt(0) in graph_inputs})
    c.report = Report(dry_run=c.config.dry_run, decomposed=c.decomposed, dynamic_dims=[
        [_dim_name(c.graph, p, d) for p, d in g.dims] for g in c.groups],
        dynamic_notes=list(c.dynamic_notes))
    if c.int8 is not None:
        c.report.int8 = c.int8.to_dict()
    c.verdicts = registry_verdicts(all_nodes(c.graph), c.config)
    # Metadata on the caller's tensors, returned as eager returns them: not an op for an
    # engine, so neither clustered nor counted in total_ops (the report counts them apart).
    for node in returned_input_views(c.graph):
        c.verdicts[node] = Verdict(None, Refusal.NOT_NEEDED, "a view of an input, returned")
        c.report.input_views += is_tensor_op(node)  # as total_ops counts (not lists)
    for node, verdict in c.verdicts.items():
        if not is_tensor_op(node) or node.kind() == WRITE_BACK or \
                verdict.category == Refusal.NOT_NEEDED:
            continue
        if verdict.category == Refusal.NOT_MATERIALIZED:
            # Never ran on the example inputs (an untaken branch): listed, but not counted
            # in the coverage of what the example inputs run.
            c.report.add_unreached(schema_name(node), verdict.reason)
            continue
        c.report.total_ops += 1
        if not verdict.supported:
            c.report.add_unsupported(schema_name(node), verdict.reason)


def _cluster(c: GraphCompilation) -> None:
    c.clusters = form_clusters(c.graph, c.verdicts, c.config, c.report)
    c.verdicts = {}  # their node handles die with the clustering


def _measure_int8_engines(c: GraphCompilation) -> None:
    """Each int8 cluster's error against its float twin on the calibration inputs
    (frontend/int8_error), by the name its engine will have."""
    if c.int8 is None:
        return
    originals = {w.values.data_ptr(): w.original for w in c.int8.weights.values()
                 if w.original is not None}
    c.int8.engines = measure_engines(c.module, c.graph, c.clusters,
                                     [private_copy(x) for x in c.calibration], originals)


def _compile_clusters(c: GraphCompilation) -> None:
    compile_clusters(c.module, c.graph, c.clusters, c.config, c.report, c.dump, c.progress,
                     c.inputs, c.results, resized=bool(c.resized_inputs))
    c.clusters = []


def _release_edge_views(c: GraphCompilation) -> None:
    c.report.edge_views = release_edge_views(c.graph)


def _int8_readers(c: GraphCompilation) -> None:
    # The readers of quantized weights that no calibrated layer covers (branches the
    # example never took, the model for any input) read the int8 copies too.
    c.int8.uncalibrated = int8_readers(c.graph, c.int8.weights)[0]
    int8_readers(c.unspecialized, c.int8.weights)
    # The engines that compiled (a cluster that failed runs as TorchScript: no engine).
    compiled = {entry.name for entry in c.report.clusters if entry.compiled}
    c.int8.engines = {name: e for name, e in c.int8.engines.items() if name in compiled}
    c.report.int8 = c.int8.to_dict()
