"""Gradient ops (`*_backward`), compiled through decompositions (Torch-MLIR lowers none of
them): each compared with eager on values that cross every branch of its formula, and
compiled whole."""
import pytest
import torch

from helpers import compiled_whole

aten = torch.ops.aten


ACTIVATIONS = {
    "hardtanh": lambda g, x: aten.hardtanh_backward(g, x, -1.0, 1.0),
    "hardtanh_int_bounds": lambda g, x: aten.hardtanh_backward(g, x, -1, 2),
    "sigmoid": lambda g, x: aten.sigmoid_backward(g, torch.sigmoid(x)),
    "elu_from_input": lambda g, x: aten.elu_backward(g, 1.5, 1.2, 0.8, False, x),
    "elu_from_result": lambda g, x: aten.elu_backward(g, 1.5, 1.2, 0.8, True,
                                                      torch.nn.functional.elu(x, 1.5)),
    "softplus": lambda g, x: aten.softplus_backward(g, x, 2.0, 3.0),
    "gelu": lambda g, x: aten.gelu_backward(g, x),
    "gelu_tanh": lambda g, x: aten.gelu_backward(g, x, approximate="tanh"),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradients_match_eager(name):
    torch.manual_seed(0)
    x = torch.randn(4, 33) * 3
    x[0, :4] = torch.tensor([-1.0, 1.0, 0.0, 1.5])   # bounds and thresholds exactly
    # float32 rounding of tanh near saturation: 1.6e-5 from eager's 0 for gelu_tanh.
    compiled_whole(ACTIVATIONS[name], (torch.randn(4, 33), x), atol=3e-5)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("batched", [False, True])
def test_nll_loss_backward_matches_eager(reduction, weighted, batched):
    torch.manual_seed(0)
    classes = 7
    x = torch.randn(6, classes).log_softmax(-1) if batched else torch.randn(classes)
    target = torch.tensor([0, 3, -100, 6, 3, 2]) if batched else torch.tensor(4)
    weight = torch.rand(classes) if weighted else None
    reductions = {0: "none", 1: "mean", 2: "sum"}
    loss, total = aten.nll_loss_forward(x, target, weight, reduction, -100)
    grad = torch.randn(6) if reduction == 0 and batched else torch.tensor(0.7)

    def fn(g, x, t, total):
        return aten.nll_loss_backward(g, x, t, weight, reduction, -100, total)

    optimized, _ = compiled_whole(fn, (grad, x, target, total))
    if not batched:
        # One sample with a target of one element per class (which eager takes, reading
        # its first) and a gradient of one element.
        compiled_whole(fn, (grad.reshape(1), x, torch.tensor([4, 0, 1, 2, 3, 5, 6]), total))
    assert reductions[reduction]   # the three reductions each ran
    if batched:
        # A target out of range raises, as in eager (the engine's gather reports it and
        # the fallback runs PyTorch's op).
        bad = target.clone()
        bad[0] = classes
        with pytest.raises(RuntimeError):
            optimized(grad, x, bad, total)


def test_pooling_and_upsampling_gradients_match_eager():
    # max pooling's: each output's gradient added at its index (repeated indices
    # accumulate); nearest upsampling's: each input pixel sums the outputs that read it.
    torch.manual_seed(0)
    aten = torch.ops.aten
    image, grad, index = torch.rand(2, 4, 7, 6), torch.rand(2, 4, 6, 5), \
        torch.randint(0, 16, (2, 4, 6, 5))
    upsampled = torch.rand(1, 2, 6, 10)

    def fn(grad, image, index, upsampled):
        return (aten.max_pool2d_with_indices_backward(grad, image, [2, 2], [1, 1], [0, 0],
                                                      [1, 1], False, index),
                aten.max_pool2d_with_indices_backward(grad[0], image[0], [2, 2], [1, 1],
                                                      [0, 0], [1, 1], False, index[0]),
                aten.upsample_nearest2d_backward(upsampled, [6, 10], [1, 2, 2, 5]),
                aten.upsample_nearest2d_backward(upsampled, [6, 10], [1, 2, 4, 3], 1.5, 3.3))

    compiled_whole(fn, (grad, image, index, upsampled))


def test_nll_loss_backward_of_ignored_rows_is_zero_when_the_gradient_is_not_finite():
    # Every target ignored (a real class, 0): mean divides by a total weight of 0.
    x = torch.randn(3, 4).log_softmax(-1)
    target = torch.tensor([0, 0, 0])

    def fn(x, target):
        loss, total = torch.ops.aten.nll_loss_forward(x, target, None, 1, 0)
        return torch.ops.aten.nll_loss_backward(torch.ones([]), x, target, None, 1, 0, total)

    compiled_whole(fn, (x, target))
