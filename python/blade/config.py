"""The one object that controls how Blade compiles a model."""
import dataclasses
import difflib
import functools
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import torch

FALLBACK_MODES = ("fallback", "error")
PRECISIONS = ("float32", "bf16", "int8")
# The string options with a fixed set of values (the command line lists them).
CHOICES = {"fallback": FALLBACK_MODES, "precision": PRECISIONS}


@dataclass
class Config:
    """Options of `blade.optimize`.

    Example:
        >>> cfg = Config(min_cluster_size=2, excluded_ops=["aten::softmax.int"])

    Attributes:
        allow_tracing: trace the model with the example inputs instead of scripting it.
        preserved_attributes: attributes and methods that freezing must keep on the module.
        min_cluster_size: clusters with fewer compute ops (constants, views and list
            plumbing do not count) stay in TorchScript.
        excluded_ops: op overloads (``"aten::add.Tensor"``) or op names (``"aten::add"``)
            that always stay in TorchScript.
        fallback: what an engine does with inputs it was not compiled for, or code it
            cannot load: ``"fallback"`` runs the cluster's TorchScript subgraph,
            ``"error"`` raises an error naming the engine and both signatures.
        verbose: print the report when optimization ends.
        dry_run: analyse and cluster but compile nothing; the returned module is the
            frozen model with the analysis attached, so `blade.report` works on it.
        dump_dir: write the graph after each simplification pass and, per cluster, its
            IR at every stage with timings (layout in `blade.dump`). The environment
            variable BLADE_DUMP_DIR does the same when this is not set.
        progress: show what optimize is doing on stderr, from the first second: the
            front-end stages, then each cluster as it compiles, with the time elapsed.
            ``None`` (the default) shows it when stderr is a terminal, and not under pytest.
        dynamic: compile engines that serve inputs of other sizes too. The dimensions
            that may vary are found by running the model on copies of the example inputs
            resized along each group of equally sized dimensions (size 1 excluded): those
            the model accepts become dynamic, the rest stay static.
        dynamic_dims: the dynamic dimensions named explicitly, per input position or
            forward's argument name: ``{0: [0, 1]}`` means dims 0 and 1 of input 0 vary,
            ``{"mask": [1]}`` dim 1 of the argument ``mask``. Implies ``dynamic``.
        parallel: run large loop nests of generated code on PyTorch's intra-op threads
            (``torch.set_num_threads`` applies); ``False`` keeps every loop serial.
        signing_key: path of the Ed25519 private key (PEM) that signs the engines' code;
            by default this machine's key, ``~/.config/blade/engine_signing_key.pem``
            (under ``$XDG_CONFIG_HOME`` when set), created on first use. Machines that load
            the model run its code only if they trust the key (docs/security.md).
        cache_dir: where compiled code is kept for later `optimize` calls, in any process
            (see `blade.codegen.cache`): ``None`` is the environment variable
            BLADE_CACHE_DIR, else ``~/.cache/blade/code`` (under ``$XDG_CACHE_HOME`` when
            set); ``"off"`` keeps nothing. Identical clusters of one model are compiled
            once either way.
        cache_max_bytes: the most bytes the cache directory holds; the least recently used
            entries go first.
        cache_models: keep whole optimized models in the cache directory too (see
            `blade.model_cache`): optimizing the same model (code, weights and all) on the
            same example inputs with the same Config again, in any process, then skips
            everything after scripting. Models that read what cannot be keyed, or
            registered converters of the user, are compiled as usual.
        compile_workers: processes that compile the clusters' native code (distinct
            clusters side by side, a large one in parts) alongside optimize's own (see
            `blade.codegen.llvm.native`); they live as long as optimize.
            ``None`` (the default) starts one less than the cores this process may run on,
            or than PyTorch's thread count when lower; ``0`` compiles everything in
            optimize's process.
        check_engines: before an engine replaces its cluster, run its code and the
            cluster's TorchScript subgraph on the cluster's inputs from the example run and
            compare them (tolerances per dtype in `blade.self_check`); an engine that
            disagrees is not used, and the node whose compiled result first disagrees stays
            in TorchScript, named in the report. ``False`` skips the check.
        kernel_calls: an aten op that nothing lowers (no converter, and Torch-MLIR does not
            lower it) or that draws random numbers is compiled as a call of PyTorch's own
            kernel from the engine's code, so its cluster stays whole
            (`blade.partition.kernel_calls`). ``False`` leaves such ops to TorchScript.
        precision: ``"float32"`` (the default) computes as the model does. ``"bf16"`` runs
            the GEMMs and convolutions by the model's weights (linear layers, attention
            projections, convolutions other than depthwise and grouped ones) in bfloat16
            with float32 accumulation, about twice as fast, on CPUs with avx512_bf16:
            optimize refuses it elsewhere, and a saved bf16 engine loaded on such a CPU
            runs its TorchScript subgraph instead, the report saying why. Each weight gets
            one bfloat16 copy; inputs, outputs and everything else stay float32. Results
            move away from float32 eager by about bfloat16's rounding (docs/user_guide.md
            gives the measured errors). ``"int8"`` quantizes the model's linear layers
            after freezing (`blade.frontend.quantize`): int8 weights with one scale per
            output channel, uint8 activations with one scale per tensor from the
            `calibration` runs, multiplied by VNNI/AMX kernels; everything else stays
            float32. On a CPU with AVX2 but no VNNI, weights get 7 bits ([-64, 64]), the
            most AVX2's 16-bit pair sums take exactly. optimize refuses it on a CPU with
            neither; a saved int8 engine loaded where its weights do not fit runs its
            TorchScript subgraph (the same int8 math, in float32) instead, the report
            saying why.
        calibration: with ``precision="int8"``, the inputs that set the activations'
            ranges: a list of example inputs, each in the form of `example_inputs` (a
            tensor, a tuple or a dict). ``None`` calibrates on the example inputs alone;
            a few hundred real samples give ranges that hold in production.
        float_layers: with ``precision="int8"``, linear layers that stay float32, by
            module path (``"classifier"``, ``"encoder.layer.11"`` and everything under it).
    """

    allow_tracing: bool = False
    preserved_attributes: List[str] = field(default_factory=list)
    min_cluster_size: int = 1
    excluded_ops: List[str] = field(default_factory=list)
    fallback: str = "fallback"
    verbose: bool = False
    dry_run: bool = False
    dump_dir: Optional[str] = None
    progress: Optional[bool] = None
    dynamic: bool = False
    dynamic_dims: Optional[Dict[Union[int, str], List[int]]] = None
    parallel: bool = True
    signing_key: Optional[str] = None
    cache_dir: Optional[str] = None
    cache_max_bytes: int = 1 << 30
    cache_models: bool = True
    compile_workers: Optional[int] = None
    check_engines: bool = True
    kernel_calls: bool = True
    precision: str = "float32"
    calibration: Optional[List] = None
    float_layers: List[str] = field(default_factory=list)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"Config.precision must be one of {PRECISIONS}, got "
                             f"{self.precision!r}")
        if self.calibration is not None:
            if self.precision != "int8":
                raise ValueError("Config.calibration sets the ranges of int8 activations; "
                                 "it needs precision='int8', got precision="
                                 f"{self.precision!r}")
            if not isinstance(self.calibration, (list, tuple)) or not self.calibration:
                raise ValueError("Config.calibration must be a non-empty list of example "
                                 "inputs (each a tensor, a tuple or a dict), got "
                                 f"{type(self.calibration).__name__}")
        if self.float_layers and self.precision != "int8":
            raise ValueError("Config.float_layers names layers kept out of int8; it needs "
                             f"precision='int8', got precision={self.precision!r}")
        if self.fallback not in FALLBACK_MODES:
            raise ValueError(
                f"Config.fallback must be one of {FALLBACK_MODES}, got {self.fallback!r}"
            )
        if self.dynamic_dims is not None:
            if not isinstance(self.dynamic_dims, dict) or not all(
                    isinstance(k, (int, str)) and isinstance(v, (list, tuple)) and
                    all(isinstance(d, int) for d in v) for k, v in self.dynamic_dims.items()):
                raise ValueError("Config.dynamic_dims must map input positions or argument "
                                 "names to lists of dims, like {0: [0, 1]} or {\"mask\": [1]}; "
                                 f"got {self.dynamic_dims!r}")
            self.dynamic = True
        if isinstance(self.signing_key, os.PathLike):
            self.signing_key = os.fspath(self.signing_key)
        if isinstance(self.cache_dir, os.PathLike):
            self.cache_dir = os.fspath(self.cache_dir)
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            raise ValueError("Config.cache_dir must be a directory, \"off\" or None, got "
                             f"{self.cache_dir!r}")
        if not isinstance(self.cache_max_bytes, int) or self.cache_max_bytes < 0:
            raise ValueError("Config.cache_max_bytes must be a number of bytes >= 0, got "
                             f"{self.cache_max_bytes!r}")
        if self.compile_workers is not None and (
                isinstance(self.compile_workers, bool) or
                not isinstance(self.compile_workers, int) or self.compile_workers < 0):
            raise ValueError("Config.compile_workers must be a number of processes >= 0 or "
                             f"None, got {self.compile_workers!r}")
        if self.signing_key is not None and not isinstance(self.signing_key, str):
            raise ValueError("Config.signing_key must be the path of an Ed25519 private key "
                             f"(PEM), got {self.signing_key!r}")
        if isinstance(self.excluded_ops, str) or not isinstance(self.excluded_ops,
                                                                 (list, tuple)) or \
                not all(isinstance(op, str) for op in self.excluded_ops):
            raise ValueError("Config.excluded_ops must be a list of op names, like "
                             f"[\"aten::gelu\"], got {self.excluded_ops!r}")
        self.excluded_ops = list(self.excluded_ops)
        for op in self.excluded_ops:
            _check_op_name(op)
        if self.min_cluster_size < 1:
            raise ValueError(f"Config.min_cluster_size must be >= 1, got {self.min_cluster_size}")


def _refuse_unknown_options(init):
    """Config's generated __init__, refusing an unknown keyword with the closest option
    (`Config(dynamc=True)`) instead of Python's bare "unexpected keyword argument"."""
    options = [f.name for f in dataclasses.fields(Config)]
    known = frozenset(options)

    @functools.wraps(init)
    def checked_init(self, *args, **kwargs):
        for name in kwargs.keys() - known:
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"Config has no option {name!r}{hint}. The options are: "
                            f"{', '.join(options)}.")
        init(self, *args, **kwargs)
    return checked_init


Config.__init__ = _refuse_unknown_options(Config.__init__)


@functools.lru_cache(maxsize=1)
def _known_op_names() -> frozenset:
    """Every registered op, as an overload (`aten::add.Tensor`) and as a name (`aten::add`)."""
    names = set()
    for schema in torch._C._jit_get_all_schemas():
        names.add(schema.name)
        if schema.overload_name:
            names.add(f"{schema.name}.{schema.overload_name}")
    return frozenset(names)


def _check_op_name(op: str) -> None:
    # prim:: nodes (lists, tuples, constants) mostly have no schema to check against.
    if op in _known_op_names() or op.startswith("prim::"):
        return
    _known_op_names.cache_clear()  # an op registered since the names were read
    if op in _known_op_names():
        return
    close = difflib.get_close_matches(op, _known_op_names(), n=3, cutoff=0.6)
    close += [name for name in _known_op_names() if name.lower() == op.lower()]
    if "::" not in op:  # `gelu` for `aten::gelu`: ops are named with their namespace
        named = sorted(n for n in _known_op_names() if n.split("::", 1)[-1] == op)
        close = sorted(named, key=lambda n: not n.startswith("aten::")) + close
    hint = f"; did you mean {' or '.join(repr(c) for c in dict.fromkeys(close))}?" if close \
        else " (register custom ops before creating the Config)"
    raise ValueError(f"Config.excluded_ops: {op!r} is not a registered op name or "
                     f"overload{hint}")
