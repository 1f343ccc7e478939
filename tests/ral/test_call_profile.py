"""The runtime's time profile of engine calls by kernel (csrc/ral/call_profile.*), what
benchmarks/lengths.py --breakdown prints: off by default, and when on, every library call
under its name and operand sizes, and the engine's whole calls beside them."""
import pytest
import torch

import blade
from blade import _C
from helpers import assert_ran_compiled


@pytest.fixture(autouse=True)
def profiling_off():
    _C.reset_call_profile()
    yield
    _C.set_call_profiling(False)
    _C.reset_call_profile()


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(),
                                torch.nn.Linear(96, 8)).eval()
    return model, blade.optimize(model, (torch.randn(16, 64),))


def test_calls_are_timed_by_kernel_and_shape_only_while_asked():
    model, optimized = mlp()
    x = torch.randn(16, 64)
    with torch.no_grad():
        optimized(x)
        assert _C.call_profile() == []  # off: nothing counted
        _C.set_call_profiling(True)
        for _ in range(3):
            torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-5)
        _C.set_call_profiling(False)
        optimized(x)
    assert_ran_compiled(optimized)
    profile = {name: (calls, seconds) for name, calls, seconds in _C.call_profile()}
    assert profile["engine calls (whole)"][0] == 3
    matmuls = {name: entry for name, entry in profile.items() if name.startswith("blade_ral_matmul")}
    assert set(matmuls) == {"blade_ral_matmul [16, 64] x [96, 64]^T",
                            "blade_ral_matmul [16, 96] x [8, 96]^T"}, profile
    assert all(calls == 3 and seconds > 0 for calls, seconds in matmuls.values())
    # The kernels ran inside the engine's calls.
    assert sum(seconds for _, seconds in matmuls.values()) <= profile["engine calls (whole)"][1]
    _C.reset_call_profile()
    assert _C.call_profile() == []
