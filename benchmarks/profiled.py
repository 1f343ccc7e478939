"""The runtime's call profile around a run of calls (shared by `lengths.py` and
`layers.py`)."""
import torch
from blade import _C


def profiled_calls(fn, inputs, runs):
    """(name, calls, seconds) of every library call, kernel call, parallel loop of
    generated code and whole engine call ("engine calls (whole)") in `runs` calls of
    `fn(*inputs)`, timed by the runtime's call profile (off again after)."""
    _C.reset_call_profile()
    _C.set_call_profiling(True)
    try:
        with torch.no_grad():
            for _ in range(runs):
                fn(*inputs)
    finally:
        _C.set_call_profiling(False)
    return _C.call_profile()
