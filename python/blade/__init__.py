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


__all__ = ["Config", "Report", "optimize", "report", "__version__"]
