"""Blade: compiles the parts of a TorchScript graph it can through Torch-MLIR and StableHLO
to native code, run by a C++ runtime; everything else keeps running as TorchScript.

    optimized = blade.optimize(model, example_inputs)
    torch.jit.save(optimized, "model.pt")       # later: import blade; torch.jit.load(...)
    print(blade.report(optimized))

    compiled = torch.compile(model, backend="blade")   # the same, through Dynamo
    print(blade.dynamo_reports())                      # see blade.torch_compile

Importing blade loads only the runtime; the compiler (and torch-mlir) load on first use.
"""
from typing import Optional

from blade._runtime import load_runtime

load_runtime()

from blade.config import Config  # noqa: E402
from blade.frontend.inputs import ExampleInputsError  # noqa: E402,F401  (public)
from blade.frontend.dynamic_shapes import DynamicShapesWarning  # noqa: E402,F401  (public)
from blade.report import Report, report  # noqa: E402
from blade import torch_compile  # noqa: E402
from blade.torch_compile import dynamo_graphs, dynamo_reports  # noqa: E402

# torch.compile(model, backend="blade"), registered once torch loads its backend registry.
torch_compile.register()

__version__ = "0.1.0"


def optimize(model, example_inputs=None, config=None, *, example_kwarg_inputs=None):
    """Compiles what it can of `model` for CPU and returns a `torch.jit.ScriptModule` that
    computes what `model` computes.

    `model` is an `nn.Module` (scripted, or traced with `Config(allow_tracing=True)`), a
    `ScriptModule` or a `torch.export.ExportedProgram` (its own example inputs serve when
    none are given). `example_inputs` is a tensor, a tuple of forward's arguments or a dict
    of them by name; `example_kwarg_inputs` a dict of arguments by name next to positional
    ones. They run on private copies. The result takes its inputs as forward did, by
    position or name, and is specialized to their dtypes and (unless
    `Config(dynamic=True)`) sizes; other inputs run the model unchanged. `config` is a
    `blade.Config`. The result saves with `torch.jit.save` and loads, after `import blade`,
    with `torch.jit.load` (its native code runs where its signing key is trusted:
    docs/security.md); `blade.report(result)` says what was compiled and why not.
    docs/user_guide.md has the whole story.

    Example:
        >>> optimized = blade.optimize(model.eval(), (torch.randn(8, 64),))
        >>> optimized = blade.optimize(bert, {"input_ids": ids, "attention_mask": mask})
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.compiler import optimize as _optimize

    return _optimize(model, example_inputs, config, example_kwarg_inputs=example_kwarg_inputs)


def release_cached_memory():
    """Gives the buffers that compiled code freed and the runtime kept for its next calls
    back to PyTorch's allocator.

    Example:
        >>> blade.release_cached_memory()
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    _C.release_cached_memory()


def int8_supported() -> bool:
    """Whether this CPU runs `Config(precision="int8")` engines: it has VNNI, AVX-VNNI,
    AMX-INT8 or AVX2 instructions (with AVX2 alone, weights get 7 bits: see the user guide).

    Example:
        >>> config = blade.Config(precision="int8" if blade.int8_supported() else "float32")
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    return _C.int8_weight_limit() > 0


def set_cached_memory_limit(num_bytes: int):
    """The most memory (bytes, process-wide) of freed intermediate buffers the runtime
    keeps for compiled code's next calls; 1 GiB by default, 0 keeps none. A C++ service
    calls `blade_ral_set_cached_memory_limit` (csrc/ral/ral_abi.h).

    Example:
        >>> blade.set_cached_memory_limit(256 << 20)
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    _C.set_cached_memory_limit(int(num_bytes))


def set_winograd_4x4(enabled: bool):
    """Whether float32 3x3 convolutions may run Winograd's F(4x4, 3x3) (process-wide, for
    calls from then on; on by default). It is faster than F(2x2, 3x3) on large images, but
    its results differ more from eager's (the user guide gives both). False keeps
    F(2x2, 3x3) everywhere. A C++ service calls `blade::ral::set_winograd_4x4`
    (csrc/ral/winograd.h).

    Example:
        >>> blade.set_winograd_4x4(False)  # results closest to eager's
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    _C.set_winograd_4x4(bool(enabled))


def set_prepared_weights_limit(num_bytes: Optional[int]):
    """The most memory (bytes, process-wide) the runtime's prepared weight copies may take:
    the weights of GEMMs and convolutions reordered into oneDNN's layout, packed for MKL or
    transformed for Winograd on an engine's first call, which cost about the weights'
    memory again (`packed_weights` and `prepared_bytes` in the report). A copy that would
    go past the limit is not made and its weight is used as it is, slower (BERT-base about
    10%, ResNet-50 1.8x on 2 cores); None (the default) sets no limit, 0 allows no
    copies. Set it before the first calls; copies made earlier stay. A C++ service calls
    `blade::ral::set_prepared_weights_limit` (csrc/ral/prepared_weights.h).

    Example:
        >>> blade.set_prepared_weights_limit(0)   # memory over speed
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    _C.set_prepared_weights_limit(-1 if num_bytes is None else max(0, int(num_bytes)))


def trust_key(public_key: str):
    """Lets engines signed by `public_key` (an Ed25519 public key, 64 hex digits, as
    `python -m blade key` prints it on the compiling machine) run their compiled code in
    this process. Call it before `torch.jit.load`; engines loaded earlier stay on their
    TorchScript fallback. The environment variable BLADE_TRUSTED_KEYS does the same for
    a whole process (docs/security.md).

    Example:
        >>> blade.trust_key("3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29")
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    _C.trust_public_key(str(public_key).strip())


def signing_public_key(signing_key=None) -> str:
    """The public key (hex) that engines compiled here are signed with: this machine's key
    (created on first use) or that of the private key file `signing_key`. Give it to the
    machines that load the models (`blade.trust_key` or BLADE_TRUSTED_KEYS there).

    Example:
        >>> blade.signing_public_key()
        '3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29'
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    return _C.signing_public_key("" if signing_key is None else str(signing_key))


def trusted_keys():
    """The public keys whose engines run their code in this process, sorted.

    Example:
        >>> blade.signing_public_key() in blade.trusted_keys()
        True
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade import _C

    return list(_C.trusted_public_keys())


def register_converter(schema, capability_validator=None, priority=None, dtypes=None,
                       result_dtype="same", compute=True):
    """Decorator registering a user converter to StableHLO; see
    `blade.partition.user_converters.register_converter` and docs/adding_a_converter.md.

    Example:
        >>> @blade.register_converter("mylib::my_tanh")
        ... def convert(ctx):
        ...     return ctx.op("stablehlo.tanh", ctx.operands)
    """
    from blade.partition import converters  # noqa: F401  (built-ins first, so priorities compare)
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.partition.registry import USER_PRIORITY
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.partition.user_converters import register_converter as _register

    return _register(schema, capability_validator,
                     USER_PRIORITY if priority is None else priority, dtypes, result_dtype,
                     compute)


def unregister_converter(converter):
    """Removes a converter returned by `register_converter`."""
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.partition.user_converters import unregister_converter as _unregister

    _unregister(converter)


def register_decomposition(overload):
    """Decorator: every call of `overload` ("aten::op.overload" or a torch.library op) is
    rewritten as the decorated function's body before clustering; see
    `blade.frontend.decompositions` and docs/adding_a_converter.md.

    Example:
        >>> @blade.register_decomposition("mylib::softplus2")
        ... def softplus2(x: torch.Tensor, beta: float) -> torch.Tensor:
        ...     return torch.log1p(torch.exp(x * beta)) / beta
    """
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.frontend.decompositions import register_decomposition as _register

    return _register(overload)


def unregister_decomposition(overload):
    """Removes the user's decomposition of `overload`."""
    # Loaded on first use, so that `import blade` stays cheap.
    from blade.frontend.decompositions import unregister_decomposition as _unregister

    _unregister(overload)


__all__ = ["Config", "Report", "dynamo_graphs", "dynamo_reports", "int8_supported", "optimize",
           "register_converter", "register_decomposition", "report", "signing_public_key",
           "trust_key", "trusted_keys", "unregister_converter", "unregister_decomposition",
           "__version__"]
