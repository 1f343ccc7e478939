"""Decompositions of the gradient ops of activations and losses (`*_backward`).

A traced training step, or a model that computes an input gradient at inference (saliency,
adversarial checks), calls these ops; Torch-MLIR lowers none of them to StableHLO. Each is
PyTorch's own formula (aten/src/ATen/native), written with elementwise ops that compile and
fuse. Imported by blade.frontend.decompositions.
"""
import math
from typing import List, Optional, Union

import torch

from blade.frontend.decomposition_registry import builtin as _builtin


@_builtin("aten::threshold_backward")
def _threshold_backward(grad_output: torch.Tensor, self: torch.Tensor,
                        threshold: Union[int, float, complex]) -> torch.Tensor:
    # ReLU's gradient: zero where the input was at or below the threshold (NaN inputs
    # pass the gradient, as PyTorch's kernel does), in the dtype the two promote to (the
    # sum's: only its dtype and shape are read, so the compiled code never computes it).
    zeros = torch.zeros_like(grad_output + self)
    return torch.where(self <= threshold, zeros, grad_output)


@_builtin("aten::hardtanh_backward")
def _hardtanh_backward(grad_output: torch.Tensor, self: torch.Tensor,
                       min_val: Union[int, float, complex],
                       max_val: Union[int, float, complex]) -> torch.Tensor:
    # Zero where the input was clipped (at either bound too, as PyTorch's kernel).
    clipped = (self <= min_val) | (self >= max_val)
    return torch.where(clipped, torch.zeros_like(grad_output), grad_output)


@_builtin("aten::sigmoid_backward")
def _sigmoid_backward(grad_output: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    return grad_output * (1 - output) * output


@_builtin("aten::elu_backward")
def _elu_backward(grad_output: torch.Tensor, alpha: Union[int, float, complex],
                  scale: Union[int, float, complex], input_scale: Union[int, float, complex],
                  is_result: bool, self_or_result: torch.Tensor) -> torch.Tensor:
    # From the result (ELU's output, when it ran in place) or from the input.
    x = self_or_result
    positive = grad_output * scale
    if is_result:
        negative = grad_output * input_scale * (x + alpha * scale)
    else:
        negative = grad_output * input_scale * alpha * scale * torch.exp(x * input_scale)
    return torch.where(x <= 0, negative, positive)


@_builtin("aten::softplus_backward")
def _softplus_backward(grad_output: torch.Tensor, self: torch.Tensor,
                       beta: Union[int, float, complex],
                       threshold: Union[int, float, complex]) -> torch.Tensor:
    # Above the threshold softplus is the identity, and so is its gradient.
    z = torch.exp(self * beta)
    return torch.where(self * beta > threshold, grad_output, grad_output * z / (z + 1))


@_builtin("aten::gelu_backward")
def _gelu_backward(grad_output: torch.Tensor, self: torch.Tensor,
                   approximate: str = "none") -> torch.Tensor:
    x = self
    if approximate == "tanh":
        beta = math.sqrt(2.0 / math.pi)
        kappa = 0.044715
        inner = beta * (x + kappa * x * x * x)
        tanh_inner = torch.tanh(inner)
        left_derivative = 0.5 * (1 + tanh_inner)
        right_derivative = 0.5 * x * (1 - tanh_inner * tanh_inner)
        inner_derivative = beta * (1 + 3 * kappa * x * x)
        return grad_output * (left_derivative + right_derivative * inner_derivative)
    cdf = 0.5 * (1 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    return grad_output * (cdf + x * pdf)


@_builtin("aten::nll_loss_backward")
def _nll_loss_backward(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor,
                       weight: Optional[torch.Tensor], reduction: int, ignore_index: int,
                       total_weight: torch.Tensor) -> torch.Tensor:
    # The gradient is -weight[t] * grad at each row's target class t (divided by the total
    # weight for a mean), zero elsewhere and on rows whose target is ignore_index. The
    # class weight is gathered (ones without a weight) so that a target out of range is
    # reported and the fallback raises PyTorch's error; the rest is a comparison of the
    # class index with the target, no scatter.
    if self.dim() == 1:
        # One sample: PyTorch's kernel reads the first target and the first gradient (a
        # target of one element per class passes its size check).
        target = target.reshape(-1)[:1].reshape([])
        grad_output = grad_output.reshape(-1)[:1].reshape([])
    ignored = target == ignore_index
    safe_target = torch.where(ignored, torch.zeros_like(target), target)
    class_weight = weight if weight is not None else \
        torch.ones([self.size(-1)], dtype=self.dtype, device=self.device)
    row_weight = torch.index_select(class_weight, 0, safe_target.reshape(-1))
    row_weight = torch.where(ignored, torch.zeros_like(target, dtype=self.dtype),
                             row_weight.reshape(target.shape))
    grad = grad_output / total_weight if reduction == 1 else grad_output   # 1: mean
    row_grad = -(grad * row_weight)
    classes = torch.arange(self.size(-1), device=self.device)
    # Ignored rows are masked after the product: an infinite gradient (a mean over no
    # target: total_weight 0) times their zero weight would be NaN.
    hit = (classes == target.unsqueeze(-1)) & ~ignored.unsqueeze(-1)
    return torch.where(hit, row_grad.unsqueeze(-1), torch.zeros_like(self))


def _pool_backward(grad_output: torch.Tensor, self: torch.Tensor, indices: torch.Tensor,
                   dims: int) -> torch.Tensor:
    # Each output's gradient added at the input position its index names (a flat position
    # in the last `dims` dims), in the outputs' order as PyTorch's kernel: a scatter_add,
    # whose compiled loop reports an index outside the input (the fallback raises).
    batch = self.shape[:self.dim() - dims]
    plane = 1
    for size in self.shape[self.dim() - dims:]:
        plane *= size
    grads = grad_output.reshape(batch + [-1])
    positions = indices.reshape(batch + [-1])
    grad_input = torch.zeros(batch + [plane], dtype=grad_output.dtype,
                             device=grad_output.device)
    return grad_input.scatter_add(-1, positions, grads).reshape(self.shape)


@_builtin("aten::max_pool2d_with_indices_backward")
def _max_pool2d_with_indices_backward(grad_output: torch.Tensor, self: torch.Tensor,
                                      kernel_size: List[int], stride: List[int],
                                      padding: List[int], dilation: List[int],
                                      ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    return _pool_backward(grad_output, self, indices, 2)


@_builtin("aten::max_pool3d_with_indices_backward")
def _max_pool3d_with_indices_backward(grad_output: torch.Tensor, self: torch.Tensor,
                                      kernel_size: List[int], stride: List[int],
                                      padding: List[int], dilation: List[int],
                                      ceil_mode: bool, indices: torch.Tensor) -> torch.Tensor:
    return _pool_backward(grad_output, self, indices, 3)
