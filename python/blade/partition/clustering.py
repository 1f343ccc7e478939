"""Clusters of compilable nodes: the registry's verdict on every node, acyclic clusters of
the supported ones (csrc/passes/cluster), and a cluster that failed to compile dissolved
again, the node its error names refused and the rest clustered anew."""
import functools
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.config import Config
from blade.graph_queries import describe, is_tensor_op, schema_name
from blade.partition.node_types import type_key
from blade.partition.registry import REGISTRY, UNDECLARED_VIEWS, Refusal, Verdict, is_view
from blade.report import Report


def registry_verdicts(nodes: Sequence[torch._C.Node], config: Config,
              failed: Dict[torch._C.Node, str] = None) -> Dict[torch._C.Node, Verdict]:
    """The registry's verdict on each node (constants left out); the `failed` ones, nodes
    whose code failed to compile, are refused with the given reason."""
    verdicts = {}
    failed = failed or {}
    for node in nodes:
        if node.kind() == "prim::Constant":
            continue
        if node in failed:
            verdicts[node] = Verdict(None, Refusal.CONVERSION_FAILED, failed[node])
            continue
        verdicts[node] = REGISTRY.check(node, config.excluded_ops,
                                        static_shapes=not config.dynamic,
                                        kernel_calls=config.kernel_calls)
    # List plumbing joins a cluster only with its users, so it needs every user supported.
    for node in nodes:
        v = verdicts.get(node)
        if node.kind() == "prim::ListConstruct" and v is not None and v.supported:
            users = [u.user for u in node.output().uses()]
            if not users or not all(verdicts.get(u, Verdict(None)).supported for u in users):
                verdicts[node] = Verdict(None, Refusal.NOT_NEEDED, "list used outside compiled ops")
    return verdicts


def returned_input_views(graph: torch._C.Graph) -> List[torch._C.Node]:
    """The views of the graph's inputs that the graph returns as they are: each a view
    (blade.partition.registry.is_view) of a graph input or of such a view, its other
    tensor operands inputs or constants (`narrow`'s start), or an element taken from such
    a list of views (`tensor_split(x, 3)[0]`); their results go only to the graph's
    return (directly, or through a tuple or list it returns) or to such views. Eager
    returns them as aliases of the caller's tensors, and so must the optimized model:
    they are metadata only, nothing computes them, and no engine is made for them (an
    engine returns fresh tensors; see csrc/passes/cluster for views of its results)."""
    inputs = set(graph.inputs())
    returned = set(graph.return_node().inputs())
    nodes = list(graph.block().nodes())
    aliased = set(inputs)  # values that are inputs or views of them
    candidates = set()
    for node in nodes:
        if _views_an_aliased_value(node, aliased, inputs):
            candidates.add(node)
            aliased.update(node.outputs())

    def returned_only(value, kept) -> bool:
        for use in value.uses():
            user = use.user
            if user.kind() == "prim::Return" or user in kept:
                continue
            if user.kind() in ("prim::TupleConstruct", "prim::ListConstruct") and \
                    user.output() in returned and \
                    all(u.user.kind() == "prim::Return" for u in user.output().uses()):
                continue
            return False
        return True

    kept = set()
    for node in reversed(nodes):  # users come after: one pass backwards decides each
        if node in candidates and all(returned_only(v, kept) for v in node.outputs()):
            kept.add(node)
    return [n for n in nodes if n in kept]


@functools.lru_cache(maxsize=None)
def _aliased_arguments(schema: str, undeclared_view: bool) -> Tuple[bool, ...]:
    """Which arguments the schema's result may alias, parsed once per schema. A view
    whose schema does not say so (_unsafe_view) views its first operand."""
    arguments = torch._C.parse_schema(schema).arguments
    return tuple(a.alias_info is not None or (i == 0 and undeclared_view)
                 for i, a in enumerate(arguments))


def _views_an_aliased_value(node: torch._C.Node, aliased, inputs) -> bool:
    """Whether `node` views a value of `aliased` (its aliased operand, by its schema), its
    other tensor operands being graph inputs or constants; or takes an element of such a
    list of views."""
    if node.kind() in ("aten::__getitem__", "prim::ListUnpack"):
        return node.inputsAt(0) in aliased and \
            isinstance(node.inputsAt(0).type(), torch._C.ListType)
    if not is_view(node) or node.schema() == "(no schema)":
        return False
    aliases = _aliased_arguments(node.schema(), node.kind() in UNDECLARED_VIEWS)
    viewed = [v for alias, v in zip(aliases, node.inputs()) if alias]
    others = [v for alias, v in zip(aliases, node.inputs()) if not alias and
              isinstance(v.type(), torch._C.TensorType)]
    return len(viewed) == 1 and viewed[0] in aliased and \
        all(v in inputs or v.node().kind() == "prim::Constant" for v in others)


# How many times the nodes of one cluster are clustered again after a failure named a node.
MAX_RECLUSTER_ROUNDS = 4


def _input_signature(node: torch._C.Node) -> Tuple:
    return tuple((type_key(v), repr(v.toIValue()) if v.node().kind() == "prim::Constant"
                  else None) for v in node.inputs())


def failed_nodes(moved: Sequence[torch._C.Node], size: int,
                  node_index: Optional[int]) -> List[torch._C.Node]:
    """The dissolved cluster's node that a compile error named, followed by the nodes of the
    same op on inputs of the same types and constants (which would fail alike); empty when
    the error names no compute node. `moved` holds the subgraph's `size` nodes in order,
    then the cluster's edge views."""
    if node_index is None or len(moved) < size or not 0 <= node_index < size:
        return []
    node = moved[node_index]
    if not is_tensor_op(node) or node.kind() == "prim::ListConstruct":
        return []
    twins = [n for n in moved if n is not node and schema_name(n) == schema_name(node) and
             _input_signature(n) == _input_signature(node)]
    return [node] + twins


def _size_arithmetic(node: torch._C.Node) -> bool:
    """Whether `node` computes a 0-d tensor from sizes: each tensor it reads is 0-d and a
    size made a tensor (prim::NumToTensor, as tracing records `x.shape[1]`), a constant,
    or such arithmetic itself, with at least one size among them."""
    sizes = []

    def from_sizes(value: torch._C.Value, depth: int = 0) -> bool:
        producer = value.node()
        if producer.kind() == "prim::NumToTensor":
            sizes.append(value)
            return True
        if producer.kind() == "prim::Constant":
            return True
        return depth < 8 and producer.kind().startswith("aten::") and \
            _is_zero_d(producer.outputs()) and all(
                from_sizes(v, depth + 1) for v in producer.inputs()
                if isinstance(v.type(), torch._C.TensorType))

    tensors = [v for v in node.inputs() if isinstance(v.type(), torch._C.TensorType)]
    return bool(tensors) and _is_zero_d(node.outputs()) and _is_zero_d(tensors) and \
        all(from_sizes(v) for v in tensors) and bool(sizes)


def _is_zero_d(values) -> bool:
    return all(v.type().dim() == 0 for v in values if isinstance(v.type(), torch._C.TensorType))


def form_clusters(graph, verdicts: Dict[torch._C.Node, Verdict], config: Config,
             report: Report) -> List:
    """Clusters the supported nodes of `verdicts`; the ops of clusters dissolved again (too
    small, non-tensor boundary) are reported. The caller's node handles are invalid after
    this: clustering moves nodes into subgraphs."""
    supported = [n for n, v in verdicts.items() if v.supported]
    # Size arithmetic on 0-d tensors (a traced model's `seq_length + 1`, its length read with
    # `size()`) is not an engine's work: a call costs more than it, compiling one seconds.
    compute = [n for n in supported if verdicts[n].converter.compute and not _size_arithmetic(n)]
    # Why an op would be only a kernel call (blade.partition.kernel_calls), by overload.
    kernel_calls = {schema_name(n): v.reason for n, v in verdicts.items()
                    if v.supported and v.converter.kernel_call}
    clusters, dissolved = _C.cluster_supported_nodes(graph, supported, compute,
                                                     config.min_cluster_size)
    for d in dissolved:
        for op in d.node_kinds:  # overloads, like the registry's verdicts
            why = f"supported, but not compiled: {d.reason}"
            if op in kernel_calls:
                why += (f"; it would only be a call of PyTorch's own kernel "
                        f"({kernel_calls[op]})")
            report.add_unsupported(op, why)
    return clusters


def dissolve_failed(cluster, error: Exception, message: str, ops: Dict[str, int],
                     config: Config, report: Report,
                     may_retry: bool) -> Dict[torch._C.Node, Verdict]:
    """Puts a cluster that failed to compile back into TorchScript and reports why. When
    `may_retry` and the error names its node, returns the verdicts to cluster the other
    nodes again with (that node and its twins refused); else only reports the ops."""
    size = len(list(cluster.g("Subgraph").nodes()))
    moved = _C.dissolve_cluster(cluster)
    summary = getattr(error, "summary", None) or (str(error).splitlines() or [""])[0]
    reason = f"conversion failed: {summary}"
    failed = failed_nodes(moved, size, getattr(error, "node_index", None)) if may_retry \
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
    return registry_verdicts(moved, config, {n: reason for n in failed})


# Set by csrc/passes/cluster on a view made again after its cluster's engine call (an edge
# view) and on the cluster node: its id, and the ops of edge views no longer inside it.
EDGE_VIEW_OF = "blade_edge_view_of"
EDGE_OPS = "blade_edge_ops"


def is_edge_view(node: torch._C.Node) -> bool:
    """Whether `node` is a view made after an engine call on the engine's results or
    inputs, so that they alias as in eager (its op counts as the engine's)."""
    return node.hasAttribute(EDGE_VIEW_OF)


def edge_ops(cluster: torch._C.Node) -> List[str]:
    """The ops, by overload, of the cluster's edge views that no longer run inside it."""
    return list(cluster.ss(EDGE_OPS)) if cluster.hasAttribute(EDGE_OPS) else []


def release_edge_views(graph: torch._C.Graph) -> int:
    """Removes the edge views' markers once the engines are made (a dissolved cluster's
    views lost theirs then); returns how many views run at engines' edges."""
    count = 0
    pending = [graph.block()]
    while pending:
        for node in pending.pop().nodes():
            pending.extend(node.blocks())
            if is_edge_view(node):
                node.removeAttribute(EDGE_VIEW_OF)
                count += 1
    return count
