"""Decompositions of adaptive pooling (1-3 d, average and max with indices).

PyTorch's adaptive window for output position o of a dim of size S pooled to O is
[floor(o * S / O), ceil((o + 1) * S / O)); Torch-MLIR lowers adaptive pooling only where
every window has one size and stride (S divisible by O, 2-d average). Here every window
becomes a gather: the spatial dims are flattened, and each output position reads its
window's flat positions, padded to the longest window by repeating its last position
(harmless for a max; an average masks the repeats out and divides by the true count).
The positions depend on sizes only, and fold to constants: these apply to static shapes.
With dynamic shapes, global average pooling (an output of 1 x 1, a CNN's head) is a mean
over H and W, which compiles whatever the image size. Imported by blade.frontend.decompositions.
"""
from typing import List, Tuple

import torch

from blade.frontend.decompositions import _builtin


def _windows(sizes: List[int], outputs: List[int],
             device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """The flat input positions of every window, [*outputs, *longest windows], and which
    of them are in the window (the rest repeat its last position)."""
    dims = len(outputs)   # a constant before types are known: the loops unroll early
    positions = torch.zeros([], dtype=torch.long, device=device)
    valid = torch.ones([], dtype=torch.bool, device=device)
    stride = 1
    for d in range(dims - 1, -1, -1):
        size, count = sizes[d], outputs[d]
        longest = 0
        for o in range(count):
            longest = max(longest, ((o + 1) * size + count - 1) // count - (o * size) // count)
        o = torch.arange(count, device=device)
        start = torch.div(o * size, count, rounding_mode="floor").unsqueeze(1)
        end = torch.div((o + 1) * size + count - 1, count, rounding_mode="floor").unsqueeze(1)
        offset = start + torch.arange(longest, device=device)
        dim_positions = torch.minimum(offset, end - 1) * stride
        dim_valid = offset < end
        # [count, longest] placed at dims d and dims + d of the 2 * dims result.
        for _ in range(d):
            dim_positions, dim_valid = dim_positions.unsqueeze(0), dim_valid.unsqueeze(0)
        for _ in range(dims - 1):
            dim_positions, dim_valid = dim_positions.unsqueeze(-2), dim_valid.unsqueeze(-2)
        for _ in range(dims - 1 - d):
            dim_positions, dim_valid = dim_positions.unsqueeze(-1), dim_valid.unsqueeze(-1)
        positions = positions + dim_positions
        valid = valid & dim_valid
        stride *= size
    return positions, valid


def _gathered(x: torch.Tensor, outputs: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """x's windows, [*batch, *outputs, window], and the window's valid mask."""
    dims = len(outputs)
    batch = x.shape[:x.dim() - dims]
    sizes = x.shape[x.dim() - dims:]
    positions, valid = _windows(sizes, outputs, x.device)
    window = 1
    for length in positions.shape[dims:]:
        window *= length
    flat = x.reshape(batch + [-1])
    gathered = torch.index_select(flat, -1, positions.reshape(-1))
    return gathered.reshape(batch + outputs + [window]), valid.reshape(outputs + [window])


def _adaptive_average(x: torch.Tensor, outputs: List[int]) -> torch.Tensor:
    windows, valid = _gathered(x, outputs)
    total = torch.sum(torch.where(valid, windows, torch.zeros_like(windows)), -1)
    return total / torch.sum(valid, -1).to(x.dtype)


def _adaptive_max(x: torch.Tensor, outputs: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    # PyTorch's index is the first maximum in row-major order within the window, or the
    # last NaN where there is one; the repeats come after what they repeat, so the first
    # position found by argmax is the real one.
    windows, valid = _gathered(x, outputs)
    dims = len(outputs)
    positions, _ = _windows(x.shape[x.dim() - dims:], outputs, x.device)
    flat_positions = positions.reshape(outputs + [-1])
    window = flat_positions.size(-1)
    values = torch.amax(windows, -1, True)
    order = torch.arange(window, device=x.device)
    first_max = torch.amin(torch.where(windows == values, order, window), -1, True)
    last_nan = torch.amax(torch.where(torch.isnan(windows), order, -1), -1, True)
    chosen = torch.where(last_nan >= 0, last_nan, first_max)
    indices = torch.gather(flat_positions.expand(windows.shape), -1, chosen).squeeze(-1)
    return values.squeeze(-1), indices


@_builtin("aten::adaptive_avg_pool1d", shapes="static")
def _adaptive_avg_pool1d(self: torch.Tensor, output_size: List[int]) -> torch.Tensor:
    return _adaptive_average(self, output_size)


@_builtin("aten::adaptive_avg_pool2d", shapes="static")
def _adaptive_avg_pool2d(self: torch.Tensor, output_size: List[int]) -> torch.Tensor:
    height, width = self.size(-2), self.size(-1)
    if height % output_size[0] == 0 and width % output_size[1] == 0:
        return torch._C._nn.adaptive_avg_pool2d(self, output_size)   # Torch-MLIR lowers it
    return _adaptive_average(self, output_size)


@_builtin("aten::adaptive_avg_pool2d", shapes="dynamic")
def _global_avg_pool2d(x: torch.Tensor, output_size: List[int]) -> torch.Tensor:
    # With a varying image size only global pooling compiles (a mean); with a constant
    # output size, constant propagation keeps one branch.
    if output_size == [1, 1]:
        return torch.mean(x, [-2, -1], True)
    return torch._C._nn.adaptive_avg_pool2d(x, output_size)


@_builtin("aten::adaptive_avg_pool3d", shapes="static")
def _adaptive_avg_pool3d(self: torch.Tensor, output_size: List[int]) -> torch.Tensor:
    return _adaptive_average(self, output_size)


@_builtin("aten::adaptive_max_pool1d", shapes="static")
def _adaptive_max_pool1d(self: torch.Tensor,
                         output_size: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    values, indices = _adaptive_max(self, output_size)
    return values, indices


@_builtin("aten::adaptive_max_pool2d", shapes="static")
def _adaptive_max_pool2d(self: torch.Tensor,
                         output_size: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    values, indices = _adaptive_max(self, output_size)
    return values, indices


@_builtin("aten::adaptive_max_pool3d", shapes="static")
def _adaptive_max_pool3d(self: torch.Tensor,
                         output_size: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    values, indices = _adaptive_max(self, output_size)
    return values, indices
