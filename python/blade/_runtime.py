"""Loads Blade's runtime library, which registers torch.classes.blade.Engine and
torch.ops.blade.execute. This is all a saved optimized model needs: no MLIR, no compiler."""
import ctypes
from pathlib import Path

import torch

RUNTIME_LIBRARY = Path(__file__).resolve().parent / "libblade_ral.so"


def load_runtime() -> None:
    if not RUNTIME_LIBRARY.exists():
        raise ImportError(
            f"blade: the runtime library {RUNTIME_LIBRARY} is missing; build Blade with "
            "`make build` (or `pip install --no-build-isolation -e .`)"
        )
    torch.ops.load_library(str(RUNTIME_LIBRARY))
    # The runtime's advice (how to trust a key) then names Python's API, not the C++ one.
    ctypes.CDLL(str(RUNTIME_LIBRARY)).blade_ral_set_python_host()

