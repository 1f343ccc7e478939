"""Decompositions of adaptive pooling (1-3 d, average and max with indices) and of 3-d
max pooling with indices.

PyTorch's adaptive window for output position o of a dim of size S pooled to O is
[floor(o * S / O), ceil((o + 1) * S / O)); Torch-MLIR lowers adaptive pooling only where
every window has one size and stride (S divisible by O, 2-d average). Here every window
becomes a gather: the spatial dims are flattened, and each output position reads its
window's flat positions, padded to the longest window by repeating its last position
(harmless for a max; an average masks the repeats out and divides by the true count).
The positions depend on sizes only, and fold to constants: these apply to static shapes.
With dynamic shapes, global average pooling (an output of 1 x 1, a CNN's head) is a mean
over H and W, which compiles whatever the image size. Max pooling's windows (stride,
padding, dilation, ceil mode) are gathered the same way, the padding's positions masked out.
Imported by blade.frontend.decompositions.
"""
from typing import List, Tuple

import torch

from blade.frontend.decomposition_registry import builtin as _builtin


def _adaptive_dim(size: int, count: int,
                  device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Positions [count, longest window] of one dim's adaptive windows, and which are in
    their window (the rest repeat its last position)."""
    longest = 0
    for o in range(count):
        longest = max(longest, ((o + 1) * size + count - 1) // count - (o * size) // count)
    o = torch.arange(count, device=device)
    start = torch.div(o * size, count, rounding_mode="floor").unsqueeze(1)
    end = torch.div((o + 1) * size + count - 1, count, rounding_mode="floor").unsqueeze(1)
    offset = start + torch.arange(longest, device=device)
    return torch.minimum(offset, end - 1), offset < end


def _strided_dim(size: int, count: int, kernel: int, stride: int, padding: int,
                 dilation: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Positions [count, kernel] of one dim's pooling windows, and which are inside the
    input (the padding's are clamped into it, and masked)."""
    offset = (torch.arange(count, device=device) * stride - padding).unsqueeze(1) + \
        torch.arange(kernel, device=device) * dilation
    return torch.clamp(offset, 0, size - 1), (offset >= 0) & (offset < size)


def _combined(per_dim: List[Tuple[torch.Tensor, torch.Tensor]], sizes: List[int],
              dims: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flat positions [*outputs, *windows] in the flattened spatial dims, and validity."""
    positions = torch.zeros([], dtype=torch.long, device=per_dim[0][0].device)
    valid = torch.ones([], dtype=torch.bool, device=per_dim[0][0].device)
    stride = 1
    for d in range(dims - 1, -1, -1):
        dim_positions, dim_valid = per_dim[d]
        dim_positions = dim_positions * stride
        # [count, window] placed at dims d and dims + d of the 2 * dims result.
        for _ in range(d):
            dim_positions, dim_valid = dim_positions.unsqueeze(0), dim_valid.unsqueeze(0)
        for _ in range(dims - 1):
            dim_positions, dim_valid = dim_positions.unsqueeze(-2), dim_valid.unsqueeze(-2)
        for _ in range(dims - 1 - d):
            dim_positions, dim_valid = dim_positions.unsqueeze(-1), dim_valid.unsqueeze(-1)
        positions = positions + dim_positions
        valid = valid & dim_valid
        stride *= sizes[d]
    return positions, valid


def _adaptive_windows(x: torch.Tensor, outputs: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    dims = len(outputs)   # a constant before types are known: the loops unroll early
    sizes = x.shape[x.dim() - dims:]
    per_dim: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for d in range(dims):
        per_dim.append(_adaptive_dim(sizes[d], outputs[d], x.device))
    return _combined(per_dim, sizes, dims)


def _gathered(x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
              dims: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
    """x's windows [*batch, *outputs, window], their flat positions and validity
    [*outputs, window], and the output sizes."""
    batch = x.shape[:x.dim() - dims]
    outputs = positions.shape[:dims]
    window = 1
    for length in positions.shape[dims:]:
        window *= length
    flat = x.reshape(batch + [-1])
    gathered = torch.index_select(flat, -1, positions.reshape(-1))
    return (gathered.reshape(batch + outputs + [window]), positions.reshape(outputs + [window]),
            valid.reshape(outputs + [window]), outputs)


def _window_average(x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                    dims: int) -> torch.Tensor:
    windows, _, valid, _ = _gathered(x, positions, valid, dims)
    total = torch.sum(torch.where(valid, windows, torch.zeros_like(windows)), -1)
    return total / torch.sum(valid, -1).to(x.dtype)


def _window_max(x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                dims: int) -> Tuple[torch.Tensor, torch.Tensor]:
    # PyTorch's index is the first maximum in the window's row-major order, or the last NaN
    # where there is one; positions outside the window (padding, repeats) take no part.
    windows, flat_positions, valid, _ = _gathered(x, positions, valid, dims)
    window = flat_positions.size(-1)
    windows = torch.where(valid, windows, torch.full_like(windows, float("-inf")))
    values = torch.amax(windows, -1, True)
    order = torch.arange(window, device=x.device)
    first_max = torch.amin(torch.where(valid & (windows == values), order, window), -1, True)
    last_nan = torch.amax(torch.where(torch.isnan(windows), order, -1), -1, True)
    chosen = torch.where(last_nan >= 0, last_nan, first_max)
    indices = torch.gather(flat_positions.expand(windows.shape), -1, chosen).squeeze(-1)
    return values.squeeze(-1), indices


def _adaptive_average(x: torch.Tensor, outputs: List[int]) -> torch.Tensor:
    positions, valid = _adaptive_windows(x, outputs)
    return _window_average(x, positions, valid, len(outputs))


def _adaptive_max(x: torch.Tensor, outputs: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    positions, valid = _adaptive_windows(x, outputs)
    return _window_max(x, positions, valid, len(outputs))


def _per_dim(values: List[int], dims: int, default: List[int]) -> List[int]:
    if len(values) == 0:
        return default
    if len(values) == 1:
        expanded: List[int] = []
        for _ in range(dims):
            expanded.append(values[0])
        return expanded
    return values


def _max_pool_with_indices(x: torch.Tensor, kernel_size: List[int], stride: List[int],
                           padding: List[int], dilation: List[int], ceil_mode: bool,
                           dims: int) -> Tuple[torch.Tensor, torch.Tensor]:
    kernel = _per_dim(kernel_size, dims, kernel_size)
    steps = _per_dim(stride, dims, kernel)
    pads = _per_dim(padding, dims, padding)
    dilations = _per_dim(dilation, dims, dilation)
    sizes = x.shape[x.dim() - dims:]
    per_dim: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for d in range(dims):
        span = dilations[d] * (kernel[d] - 1) + 1
        reach = sizes[d] + 2 * pads[d] - span
        count = (reach + steps[d] - 1) // steps[d] + 1 if ceil_mode else reach // steps[d] + 1
        if ceil_mode and (count - 1) * steps[d] >= sizes[d] + pads[d]:
            count -= 1   # a last window may not start in the right padding
        per_dim.append(_strided_dim(sizes[d], count, kernel[d], steps[d], pads[d],
                                    dilations[d], x.device))
    positions, valid = _combined(per_dim, sizes, dims)
    return _window_max(x, positions, valid, dims)


@_builtin("aten::max_pool3d_with_indices", shapes="static")
def _max_pool3d_with_indices(self: torch.Tensor, kernel_size: List[int],
                             stride: List[int] = (), padding: List[int] = (0,),
                             dilation: List[int] = (1,), ceil_mode: bool = False
                             ) -> Tuple[torch.Tensor, torch.Tensor]:
    if self.is_floating_point():
        values, indices = _max_pool_with_indices(self, kernel_size, stride, padding,
                                                 dilation, ceil_mode, 3)
    else:   # padding is -inf in the gather: integers keep PyTorch's op
        values, indices = torch._C._nn.max_pool3d_with_indices(self, kernel_size, stride,
                                                               padding, dilation, ceil_mode)
    return values, indices


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


def _max_unpool(x: torch.Tensor, indices: torch.Tensor, output_size: List[int],
                dims: int) -> torch.Tensor:
    """Each value written at its flat position in its plane of the output: a scatter over
    the flattened spatial dims, zeros elsewhere. (Eager raises for a position outside the
    output, and so does the example run, with the scatter's message; compiled code given
    one later skips it, as it does for any scatter.)"""
    lead = x.shape[:-dims]
    plane = 1
    for size in output_size:
        plane = plane * size
    values = x.flatten(x.dim() - dims)
    positions = indices.flatten(indices.dim() - dims)
    out = torch.zeros(lead + [plane], dtype=x.dtype, device=x.device)
    return out.scatter(-1, positions, values).reshape(lead + output_size)


@_builtin("aten::max_unpool2d")
def _max_unpool2d(self: torch.Tensor, indices: torch.Tensor,
                  output_size: List[int]) -> torch.Tensor:
    return _max_unpool(self, indices, output_size, 2)


@_builtin("aten::max_unpool3d")
def _max_unpool3d(self: torch.Tensor, indices: torch.Tensor, output_size: List[int],
                  stride: List[int], padding: List[int]) -> torch.Tensor:
    # stride and padding only check the sizes in eager; the positions are the indices'.
    return _max_unpool(self, indices, output_size, 3)
