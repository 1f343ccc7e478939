"""Normalizations (inference form) and softmax, each float dtype, two shapes."""
import pytest
import torch

import blade
from helpers import TOLERANCE, Lambda, compiled_whole, random_tensor, run_compiled

TRACE = blade.Config(allow_tracing=True)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
F = torch.nn.functional
# group_norm's Python code branches on sizes while tracing; expected here.
pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")


def layer_norm(x):
    weight = torch.linspace(0.5, 1.5, x.shape[-1], dtype=x.dtype)
    return F.layer_norm(x, (x.shape[-1],), weight, weight * 0.1)


def group_norm(x):
    return F.group_norm(x, 2, eps=1e-3)


def batch_norm(x):
    c = x.shape[1]
    mean = torch.linspace(-1, 1, c, dtype=x.dtype)
    var = torch.linspace(0.5, 2, c, dtype=x.dtype)
    return F.batch_norm(x, mean, var, var * 0.5, mean, training=False, eps=1e-5)


OPS = {
    "layer_norm": layer_norm,
    "group_norm": group_norm,
    "batch_norm": batch_norm,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 6), (3, 6, 5, 4)], ids=["3d", "4d"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_normalization(name, shape, dtype):
    torch.manual_seed(0)
    rtol, atol = TOLERANCE[dtype]
    run_compiled(Lambda(OPS[name]), (random_tensor(shape, dtype),), TRACE, rtol=rtol,
                 atol=max(atol, 1e-5))


def test_layer_norm_module_scripted():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU()).eval()
    _, report = run_compiled(model, (torch.randn(3, 5, 16),))
    assert report.coverage == 1.0


def test_native_batch_norm_evaluated_compiles_as_batch_norm():
    # Torch-MLIR's lowering of native_batch_norm fails on a cast; evaluated, it is
    # batch_norm, and its saved statistics are empty tensors, as PyTorch returns them.
    torch.manual_seed(0)
    x, mean, var = torch.randn(2, 3, 4, 5), torch.randn(3), torch.rand(3)
    weight, bias = torch.randn(3), torch.randn(3)

    def fn(x, mean, var, weight, bias):
        return (*torch.ops.aten.native_batch_norm(x, weight, bias, mean, var, False, 0.1, 1e-5),
                *torch.ops.aten.native_batch_norm(x, None, bias, mean, var, False, 0.1, 1e-3))

    _, report = compiled_whole(fn, (x, mean, var, weight, bias))
    assert report.decomposed == {"aten::native_batch_norm": 2}, str(report)


INSTANCE_NORMS = {  # the norm, the convolution before it, the input's shape
    "2d": (lambda: torch.nn.InstanceNorm2d(6), torch.nn.Conv2d, (2, 3, 9, 11)),
    "affine": (lambda: torch.nn.InstanceNorm2d(6, affine=True), torch.nn.Conv2d, (2, 3, 9, 11)),
    "1d": (lambda: torch.nn.InstanceNorm1d(6), torch.nn.Conv1d, (2, 3, 17)),
    "running_stats": (lambda: torch.nn.InstanceNorm2d(6, track_running_stats=True),
                      torch.nn.Conv2d, (2, 3, 9, 11)),
}


@pytest.mark.parametrize("kind", sorted(INSTANCE_NORMS))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_instance_norm_compiles_as_reductions(kind, dynamic):
    """Blade's decomposition of aten::instance_norm (each instance's own statistics, or the
    running ones as batch_norm): Torch-MLIR's lowering of the op without a weight, the
    module's default, aborted the process."""
    torch.manual_seed(0)
    norm, conv, shape = INSTANCE_NORMS[kind]
    model = torch.nn.Sequential(conv(3, 6, 3), norm(), torch.nn.ReLU()).eval()
    if model[1].running_var is not None:
        with torch.no_grad():
            model[1].running_mean.uniform_(-0.5, 0.5)
            model[1].running_var.uniform_(0.5, 2.0)
    optimized, report = run_compiled(model, (torch.randn(shape),),
                                     blade.Config(dynamic=dynamic), rtol=1e-4, atol=1e-4)
    assert report.coverage == 1.0 and report.decomposed.get("aten::instance_norm"), \
        str(report)
    if dynamic:
        other = torch.randn(3, *shape[1:-1], shape[-1] + 4)
        with torch.no_grad():
            torch.testing.assert_close(optimized(other), model(other), rtol=1e-4, atol=1e-4)
