"""Blade: compiles the parts of a TorchScript graph it can through Torch-MLIR and StableHLO
to native code, run by a C++ runtime; everything else keeps running as TorchScript.

    optimized = blade.optimize(model, example_inputs)
    torch.jit.save(optimized, "model.pt")       # later: import blade; torch.jit.load(...)
    print(blade.report(optimized))

Importing blade loads only the runtime; the compiler (and torch-mlir) load on first use.
"""
from ._runtime import load_runtime

load_runtime()

from .config import Config  # noqa: E402
from .report import Report, report  # noqa: E402

__version__ = "0.1.0"


def optimize(model, example_inputs, config=None):
    """Compiles what it can of `model`; see `blade.compiler.optimize`.

    Example:
        >>> optimized = blade.optimize(model.eval(), (torch.randn(8, 64),))
    """
    from .compiler import optimize as _optimize

    return _optimize(model, example_inputs, config)


def release_cached_memory():
    """Gives the buffers that compiled code freed and the runtime kept for its next calls
    back to PyTorch's allocator.

    Example:
        >>> blade.release_cached_memory()
    """
    from . import _C

    _C.release_cached_memory()


def set_cached_memory_limit(num_bytes: int):
    """The most memory (bytes, process-wide) of freed intermediate buffers the runtime
    keeps for compiled code's next calls; 1 GiB by default, 0 keeps none. A C++ service
    calls `blade_ral_set_cached_memory_limit` (csrc/ral/ral_abi.h).

    Example:
        >>> blade.set_cached_memory_limit(256 << 20)
    """
    from . import _C

    _C.set_cached_memory_limit(int(num_bytes))


def register_converter(schema, capability_validator=None, priority=None, dtypes=None,
                       result_dtype="same", compute=True):
    """Decorator registering a user converter to StableHLO; see
    `blade.user_converters.register_converter` and docs/adding_a_converter.md.

    Example:
        >>> @blade.register_converter("mylib::my_tanh")
        ... def convert(ctx):
        ...     return ctx.op("stablehlo.tanh", ctx.operands)
    """
    from . import converters  # noqa: F401  (built-ins first, so priorities compare)
    from .registry import USER_PRIORITY
    from .user_converters import register_converter as _register

    return _register(schema, capability_validator,
                     USER_PRIORITY if priority is None else priority, dtypes, result_dtype,
                     compute)


def unregister_converter(converter):
    """Removes a converter returned by `register_converter`."""
    from .user_converters import unregister_converter as _unregister

    _unregister(converter)


def register_decomposition(overload):
    """Decorator: every call of `overload` ("aten::op.overload" or a torch.library op) is
    rewritten as the decorated function's body before clustering; see
    `blade.decompositions` and docs/adding_a_converter.md.

    Example:
        >>> @blade.register_decomposition("mylib::softplus2")
        ... def softplus2(x: torch.Tensor, beta: float) -> torch.Tensor:
        ...     return torch.log1p(torch.exp(x * beta)) / beta
    """
    from .decompositions import register_decomposition as _register

    return _register(overload)


def unregister_decomposition(overload):
    """Removes the user's decomposition of `overload`."""
    from .decompositions import unregister_decomposition as _unregister

    _unregister(overload)


__all__ = ["Config", "Report", "optimize", "register_converter", "register_decomposition",
           "report", "unregister_converter", "unregister_decomposition", "__version__"]
