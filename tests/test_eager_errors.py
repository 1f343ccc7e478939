"""Eager's errors kept: an input that eager rejects is rejected after optimize with eager's
message (inside TorchScript's error), and no folding makes it answer instead; batched inputs
still run compiled, with BatchNorm folded where that is exact."""
import pytest
import torch

import blade
from helpers import run_compiled

# Each wrong input runs the unspecialized model, which warns (tests/test_slow_path.py).
pytestmark = pytest.mark.filterwarnings("ignore:blade. the optimized model's input guard")


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((-1, -2)))


class Conv1dNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(3, 8, 3)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class LinearNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


def randomized(model):
    """BatchNorm statistics that are not the identity, so a wrong fold shows."""
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)
    return model.eval()


def eager_error(model, x):
    with pytest.raises(Exception) as caught:
        model(x)
    return caught.value


def assert_raises_like_eager(model, optimized, x):
    expected = eager_error(model, x)
    with pytest.raises((torch.jit.Error, RuntimeError)) as caught:
        optimized(x)
    message = str(caught.value).strip().splitlines()[-1]
    if isinstance(expected, RuntimeError):
        assert message == f"RuntimeError: {expected}", message
    else:
        assert message == f"builtins.{type(expected).__name__}: {expected}", message


@pytest.mark.parametrize("dynamic", [False, True])
def test_batchnorm2d_after_an_unbatched_conv_raises_as_in_eager(dynamic):
    model = randomized(ConvNet())
    optimized, report = run_compiled(model, (torch.randn(2, 3, 16, 16),),
                                     blade.Config(dynamic=dynamic))
    ops = {op for c in report.clusters for op in c.ops}
    assert "aten::batch_norm" not in ops, ops        # still folded into the convolution
    with pytest.warns(UserWarning):
        assert_raises_like_eager(model, optimized, torch.randn(3, 16, 16))
    assert_raises_like_eager(model, optimized, torch.randn(16, 16))
    assert_raises_like_eager(model, optimized, torch.randn(2, 4, 16, 16))


@pytest.mark.parametrize("dynamic", [False, True])
def test_batchnorm1d_after_linear_normalizes_eager_s_axis(dynamic):
    model = randomized(LinearNet())
    optimized, _ = run_compiled(model, (torch.randn(4, 8),), blade.Config(dynamic=dynamic))
    # BatchNorm1d takes (N, C, L): dim 1 of the Linear's 3-D result is C, so eager
    # normalizes those 6 rows, not the 6 output features.
    x = torch.randn(4, 6, 8)
    with torch.no_grad(), pytest.warns(UserWarning):
        torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-5)
    assert_raises_like_eager(model, optimized, torch.randn(4, 3, 8))
    assert_raises_like_eager(model, optimized, torch.randn(8))
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-5)
    assert blade.report(optimized).clusters[0].calls == 2    # the example's rank: compiled


def test_batchnorm1d_after_an_unbatched_conv1d_raises_as_in_eager():
    model = randomized(Conv1dNet())
    optimized, _ = run_compiled(model, (torch.randn(2, 3, 16),))
    assert_raises_like_eager(model, optimized, torch.randn(3, 16))
    x = torch.randn(3, 10)            # 8 channels out of 8 positions: eager answers
    with torch.no_grad():
        torch.testing.assert_close(optimized(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_linear_given_the_wrong_features_raises_eager_s_error():
    model = torch.nn.Linear(8, 10).eval()
    optimized, _ = run_compiled(model, (torch.randn(4, 8),))
    for x in (torch.randn(4, 7), torch.randn(2, 4, 7), torch.randn(())):
        assert_raises_like_eager(model, optimized, x)
    optimized(torch.randn(4, 8))
    assert blade.report(optimized).clusters[0].calls == 2
