"""Every engine proves itself before it replaces its cluster (`Config.check_engines`, on by
default), so that a wrong lowering becomes a fallback, never a wrong answer.

Each engine is compared on an example: its cluster's inputs and outputs when the graph ran
on copies of the example inputs. A cluster that takes the graph's inputs and gives its
results (a model compiled whole) has its example already: the run that recorded the types
(blade.frontend.simplify) returned those results (`examples_from_results`). For the other
clusters, before a round of clusters is compiled, the model's graph runs once more, every
cluster's nodes as TorchScript, with each cluster's inputs and outputs recorded
(`capture_cluster_examples`), up to the last cluster that is no repeat of an earlier one
(`repetition_key`; a repeat most likely compiles to code already checked, and is recorded
by a second run only if it does not). Each engine, once compiled and loaded, runs its code
on copies of its cluster's inputs (`Engine.run_code`), and its outputs must agree with the
recorded ones (`disagreement`): the same shape and dtype, NaN and +-inf at the same places, and the
finite values within the tolerance of their dtype, `|got - want| <= atol * scale + rtol *
|want|`, where `scale` is the largest finite `|want|` of that output (at least 1), since
rounding errors grow with the values summed; integers and bools exactly.

An engine that disagrees is not used. The node to blame is found by bisection
(`find_disagreeing_node`): prefixes of the cluster's nodes are compiled as engines of their
own and compared the same way; the node whose addition makes a prefix disagree is refused,
with the nodes of the same op on the same types, as a node that fails to compile is
(blade.partition.clustering), and the rest of the cluster is clustered, compiled and checked
again. A cluster whose nodes draw random numbers is compared by running its subgraph and then its
code from one saved state of the generator (`compare_engine`).
"""
import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from blade import _C
from blade.report import CodeOrigin
from blade.isolation import preserved_module_state, private_copy
from blade.graph_queries import may_be_written, ran

# dtype -> (rtol, atol relative to the output's scale)
TOLERANCES: Dict[torch.dtype, tuple] = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-3, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
# The float32 outputs of an engine that multiplies and convolves in bfloat16
# (Config.precision): bfloat16's rounding of each GEMM's operands and result, grown through
# the layers (ResNet-50's logits: see docs/user_guide.md). A wrong lowering is still far
# outside it.
BF16_ENGINE_TOLERANCE = (5e-2, 5e-2)
# The float32 outputs of an engine with int8 layers: it runs the same int8 kernel as its
# subgraph, but a float32 rounding difference before a layer can move an activation to the
# next uint8 step, which moves that layer's outputs by a step times the weights.
INT8_ENGINE_TOLERANCE = (5e-2, 5e-2)


class EngineCheckError(RuntimeError):
    """An engine's code disagreed with its cluster's TorchScript subgraph on the example
    run's inputs. `node_index` is the cluster node the bisection blamed (None when it could
    not tell); `summary` is one line for the report."""

    def __init__(self, message: str, node_index: Optional[int], summary: str):
        super().__init__(message)
        self.node_index = node_index
        self.summary = summary


@dataclass
class CheckTime:
    """Seconds spent checking engines in one optimize: the example run that records the
    clusters' inputs and outputs, the comparisons, and the bisections of engines that
    disagreed."""

    capture: float = 0.0
    compare: float = 0.0
    bisect: float = 0.0
    engines: int = 0  # engines compared
    # The engines that agreed. An engine whose code is byte-identical to one of theirs is
    # not run again (the check is of the code: their weights differ, not what the code
    # does); `sharing` counts those.
    agreed: set = field(default_factory=set)
    sharing: int = 0
    # Engines not run either: their code came from the compile cache, whose entry says
    # that it agreed in the optimize that compiled it (CodeCache.mark_checked).
    checked_before: int = 0
    # Engines the check could not run: the example run never reached their cluster (with
    # dynamic dims, a branch that only the resized inputs took).
    unreached: int = 0

    @property
    def total(self) -> float:
        return self.capture + self.compare + self.bisect


def draws_random_numbers(subgraph) -> bool:
    """Whether a cluster's nodes draw random numbers: its results differ from run to run,
    so the example run's cannot tell right from wrong (`compare_engine` runs the subgraph
    and the code from one state of the generator instead)."""
    def visit(block) -> bool:
        for node in block.nodes():
            if node.isNondeterministic() or any(visit(inner) for inner in node.blocks()):
                return True
        return False

    return visit(subgraph)


@dataclass
class Example:
    """A cluster's inputs the first time the example run reached it, and the outputs its
    TorchScript nodes gave them there."""

    inputs: List[torch.Tensor]
    outputs: List[torch.Tensor]


def examples_from_results(graph, clusters: Sequence, inputs: Sequence, results: Sequence,
                          through_branches: bool = True) -> Dict[torch._C.Node, Example]:
    """The examples of the clusters that the example run of the type recording already
    gives: a cluster whose inputs are all inputs of the graph and whose outputs are all
    results of the graph (or elements of a tuple or list it returns, or, with
    `through_branches`, what a branch of a `prim::If` that ran returns as the If's outputs,
    which are: nn.TransformerEncoderLayer returns its slow path's result from the branch
    that its fast path's test leaves to it; see `_path_to_result`), with nothing in the
    graph writing to any of them and none of its nodes drawing random numbers, ran on
    copies of the example inputs `inputs` and gave what the graph returned, `results`
    (blade.frontend.simplify). Which branch ran, the types tell when only the example
    inputs recorded them: not with the resized inputs of dynamic dims, which take branches
    of their own (then `through_branches` is False). The other clusters are left to the
    capture run. A cluster compiled whole is the common case: its check then costs no
    second TorchScript run of the model."""
    # Values by their unique number: the graph input's position, the tensor returned.
    position = {v.unique(): p for p, v in enumerate(list(graph.inputs())[1:])}
    graph_outputs = list(graph.outputs())
    if len(graph_outputs) != len(results) or len(position) != len(inputs):
        return {}
    returned = {}
    for value, result in zip(graph_outputs, results):
        returned[value.unique()] = result
        node = value.node()
        if node.kind() in ("prim::TupleConstruct", "prim::ListConstruct") and \
                isinstance(result, (tuple, list)) and len(result) == node.inputsSize():
            returned.update((v.unique(), r) for v, r in zip(node.inputs(), result))
    # Engines run in the graph's block; the return node only hands results to the caller.
    readers = ("prim::FunctionalGraph", "prim::Return")
    found = {}
    for cluster in clusters:
        ins, outs = list(cluster.inputs()), list(cluster.outputs())
        paths = [_path_to_result(v, returned, through_branches) for v in outs]
        if not all(v.unique() in position and
                   isinstance(inputs[position[v.unique()]], torch.Tensor) for v in ins) or \
                not all(p is not None and isinstance(returned[p[-1].unique()], torch.Tensor)
                        for p in paths) or \
                any(may_be_written(v, readers) for v in ins) or \
                any(may_be_written(v, readers) for p in paths for v in p) or \
                draws_random_numbers(cluster.g("Subgraph")):
            continue
        # Not copied: the comparisons run the engine on copies of their own.
        found[cluster] = Example([inputs[position[v.unique()]] for v in ins],
                                 [returned[p[-1].unique()] for p in paths])
    return found


def _path_to_result(value, returned: Dict[int, Any], through_branches: bool):
    """The values from `value` to the graph result it is: itself, or with
    `through_branches` the outputs of the `prim::If` nodes whose branch returns it (or the
    previous one) and ran, each the If's output at the position it is returned at; None
    when it is no result. The branch ran when it defines the value itself (the value was
    reached), or when the If's other branch did not run (`_did_not_run`): a value defined
    outside the If is returned by one branch and may not be by the other
    (nn.TransformerEncoderLayer returns its slow path's result, computed before, from one
    branch and its fast path's from the other). Only If nodes: a loop's block runs many
    times, and what it returns is not its last iteration's."""
    path = [value]
    while value.unique() not in returned:
        outer = None
        for use in value.uses() if through_branches else ():
            block = use.user.owningBlock() if use.user.kind() == "prim::Return" else None
            owner = block.owningNode() if block is not None else None
            if owner is not None and owner.kind() == "prim::If" and \
                    (value.node().owningBlock() == block or
                     all(_did_not_run(other.returnNode().inputsAt(use.offset), other)
                         for other in owner.blocks() if other != block)):
                outer = owner.outputsAt(use.offset)
                break
        if outer is None:
            return None
        value = outer
        path.append(value)
    return path


def _did_not_run(value, block) -> bool:
    """Whether the example run never ran `block`, as `value`, which it returns, tells: a
    tensor that a node of the block itself makes, a node that did not run (`ran`: the run
    recorded no tensor it made; a constant has its type). Had the block run, the If would
    have returned that tensor, and the graph's result it leads to is a tensor the run
    returned, so it was made and recorded. Anything else proves nothing."""
    return isinstance(value.type(), torch._C.TensorType) and \
        value.node().owningBlock() == block and not ran(value.node())


def capture_cluster_examples(module, graph, clusters: Sequence,
                             inputs: Sequence) -> Callable[[], List[Optional[Example]]]:
    """A function giving, per cluster, its inputs and outputs the first time the graph ran
    it on copies of `inputs` (the model's bound example inputs), or None when the run did
    not reach it.

    A copy of the graph runs once: each cluster's inputs are appended to a list of its own
    just before it and its outputs just after it, the clusters are inlined again (so their
    nodes run as TorchScript), and the lists are the copy's only output; the copy ends
    where the last of `clusters` has been recorded (the nodes after it are dropped). The
    copy is made here; the run, when the function is called, touches neither the graph
    (which may change meanwhile) nor, once it returns, the module's state: it may run on
    another thread while the clusters compile."""

    if not clusters:
        return lambda: []
    list_type = torch._C.ListType(torch._C.TensorType.get())
    first = next(iter(graph.nodes()))
    added, lists = [], []
    none = graph.create("prim::Constant")
    none.output().setType(torch._C.NoneType.get())
    none.insertBefore(first)

    def append(lst, value, after=None, before=None):
        # A copy: what the graph does after it (an in-place op) must not change the record.
        copy = graph.create("aten::clone", [value, none.output()])
        copy.output().setType(value.type())
        node = graph.create("aten::append", [lst.output(), copy.output()])
        node.output().setType(list_type)
        if after is not None:
            copy.insertAfter(after)
        else:
            copy.insertBefore(before)
        node.insertAfter(copy)
        added.extend((copy, node))
        return node

    # The graph's own node after which the last cluster's outputs are recorded.
    order = {node: k for k, node in enumerate(graph.nodes())}
    last = None
    for cluster in clusters:
        ins, outs = (graph.create("prim::ListConstruct") for _ in range(2))
        for lst in (ins, outs):
            lst.output().setType(list_type)
            lst.insertBefore(first)
            lists.append(lst)
        for value in cluster.inputs():
            append(ins, value, before=cluster)
        anchor = cluster
        for value in cluster.outputs():
            anchor = append(outs, value, after=anchor)
        top = cluster
        while top.owningBlock() != graph.block():
            top = top.owningBlock().owningNode()
        if last is None or order[last[0]] < order[top]:
            # A top-level cluster's record ends with its appends; a nested one's with the
            # node that holds it.
            last = (top, anchor if top == cluster else top)
    record = graph.create("prim::TupleConstruct", [lst.output() for lst in lists])
    record.output().setType(torch._C.TupleType([list_type] * len(lists)))
    record.insertAfter(last[1])
    graph.registerOutput(record.output())
    try:
        copy = graph.copy()
    finally:
        graph.eraseOutput(len(list(graph.outputs())) - 1)
        record.destroy()
        for node in reversed(added):
            node.destroy()
        for lst in lists:
            lst.destroy()
        none.destroy()
    while len(list(copy.outputs())) > 1:
        copy.eraseOutput(0)
    # The run stops after the last of `clusters`: the rest of the graph only made the
    # results, which are not wanted (nor its checks, which DCE would keep).
    record = next(copy.outputs()).node()
    for node in reversed(list(copy.nodes())):
        if node == record:
            break
        node.destroy()
    # Every cluster, in branches too, back to its nodes (dissolve_cluster's
    # unmergeSubgraph, in one C++ walk: node by node from Python is slow on large graphs).
    torch._C._jit_pass_inline_functional_graphs(copy)
    run = torch._C._create_function_from_graph("blade_capture_cluster_examples", copy)
    counts = [(len(list(c.inputs())), len(list(c.outputs()))) for c in clusters]
    arguments = private_copy(tuple(inputs))

    def examples() -> List[Optional[Example]]:
        # One plain interpreter run: the profiling executor's first run would record
        # shapes for optimizations that a single run never uses.
        with torch.no_grad(), torch.jit.optimized_execution(False), preserved_module_state(module):
            recorded = run(module._c, *arguments)
        found = []
        for i, (count_in, count_out) in enumerate(counts):
            ins, outs = recorded[2 * i], recorded[2 * i + 1]
            reached = len(ins) >= count_in and len(outs) >= count_out
            found.append(Example(list(ins[:count_in]), list(outs[:count_out]))
                         if reached else None)
        return found

    return examples


def repetition_key(cluster) -> str:
    """The cluster's subgraph as text of its own: values numbered in order, each node its
    kind, attributes and types, a tensor constant its dtype and sizes only (not its values,
    however few), no scopes or source locations. Equal for a model's repeated layers (the
    same nodes, types and constants but the weights), whose engines then most likely share
    their code (CheckTime.agreed)."""
    names: Dict = {}
    lines: List[str] = []

    def name(value) -> str:
        return names.setdefault(value.unique(), f"%{len(names)}")

    def attribute(node, key: str) -> str:
        kind = node.kindOf(key)
        value = getattr(node, kind)(key)
        if kind == "t" or isinstance(value, torch.Tensor):
            return f"{key}=<{value.dtype} {list(value.shape)}>"
        if kind == "ts":
            return f"{key}=[" + ", ".join(f"<{t.dtype} {list(t.shape)}>" for t in value) + "]"
        if kind in ("g", "gs"):  # a subgraph: printed by the same rules
            graphs = value if kind == "gs" else [value]
            return f"{key}=(" + "; ".join(print_block(g.block()) for g in graphs) + ")"
        return f"{key}={value!r}"

    def print_block(block) -> str:
        start = len(lines)
        params = ", ".join(f"{name(v)}: {v.type()}" for v in block.inputs())
        lines.append(f"block({params})")
        for node in block.nodes():
            attributes = ", ".join(attribute(node, k) for k in sorted(node.attributeNames()))
            outputs = ", ".join(f"{name(v)}: {v.type()}" for v in node.outputs())
            inputs = ", ".join(name(v) for v in node.inputs())
            lines.append(f"{outputs} = {node.kind()}[{attributes}]({inputs})")
            for inner in node.blocks():
                print_block(inner)
        lines.append("return " + ", ".join(name(v) for v in block.outputs()))
        return f"lines {start}-{len(lines)}"

    print_block(cluster.g("Subgraph").block())
    return "\n".join(lines)


def disagreement(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor],
                 precision: str = "float32") -> Optional[str]:
    """None when the outputs `got` of an engine of `precision` agree with TorchScript's
    `want` (see the module's docstring), else what differs, output by output."""
    problems = []
    for i, (g, w) in enumerate(zip(got, want)):
        what = _output_disagreement(g, w, precision)
        if what is not None:
            problems.append(f"output {i} ({str(w.dtype).replace('torch.', '')}"
                            f"{list(w.shape)}): {what}")
    if len(got) != len(want):
        problems.append(f"{len(got)} outputs where TorchScript gives {len(want)}")
    return "; ".join(problems) or None


def _output_disagreement(got: torch.Tensor, want: torch.Tensor,
                         precision: str) -> Optional[str]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} where TorchScript gives {want.dtype}" \
               f"{list(want.shape)}"
    if not (want.is_floating_point() or want.is_complex()):
        differing = int((got != want).sum())
        return f"{differing} of {want.numel()} values differ" if differing else None
    got, want = got.detach().reshape(-1), want.detach().reshape(-1)
    if want.is_complex():
        got, want = torch.view_as_real(got).reshape(-1), torch.view_as_real(want).reshape(-1)
    # Exact arithmetic on the tolerance is not needed: float32 holds the gap of any
    # narrower type; float64 keeps its own. In chunks, so that a large output costs no
    # more than a few chunk-sized temporaries.
    wide = torch.float64 if want.dtype == torch.float64 else torch.float32
    rtol, atol = TOLERANCES.get(want.dtype, (1e-3, 1e-4))
    if precision == "bf16" and want.dtype == torch.float32:
        rtol, atol = BF16_ENGINE_TOLERANCE
    elif precision == "int8" and want.dtype == torch.float32:
        rtol, atol = INT8_ENGINE_TOLERANCE

    def chunks():
        return ((g.to(wide), w.to(wide)) for g, w in zip(got.split(_CHUNK), want.split(_CHUNK)))

    def within(scale: float) -> bool:
        # One C++ pass per chunk, NaN and infinities required in the same places.
        return all(_C.count_outside_tolerance(g, w, rtol, atol * scale) == 0
                   for g, w in chunks())

    # The common case: within the tolerance at the smallest scale (1) implies within it
    # at the real one, the output's largest finite value.
    if within(1.0):
        return None
    scale = max([1.0] + [float(w.abs().nan_to_num_(0.0, 0.0, 0.0).max()) for _, w in chunks()])
    if within(scale):
        return None
    if any(not torch.equal(g.isnan(), w.isnan()) for g, w in chunks()):
        return "NaN in other places"
    if any(not torch.equal(g.isinf(), w.isinf()) or not torch.equal(g[g.isinf()], w[w.isinf()])
           for g, w in chunks()):
        return "+-inf in other places"
    worst = max(float((g - w).abs().nan_to_num_(0.0, 0.0, 0.0).max()) for g, w in chunks())
    return f"max abs diff {worst:.3g} (tolerance {atol:g} x {scale:.3g} + {rtol:g} x |value|)"


# Elements compared at a time.
_CHUNK = 1 << 22


def compare_engine(engine, inputs: Sequence[torch.Tensor],
                   want: Optional[Sequence[torch.Tensor]] = None) -> Optional[str]:
    """Runs `engine`'s code on copies of `inputs` and compares it with `want`, what the
    TorchScript nodes gave (by default its subgraph, run on other copies, and then the code
    from the same state of the random generator, so that nodes drawing random numbers draw
    the same ones in both); what differs, or None. An error of the code (a kernel's) is a
    disagreement too."""
    with torch.no_grad():
        if want is None:
            state = torch.get_rng_state()
            want = engine.run_subgraph([t.clone() for t in inputs])
            torch.set_rng_state(state)
        try:
            got = engine.run_code([t.clone() for t in inputs])
        except RuntimeError as e:
            return f"the compiled code failed: {str(e).splitlines()[0]}"
    return disagreement(got, want, engine.precision())


def prefix_graph(subgraph, length: int):
    """A copy of the cluster's subgraph with its first `length` nodes, whose outputs are the
    tensors those nodes make that the rest of the subgraph (or its outputs) reads; None when
    there are none."""
    prefix = subgraph.copy()
    nodes = list(prefix.nodes())
    kept, dropped = nodes[:length], nodes[length:]
    readers = set(dropped) | {prefix.return_node()}
    # Constants are no results: the rest would have them anyway.
    live = [v for node in kept if node.kind() != "prim::Constant" for v in node.outputs()
            if isinstance(v.type(), torch._C.TensorType) and
            any(use.user in readers for use in v.uses())]
    if not live:
        return None
    while len(list(prefix.outputs())) > 0:
        prefix.eraseOutput(0)
    for node in reversed(dropped):
        node.destroy()
    for value in live:
        prefix.registerOutput(value)
    torch._C._jit_pass_dce(prefix)
    return prefix


def find_disagreeing_node(subgraph, inputs: Sequence[torch.Tensor],
                          build_engine: Callable) -> int:
    """The index (in `subgraph.nodes()`) of the node whose compiled result first disagrees,
    given that the whole subgraph does: the shortest prefix of the nodes that disagrees
    when compiled alone (`build_engine` makes an engine of a subgraph, or raises) ends with
    it. A prefix that fails to compile counts as disagreeing."""
    count = len(list(subgraph.nodes()))
    agrees, disagrees = 0, count
    while disagrees - agrees > 1:
        middle = (agrees + disagrees) // 2
        prefix = prefix_graph(subgraph, middle)
        if prefix is None:
            agrees = middle
            continue
        try:
            engine = build_engine(prefix)
            ok = compare_engine(engine, inputs) is None
        except Exception:  # a prefix that does not compile: look before it
            ok = False
        if ok:
            agrees = middle
        else:
            disagrees = middle
    return disagrees - 1


class ClusterExamples:
    """The examples of one round of clusters: those the type run gave
    (`examples_from_results`), and a run of the graph recording the others
    (`capture_cluster_examples`) on a thread of its own while the clusters compile. A
    cluster that repeats an earlier one (`repetition_key`: the same nodes, constants and
    types, other weights) most likely compiles to code already checked: it is recorded
    only when its engine runs code not yet checked, by a second run (`deferred`), prepared
    now (the graph changes as engines replace clusters) and run on the caller's thread
    then, once. `unchecked` are the clusters whose code needs the check (not checked when
    it was cached); `through_branches`, see examples_from_results."""

    def __init__(self, module, graph, unchecked: Sequence, inputs: Sequence, results: Sequence,
                 through_branches: bool, check_time: CheckTime):
        start = time.perf_counter()
        self._time = check_time
        self.known = examples_from_results(graph, unchecked, inputs, results,
                                           through_branches=through_branches)
        kinds, self._captured, self._deferred = set(), [], []
        for cluster in unchecked:
            if cluster not in self.known:
                kind = repetition_key(cluster)
                (self._deferred if kind in kinds else self._captured).append(cluster)
                kinds.add(kind)
        self._run_deferred = capture_cluster_examples(module, graph, self._deferred, inputs) \
            if self._deferred else None
        self._deferred_error: List[Exception] = []
        self._by_cluster = dict(self.known)
        self._capture = self._checker = None
        if self._captured:
            run_example = capture_cluster_examples(module, graph, self._captured, inputs)
            self._checker = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="blade-check")
            self._capture = self._checker.submit(run_example)
        check_time.capture += time.perf_counter() - start

    def wait(self) -> None:
        """Waits for the recording run (what the compilations did not hide of it)."""
        if self._capture is None:
            return
        start = time.perf_counter()
        try:
            self._by_cluster.update(zip(self._captured, self._capture.result()))
        finally:
            self._checker.shutdown()
            self._capture = None
            self._time.capture += time.perf_counter() - start

    def of(self, cluster) -> Optional[Example]:
        """The cluster's example; None when the example run never reached it. Raises the
        deferred run's error for each of its clusters (none runs unchecked)."""
        if cluster in self._deferred and self._run_deferred is not None:
            start = time.perf_counter()
            recorded, self._run_deferred = self._run_deferred, None  # run once
            try:
                self._by_cluster.update(zip(self._deferred, recorded()))
            except Exception as e:
                self._deferred_error.append(e)
            finally:
                self._time.capture += time.perf_counter() - start
        if cluster in self._deferred and self._deferred_error:
            raise self._deferred_error[0]
        return self._by_cluster.get(cluster)


def check_engine(name: str, engine, origin, key: Optional[str], subgraph,
                 example_of: Callable[[], Optional[Example]], config, code_cache,
                 check_time: CheckTime, build_prefix: Callable) -> None:
    """The engine check's policy for one engine: code identical to an engine's that agreed
    is not run again; code the compile cache says was checked when it was cached neither;
    otherwise the engine runs on its cluster's example (`example_of`; none: the example run
    never reached the cluster, a branch only resized inputs took, counted as unreached),
    and an engine that disagrees raises EngineCheckError naming the node the bisection
    blames (`build_prefix` compiles a prefix of `subgraph`). `origin` is (CodeOrigin, the
    engine shared with); `key`, the code's compile cache key (None: none)."""
    if origin[0] == CodeOrigin.SHARED and origin[1] in check_time.agreed:
        check_time.sharing += 1
        return
    if not config.check_engines:
        return
    if code_cache.checked_before(key, config.precision):
        # Checked by the optimize that compiled it (its entry says so, signed), whether
        # this engine is its first user here or shares it with one that failed.
        check_time.checked_before += 1
        check_time.agreed.add(name)
        return
    example = example_of()
    if example is None:
        check_time.unreached += 1
        return
    start = time.perf_counter()
    random = draws_random_numbers(subgraph)
    problem = compare_engine(engine, example.inputs, None if random else example.outputs)
    check_time.compare += time.perf_counter() - start
    check_time.engines += 1
    if problem is not None:
        start = time.perf_counter()
        blamed = find_disagreeing_node(subgraph, example.inputs, build_prefix)
        check_time.bisect += time.perf_counter() - start
        raise EngineCheckError(
            f"the compiled code disagrees with TorchScript on the example inputs: {problem}",
            blamed, f"the compiled code disagrees with TorchScript ({problem})")
    check_time.agreed.add(name)
    if key is not None:
        code_cache.mark_checked(key, config.precision)
