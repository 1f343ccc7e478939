"""Blade as a torch.compile backend: `torch.compile(model, backend="blade")`.

Dynamo captures the model's Python into FX graphs, guards them and splits them at graph
breaks; each graph it hands over is traced into TorchScript here and compiled by
`blade.optimize`, with the same clustering, fallback and report as that door. Guards,
recompilation and graph breaks stay Dynamo's.

    compiled = torch.compile(model, backend="blade", options={"min_cluster_size": 2})
    with torch.no_grad():
        compiled(x)
    print(blade.dynamo_reports()[-1])

Dynamo passes a module's parameters and buffers as graph inputs (it inlines nn.Modules).
They are frozen into the traced graph, so that engines hold them as params (packed
weights, constant folding) as `blade.optimize` would, except the buffers the graph writes
in place (a step counter, a cache), which are passed on each call like the other inputs.
Each call checks (by identity and version counter) that the same tensors, unmodified, are
passed again; another set (another instance of the same module class, which shares
Dynamo's graph, or weights written in place) gets the graph compiled again for it, up to
MAX_STATE_VARIANTS sets, past which calls run the FX graph eagerly, counted in the
graph's `eager_calls`.

When a call comes with other sizes, Dynamo compiles the graph again with symbolic sizes
(unless `torch.compile(..., dynamic=False)`): that graph is compiled with
`Config(dynamic=True)`, and the sizes Dynamo passes as inputs of their own are read from
the tensors they measure, so one dynamic engine serves the sizes that follow.

This module imports neither the compiler nor torch-mlir nor torch._dynamo at import time:
`import blade` stays cheap (see `register`).
"""
import dataclasses
import importlib.abc
import importlib.machinery
import operator
import os
import re
import sys
import threading
import warnings
import weakref
from importlib.metadata import EntryPoint
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from blade.config import Config
from blade.isolation import private_copy
from blade.quiet import quiet_torchscript
from blade.report import report

BACKEND_NAME = "blade"
_REGISTRY_MODULE = "torch._dynamo.backends.registry"

_graphs_lock = threading.Lock()
_graphs: List["weakref.ref[DynamoGraph]"] = []
_graph_count = 0


class TraceError(RuntimeError):
    """torch.jit.trace refused the FX graph (non-tensor outputs, ...)."""


MAX_STATE_VARIANTS = 4   # sets of parameters one graph is compiled for; more run eagerly


class _Variant:
    """The graph compiled with one set of parameter and buffer tensors, as they were."""

    def __init__(self, state: Dict[int, torch.Tensor], module: torch.jit.ScriptModule):
        self.state = {i: weakref.ref(t) for i, t in state.items()}
        self.versions = {i: t._version for i, t in state.items()}
        self.module = module

    def same_tensors(self, args) -> bool:
        return all(ref() is args[i] for i, ref in self.state.items())

    def serves(self, args) -> bool:
        return all(ref() is args[i] and args[i]._version == self.versions[i]
                   for i, ref in self.state.items())


class DynamoGraph:
    """One FX graph Dynamo handed to the "blade" backend, as Dynamo calls it.

    Attributes:
        index: the order in which this process's graphs were compiled, from 0.
        modules: the optimized ScriptModules (what `blade.report` reads), one per set of
            parameters and buffers the graph was called with (another instance of the
            same module class shares Dynamo's graph; weights written in place make a new
            set); empty when the graph runs eagerly.
        eager_reason: why the graph runs eagerly (None when Blade compiled it).
        eager_calls: calls the FX graph ran eagerly although it compiles, because they
            came with more than MAX_STATE_VARIANTS sets of parameters.

    Example:
        >>> graph = blade.dynamo_graphs()[-1]
        >>> print(graph.report() if graph.modules else graph.eager_reason)
    """

    def __init__(self, index: int, graph_module: torch.fx.GraphModule, num_inputs: int = 0,
                 eager_reason: Optional[str] = None, config: Optional[Config] = None,
                 state_positions: Sequence[int] = (),
                 sizes: Optional[Dict[int, Tuple[int, int]]] = None):
        self.index = index
        self.graph_module = graph_module
        self.eager_reason = eager_reason
        self.eager_calls = 0
        self._config = config
        self._state_positions = list(state_positions)
        self._sizes = dict(sizes or {})
        self._runtime_positions = [i for i in range(num_inputs)
                                   if i not in self._state_positions and i not in self._sizes]
        self._variants: List[_Variant] = []
        self._lock = threading.Lock()

    @property
    def modules(self) -> List[torch.jit.ScriptModule]:
        return [v.module for v in self._variants]

    def report(self):
        """The `blade.Report` of the graph's first optimized module (read live)."""
        if not self._variants:
            raise ValueError(f"Dynamo graph {self.index} was not compiled by Blade: "
                             f"{self.eager_reason}")

        return report(self._variants[0].module)

    def compile(self, args) -> Optional[_Variant]:
        """Compiles the graph for the parameters and buffers in `args` (real tensors)."""
        state = {i: args[i] for i in self._state_positions}
        with self._lock:
            for variant in self._variants:
                if variant.serves(args):
                    return variant
            stale = [v for v in self._variants if v.same_tensors(args)]
            if not stale and len(self._variants) >= MAX_STATE_VARIANTS:
                return None
            variant = _Variant(state, _optimize_graph(self.graph_module, args, state,
                                                      self._sizes, self._config))
            # Weights written in place: the old variant serves nothing any more.
            self._variants = [v for v in self._variants if v not in stale] + [variant]
            return variant

    def __call__(self, *args):
        if self.eager_reason is not None:
            return self.graph_module(*args)
        # The newest variant first: it is the one serving in the common case.
        variant = next((v for v in reversed(self._variants) if v.serves(args)), None) or \
            self.compile(args)
        if variant is None:
            self.eager_calls += 1
            return self.graph_module(*args)
        return variant.module(*[args[i] for i in self._runtime_positions])

    @property
    def origin(self) -> str:
        """Where the graph starts in the user's code, `file.py:line in function`, from the
        stack Dynamo recorded for its first op ("" when it recorded none): graph breaks
        split a function into graphs that start at different lines."""
        for node in self.graph_module.graph.nodes:
            trace = node.meta.get("stack_trace") if node.op.startswith("call_") else None
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace or "")
            if frames:
                file, line, function = frames[-1]
                return f"{os.path.basename(file)}:{line} in {function}"
        return ""

    def __repr__(self):
        what = (f"eager: {self.eager_reason}" if self.eager_reason is not None else
                f"compiled by Blade for {len(self._variants)} set(s) of parameters")
        origin = f" from {self.origin}" if self.origin else ""
        return f"DynamoGraph({self.index}{origin}, {what})"


def dynamo_graphs() -> List[DynamoGraph]:
    """The graphs the "blade" torch.compile backend compiled in this process that Dynamo
    still holds (`torch._dynamo.reset()` drops them), in the order they were compiled.

    Example:
        >>> compiled = torch.compile(model, backend="blade")
        >>> with torch.no_grad():
        ...     compiled(x)
        >>> [len(g.modules) for g in blade.dynamo_graphs()]
        [1]
    """
    with _graphs_lock:
        live = [g for g in (ref() for ref in _graphs) if g is not None]
        _graphs[:] = [weakref.ref(g) for g in live]
    return live


def dynamo_reports():
    """The reports of the graphs Blade compiled through torch.compile (see
    `dynamo_graphs`), read live: engines' calls and fallbacks so far.

    Example:
        >>> assert all(r.runtime_fallbacks == 0 for r in blade.dynamo_reports())
    """

    return [report(module) for g in dynamo_graphs() for module in g.modules]


def config_from_options(options: Optional[Dict[str, Any]]) -> Config:
    """The Config that torch.compile's `options` name: each key a `blade.Config` field.

    Example:
        >>> config_from_options({"min_cluster_size": 2}).min_cluster_size
        2
    """
    if options is None:
        return Config()
    if not isinstance(options, dict):
        raise TypeError("torch.compile(backend=\"blade\", options=...): options must be a dict "
                        f"of blade.Config fields, got {type(options).__name__}")
    fields = sorted(f.name for f in dataclasses.fields(Config))
    unknown = sorted(name for name in options if name not in fields)
    if unknown:
        raise ValueError(
            "torch.compile(backend=\"blade\", options=...): "
            f"{', '.join(repr(n) for n in unknown)} {'is' if len(unknown) == 1 else 'are'} "
            f"not a blade.Config field; the fields are {', '.join(fields)}")
    return Config(**options)


def _placeholders(gm: torch.fx.GraphModule) -> List[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _is_module_state(node: Optional[torch.fx.Node], value) -> bool:
    """Whether the graph input is a parameter or buffer of an nn.Module Dynamo inlined."""
    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg") if node is not None else None
    if grapharg is None:
        return False
    # torch._dynamo loads only when Dynamo calls the backend.
    from torch._dynamo.source import is_from_unspecialized_param_buffer_source

    return is_from_unspecialized_param_buffer_source(grapharg.source)


# Ops whose result may share the memory of their first argument: a write into the result
# writes that argument.
_ALIASING = {"getitem", "view", "view_as", "reshape", "narrow", "select", "slice", "transpose",
             "permute", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten",
             "as_strided", "t", "detach", "contiguous", "diagonal", "unfold", "movedim",
             "split", "chunk", "unbind"}


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return name.split(".")[-1]


def _written_placeholders(gm: torch.fx.GraphModule) -> set:
    """The graph inputs an op of the graph writes in place, directly or through a view
    (`x.add_(1)`, `x[i] = v`, `torch.add(a, b, out=x)`). Follows views by name, so it may
    count a tensor computed from an input as a view of it: that only costs freezing."""
    def base(node):
        seen = set()
        while isinstance(node, torch.fx.Node) and node.op != "placeholder" and node not in seen:
            seen.add(node)
            if node.op not in ("call_method", "call_function") or not node.args or \
                    _target_name(node).rstrip("_") not in _ALIASING:
                return None
            node = node.args[0]
        return node if isinstance(node, torch.fx.Node) and node.op == "placeholder" else None

    written = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_method", "call_function"):
            continue
        name = _target_name(node)
        targets = []
        if node.target is operator.setitem or (name.endswith("_") and not name.endswith("__")):
            targets.append(node.args[0] if node.args else None)
        if "out" in node.kwargs:
            targets.append(node.kwargs["out"])
        for target in targets:
            root = target if isinstance(target, torch.fx.Node) and \
                target.op == "placeholder" else base(target)
            if root is not None:
                written.add(root)
    return written


def _real(node: Optional[torch.fx.Node], value):
    """A real tensor standing for a (possibly fake) example input."""
    # torch._dynamo loads only when Dynamo calls the backend.
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(value, FakeTensor):
        return value
    grapharg = node.meta.get("grapharg") if node is not None else None
    example = getattr(grapharg, "example", None) if grapharg is not None else None
    if isinstance(example, torch.Tensor) and not isinstance(example, FakeTensor):
        return example
    # Values only matter to data-dependent ops; zeros are valid indices too.
    real = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                               device=value.device)
    return real.zero_()


class _StateFrozen(torch.nn.Module):
    """The FX graph with its parameter and buffer inputs held as attributes, so that
    tracing and freezing make them constants, and its size inputs (Dynamo's SymInts)
    read from the tensors they measure; forward takes the other inputs."""

    def __init__(self, gm: torch.fx.GraphModule, num_inputs: int,
                 state: Dict[int, torch.Tensor], sizes: Dict[int, Tuple[int, int]]):
        super().__init__()
        self.gm = gm
        self.num_inputs = num_inputs
        self.state_positions = sorted(state)
        self.sizes = dict(sizes)
        self.runtime_positions = [i for i in range(num_inputs)
                                  if i not in state and i not in sizes]
        for i in self.state_positions:
            self.register_buffer(f"input_{i}", state[i].detach())

    def forward(self, *inputs):
        args = dict(zip(self.runtime_positions, inputs))
        for i in self.state_positions:
            args[i] = getattr(self, f"input_{i}")
        for i, (position, dim) in self.sizes.items():
            args[i] = args[position].size(dim)
        return self.gm(*[args[i] for i in range(self.num_inputs)])


def _record(gm, **kwargs) -> DynamoGraph:
    global _graph_count
    with _graphs_lock:
        graph = DynamoGraph(_graph_count, gm, **kwargs)
        _graph_count += 1
        _graphs.append(weakref.ref(graph))
    return graph


def _eager(gm, reason: str) -> DynamoGraph:
    warnings.warn(f"blade: a torch.compile graph runs eagerly: {reason}", stacklevel=3)
    return _record(gm, eager_reason=reason)


def _symbolic_dims(node: Optional[torch.fx.Node]) -> List[int]:
    """The dims Dynamo made dynamic in a tensor input (its fake value's symbolic sizes)."""
    value = node.meta.get("example_value") if node is not None else None
    if not isinstance(value, torch.Tensor):
        return []
    return [d for d, size in enumerate(value.shape) if isinstance(size, torch.SymInt)]


def _size_sources(nodes: Sequence[Optional[torch.fx.Node]], example_inputs: Sequence[Any]):
    """For each SymInt input, the (tensor input, dim) whose size it is; and the SymInt
    inputs that measure no tensor input (an int argument Dynamo made dynamic)."""
    # torch._dynamo loads only when Dynamo calls the backend.
    from torch._dynamo.source import TensorProperty, TensorPropertySource

    tensors = {}
    for i, node in enumerate(nodes):
        grapharg = node.meta.get("grapharg") if node is not None else None
        if grapharg is not None and isinstance(example_inputs[i], torch.Tensor):
            tensors[grapharg.source.name] = i
    sizes, unmatched = {}, []
    for i, (node, value) in enumerate(zip(nodes, example_inputs)):
        if not isinstance(value, torch.SymInt):
            continue
        grapharg = node.meta.get("grapharg") if node is not None else None
        source = grapharg.source if grapharg is not None else None
        if (isinstance(source, TensorPropertySource) and source.prop is TensorProperty.SIZE
                and source.base.name in tensors):
            sizes[i] = (tensors[source.base.name], source.idx)
        else:
            unmatched.append(i)
    return sizes, unmatched


_TENSOR_CONSTANT_WARNING = "torch.tensor results are registered as constants in the trace"


def _tensor_literals_only(gm: torch.fx.GraphModule) -> bool:
    """Whether every torch.tensor call of the FX graph (Dynamo writes torch._refs.tensor
    where a size goes in) is made of literals: no argument a node (a value the graph
    computes, which tracing would freeze)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "tensor":
            found = []
            torch.fx.node.map_arg((node.args, node.kwargs), found.append)
            if found:
                return False
    return True


def _optimize_graph(gm, inputs: Sequence[Any], state: Dict[int, torch.Tensor],
                    sizes: Dict[int, Tuple[int, int]], config: Config) -> torch.jit.ScriptModule:
    wrapper = _StateFrozen(gm, len(inputs), state, sizes).eval()
    # Dynamo's example inputs are the call's own tensors, and tracing and optimize run the
    # graph: copies keep the graph's in-place writes (a KV cache, its length counter) from
    # landing in the caller's tensors before the call itself runs.
    # Each run gets its own copies: the trace's writes must not reach optimize's inputs.
    def runtime_inputs():
        return private_copy(tuple(inputs[i] for i in wrapper.runtime_positions))

    try:
        with torch.no_grad(), quiet_torchscript(), warnings.catch_warnings():
            if _tensor_literals_only(gm):
                # Tracing warns that each torch.tensor(...) becomes a constant; in this graph
                # every one is made of literals, so it is one, and the warning is noise.
                warnings.filterwarnings("ignore", message=_TENSOR_CONSTANT_WARNING)
            traced = torch.jit.trace(wrapper, runtime_inputs(), check_trace=False)
    except (RuntimeError, TypeError, ValueError) as e:   # what torch.jit.trace raises
        raise TraceError(str(e)) from e
    # `import blade` registers this backend: it must not load the compiler.
    from blade.compiler import optimize
    from blade.frontend.dynamic_shapes import DynamicShapesWarning

    with warnings.catch_warnings():
        # The example is the call Dynamo compiles on, which the user does not choose: what
        # it cannot tell stays in the report, not a warning whose fix is another example.
        warnings.simplefilter("ignore", DynamicShapesWarning)
        return optimize(traced, runtime_inputs(), config)


def blade_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  options: Optional[Dict[str, Any]] = None, mode: Optional[str] = None):
    """The torch.compile backend "blade": traces Dynamo's FX graph into TorchScript and
    compiles it with `blade.optimize`; returns a `DynamoGraph`, which Dynamo calls with the
    graph's inputs. `options` are `blade.Config` fields.

    Example:
        >>> compiled = torch.compile(model, backend="blade", options={"dynamic": True})
    """
    if mode is not None:
        raise ValueError(f"torch.compile(backend=\"blade\", mode={mode!r}): Blade has no modes; "
                         "pass blade.Config fields as options={...} instead")
    config = config_from_options(options)
    nodes = _placeholders(gm)
    if len(nodes) != len(example_inputs):
        nodes = [None] * len(example_inputs)
    sizes, unmatched = _size_sources(nodes, example_inputs)
    if unmatched:
        return _eager(gm, f"inputs {unmatched} are sizes Dynamo made dynamic that measure no "
                      "tensor input; call torch.compile(..., dynamic=False)")
    not_tensors = [i for i, x in enumerate(example_inputs)
                   if not isinstance(x, torch.Tensor) and i not in sizes]
    if not_tensors:
        return _eager(gm, f"inputs {not_tensors} are not tensors")
    inputs = [x if i in sizes else _real(node, x)
              for i, (node, x) in enumerate(zip(nodes, example_inputs))]
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in inputs):
        # Dynamo guards grad mode, so this graph only serves calls with grad enabled.
        return _eager(gm, "an input requires grad under grad mode (Blade compiles for "
                      "inference: call the model under torch.no_grad() or "
                      "torch.inference_mode())")
    # A buffer the graph writes (a step counter, a cache) is passed on each call, not frozen.
    written = _written_placeholders(gm)
    state_positions = [i for i, (node, x) in enumerate(zip(nodes, inputs))
                       if i not in sizes and _is_module_state(node, x) and node not in written]
    runtime_positions = [i for i in range(len(inputs))
                         if i not in state_positions and i not in sizes]
    # After a call with other sizes Dynamo makes dims dynamic, all of an input's when its
    # rank changed too (a weight's size among them: Dynamo has not specialized it when it
    # hands the graph over), so Blade finds which of the graph's dims may vary itself.
    if any(_symbolic_dims(nodes[i]) for i in runtime_positions) and not config.dynamic:
        config = dataclasses.replace(config, dynamic=True)
    graph = _record(gm, num_inputs=len(inputs), config=config,
                    state_positions=state_positions, sizes=sizes)
    try:
        graph.compile(inputs)
    except TraceError as e:
        graph.eager_reason = f"TorchScript could not trace the graph: {e}"
        warnings.warn(f"blade: a torch.compile graph runs eagerly: {graph.eager_reason}",
                      stacklevel=2)
    return graph


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers the backend right after torch imports its backend registry, so that
    `import blade` need not import torch._dynamo (seconds) for users who never compile."""

    def find_spec(self, name, path, target=None):
        if name != _REGISTRY_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_with(module)

        spec.loader.exec_module = exec_then_register
        return spec


def _register_with(registry) -> None:

    if BACKEND_NAME in registry._COMPILER_FNS:
        return
    # Found through the entry point and being loaded by it: lookup_backend registers it.
    if isinstance(registry._BACKENDS.get(BACKEND_NAME), EntryPoint):
        return
    registry.register_backend(blade_backend, name=BACKEND_NAME)


def register() -> None:
    """Makes `torch.compile(backend="blade")` work in this process: now if torch's backend
    registry is loaded, else as soon as it is. `import blade` calls it.

    Example:
        >>> blade.torch_compile.register()
    """
    registry = sys.modules.get(_REGISTRY_MODULE)
    if registry is not None:
        _register_with(registry)
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
