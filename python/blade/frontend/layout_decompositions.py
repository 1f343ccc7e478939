"""Decompositions of ops that move elements without computing new values: padding (F.pad's
modes), diagonals, channel shuffles, prims' collapse.

Torch-MLIR lowers none of them to StableHLO. Padding becomes slices of the input joined
by cat (copies of whole rows); the others a gather (index_select) with indices computed
from `arange`, which constant propagation folds to a constant for static shapes, or a
reshape of a copy; they compile and fuse with their neighbours.
Results that PyTorch returns as new tensors end in a copy, so that the engine's fresh
result is what PyTorch returns too (a reshape alone may be a view of the input, which
stays outside engines). Imported by blade.frontend.decompositions.
"""
import math
from typing import List, Optional, Tuple

import torch

from blade.frontend.decomposition_registry import builtin as _builtin


def _pad_by_slices(x: torch.Tensor, padding: List[int], mode: str) -> torch.Tensor:
    # padding holds (before, after) pairs from the last dim backwards, at most 3 (F.pad's
    # modes but constant pad 1 to 3 dims). Written out rather than a loop, which TorchScript
    # keeps for a body this size: its ops would see other sizes each time round.
    pairs = len(padding) // 2
    if pairs >= 1:
        x = _pad_dim(x, x.dim() - 1, padding[0], padding[1], mode)
    if pairs >= 2:
        x = _pad_dim(x, x.dim() - 2, padding[2], padding[3], mode)
    if pairs >= 3:
        x = _pad_dim(x, x.dim() - 3, padding[4], padding[5], mode)
    return x


def _pad_dim(x: torch.Tensor, dim: int, before: int, after: int, mode: str) -> torch.Tensor:
    # Dim `dim` joined from slices of itself (cat): mirrored about both ends without
    # repeating the edge (reflect, a flipped slice), the edge repeated (replicate, a gather
    # of it) or wrapped around (circular, the other end's slice). Whole rows are copied; as
    # gathers of computed positions (index_select), element by element, ReflectionPad2d(3)
    # over 64 x 112 x 112 ran several times slower than eager.
    size = x.size(dim)
    if mode == "reflect" and (before >= size or after >= size):
        # The mirror would wrap around: PyTorch refuses it, and so does this.
        raise RuntimeError("reflection padding: padding size should be less than "
                           "the corresponding input dimension")
    if mode == "circular" and (before > size or after > size):
        raise RuntimeError("circular padding: padding value causes wrapping around "
                           "more than once")
    if before < 0 or after < 0 or size == 0:
        # PyTorch crops there (or has nothing to copy): the gather of the kept positions.
        source = torch.arange(size + before + after, device=x.device) - before
        if mode == "reflect":
            last = size - 1
            source = last - torch.abs(last - torch.abs(source))
        elif mode == "replicate":
            source = torch.clamp(source, 0, size - 1)
        else:
            source = torch.remainder(source, size)
        return torch.index_select(x, dim, source)
    if before == 0 and after == 0:
        return x
    parts: List[torch.Tensor] = []
    if before > 0:
        parts.append(_pad_side(x, dim, size, before, mode, True))
    parts.append(x)
    if after > 0:
        parts.append(_pad_side(x, dim, size, after, mode, False))
    return torch.cat(parts, dim)


def _pad_side(x: torch.Tensor, dim: int, size: int, width: int, mode: str,
              first: bool) -> torch.Tensor:
    """The `width` positions padded before (`first`) or after `x` along `dim`."""
    if mode == "reflect":
        return x.narrow(dim, 1 if first else size - 1 - width, width).flip([dim])
    if mode == "replicate":  # the edge gathered `width` times
        edge = torch.full([width], 0 if first else size - 1, dtype=torch.long,
                          device=x.device)
        return torch.index_select(x, dim, edge)
    return x.narrow(dim, size - width if first else 0, width)


@_builtin("aten::pad")
def _pad(self: torch.Tensor, pad: List[int], mode: str = "constant",
         value: Optional[float] = None) -> torch.Tensor:
    # F.pad: constant padding is an op Torch-MLIR lowers; the others are the gathers above,
    # for the ranks PyTorch pads (one or two more than the padded dims: with and without a
    # batch); other ranks keep the op, which raises PyTorch's error.
    if mode == "constant":
        return torch.constant_pad_nd(self, pad, 0.0 if value is None else value)
    padded_dims = len(pad) // 2
    if mode == "circular" and min(pad) < 0:
        return torch.ops.aten.pad(self, pad, mode, value)   # PyTorch crops, then wraps
    if len(pad) % 2 == 0 and 1 <= padded_dims <= 3 and value is None and \
            (self.dim() == padded_dims + 1 or self.dim() == padded_dims + 2) and \
            (mode == "reflect" or mode == "replicate" or mode == "circular"):
        return _pad_by_slices(self, pad, mode)
    return torch.ops.aten.pad(self, pad, mode, value)


@_builtin("aten::reflection_pad1d")
def _reflection_pad1d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "reflect")


@_builtin("aten::reflection_pad2d")
def _reflection_pad2d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "reflect")


@_builtin("aten::reflection_pad3d")
def _reflection_pad3d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "reflect")


@_builtin("aten::replication_pad1d")
def _replication_pad1d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "replicate")


@_builtin("aten::replication_pad2d")
def _replication_pad2d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "replicate")


@_builtin("aten::replication_pad3d")
def _replication_pad3d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_slices(self, padding, "replicate")


@_builtin("aten::diag")
def _diag(self: torch.Tensor, diagonal: int = 0) -> torch.Tensor:
    if self.dim() == 1:
        # A vector on the diagonal-th diagonal of a square matrix of zeros.
        return torch.diag_embed(self, diagonal, 0, 1)
    # The diagonal of a matrix, a copy: a gather from the flattened matrix.
    rows, cols = self.size(0), self.size(1)
    first_row = max(-diagonal, 0)
    first_col = max(diagonal, 0)
    length = max(min(rows - first_row, cols - first_col), 0)
    steps = torch.arange(length, device=self.device)
    return torch.index_select(self.reshape(-1), 0,
                              (steps + first_row) * cols + steps + first_col)


@_builtin("aten::diag_embed")
def _diag_embed(self: torch.Tensor, offset: int = 0, dim1: int = -2,
                dim2: int = -1) -> torch.Tensor:
    # The last dim of `self` on the offset-th diagonal of new dims (dim1, dim2): first as
    # the result's last two dims, element (r, c) = self[..., min(r, c)] where c - r is the
    # offset, else zero; then moved to where dim1 and dim2 ask.
    if self.size(-1) == 0:
        return torch.diag_embed(self, offset, dim1, dim2)   # all zeros: nothing to place
    size = self.size(-1) + abs(offset)
    positions = torch.arange(size, device=self.device)
    rows = positions.unsqueeze(-1)
    on_diagonal = positions - rows == offset
    source = torch.clamp(torch.minimum(rows, positions), 0, self.size(-1) - 1)
    values = torch.index_select(self, -1, source.reshape(-1))
    shape = self.shape[:-1] + [size, size]
    square = torch.where(on_diagonal, values.reshape(shape),
                         torch.zeros_like(values).reshape(shape))
    rank = square.dim()
    first = dim1 + rank if dim1 < 0 else dim1
    second = dim2 + rank if dim2 < 0 else dim2
    if first == rank - 2 and second == rank - 1:
        return square
    order: List[int] = []
    batch = 0
    for position in range(rank):
        if position == first:
            order.append(rank - 2)
        elif position == second:
            order.append(rank - 1)
        else:
            order.append(batch)
            batch += 1
    return square.permute(order).clone()


@_builtin("aten::channel_shuffle")
def _channel_shuffle(self: torch.Tensor, groups: int) -> torch.Tensor:
    # ShuffleNet's shuffle: channels as [groups, channels / groups], transposed.
    shape = self.shape
    grouped = self.reshape([shape[0], groups, shape[1] // groups] + shape[2:])
    return grouped.transpose(1, 2).reshape(shape).clone()


@_builtin("aten::im2col", shapes="static")
def _im2col(self: torch.Tensor, kernel_size: List[int], dilation: List[int],
            padding: List[int], stride: List[int]) -> torch.Tensor:
    # nn.Unfold: every kernel offset's strided slice of the padded image, stacked after the
    # channels: [N, C * kh * kw, blocks]. Up to 64 offsets: larger kernels call the op (a
    # slice each would make a long graph to compile).
    if kernel_size[0] * kernel_size[1] > 64:
        return torch.ops.aten.im2col(self, kernel_size, dilation, padding, stride)
    x = self if self.dim() == 4 else self.unsqueeze(0)
    x = torch.constant_pad_nd(x, [padding[1], padding[1], padding[0], padding[0]], 0)
    rows = (x.size(2) - dilation[0] * (kernel_size[0] - 1) - 1) // stride[0] + 1
    cols = (x.size(3) - dilation[1] * (kernel_size[1] - 1) - 1) // stride[1] + 1
    offsets: List[torch.Tensor] = []
    for i in range(kernel_size[0]):
        for j in range(kernel_size[1]):
            top, left = i * dilation[0], j * dilation[1]
            offsets.append(x[:, :, top:top + stride[0] * (rows - 1) + 1:stride[0],
                             left:left + stride[1] * (cols - 1) + 1:stride[1]])
    blocks = torch.stack(offsets, 2).reshape(
        [x.size(0), x.size(1) * kernel_size[0] * kernel_size[1], rows * cols])
    return blocks if self.dim() == 4 else blocks.squeeze(0)


@_builtin("prims::collapse")
def _collapse(a: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # prims' reshape of dims start..end into one; a new tensor, as the prim returns.
    return torch.flatten(a, start, end).clone()


# Resampling (F.interpolate's nearest and (bi)linear modes) as gathers of source positions
# that PyTorch's kernels compute (UpSample.h), in float32 as they do (float64 for float64
# input): static shapes, where the positions fold to constants. With dynamic shapes only
# nearest upsampling by whole factors compiles.

def _scale(in_size: int, out_size: int, scale: Optional[float],
           dtype: torch.dtype) -> torch.Tensor:
    # compute_scales_value: 1 / the given scale, else input size / output size.
    if scale is not None and scale > 0:
        return torch.full([], 1.0 / scale, dtype=dtype)
    return torch.full([], in_size, dtype=dtype) / out_size


def _nearest_source(in_size: int, out_size: int, scale: Optional[float],
                    dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    positions = torch.arange(out_size, device=device)
    if out_size == in_size:
        return positions
    if out_size == 2 * in_size:
        return torch.div(positions, 2, rounding_mode="floor")
    source = torch.floor(positions.to(dtype) * _scale(in_size, out_size, scale, dtype))
    return torch.clamp(source.to(torch.long), 0, in_size - 1)


def _linear_source(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
                   dtype: torch.dtype, device: torch.device
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per output position: the lower source position, the upper one, and the upper's
    weight (area_pixel_compute_source_index and its lambda)."""
    positions = torch.arange(out_size, device=device).to(dtype)
    if align_corners:
        ratio = torch.full([], in_size - 1, dtype=dtype) / (out_size - 1) if out_size > 1 \
            else torch.zeros([], dtype=dtype)
        source = positions * ratio
    else:
        source = torch.clamp_min(
            _scale(in_size, out_size, scale, dtype) * (positions + 0.5) - 0.5, 0.0)
    lower = torch.clamp(torch.floor(source).to(torch.long), 0, in_size - 1)
    upper = lower + (lower < in_size - 1).to(torch.long)
    weight = torch.clamp(source - lower.to(dtype), 0.0, 1.0)
    return lower, upper, weight


def _output_sizes(x: torch.Tensor, output_size: Optional[List[int]],
                  scale_factors: Optional[List[float]], dims: int) -> List[int]:
    if output_size is not None:
        return output_size
    assert scale_factors is not None
    sizes: List[int] = []
    for d in range(dims):
        sizes.append(int(math.floor(x.size(x.dim() - dims + d) * scale_factors[d])))
    return sizes


def _nearest(x: torch.Tensor, sizes: List[int], scales: List[Optional[float]],
             dims: int) -> torch.Tensor:
    # `dims` is a constant of the caller's: the loop unrolls before types are recorded.
    # The kernel's arithmetic is float64 for float64 input, else float32.
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    for d in range(dims):
        dim = x.dim() - dims + d
        x = torch.index_select(x, dim, _nearest_source(x.size(dim), sizes[d], scales[d],
                                                       compute, x.device))
    return x


def _linear(x: torch.Tensor, sizes: List[int], align_corners: bool,
            scales: List[Optional[float]], dims: int) -> torch.Tensor:
    # Separable, the last dim first: h0 * (w0 * x00 + w1 * x01) + h1 * (...), PyTorch's
    # order of operations. The dims (1 or 2) are written out: a loop with this body stays a
    # TorchScript loop, whose ops see other sizes each time round and do not compile.
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x if x.dtype == compute else x.to(compute)
    y = _linear_dim(y, y.dim() - 1, sizes[dims - 1], align_corners, scales[dims - 1])
    if dims == 2:
        y = _linear_dim(y, y.dim() - 2, sizes[0], align_corners, scales[0])
    return y if x.dtype == compute else y.to(x.dtype)


def _linear_dim(y: torch.Tensor, dim: int, size: int, align_corners: bool,
                scale: Optional[float]) -> torch.Tensor:
    if not align_corners and size == 2 * y.size(dim) and y.size(dim) >= 2 and \
            (scale is None or scale == 2.0):
        return _linear_double(y, dim)
    lower, upper, weight = _linear_source(y.size(dim), size, align_corners, scale, y.dtype,
                                          y.device)
    weight = weight.reshape([-1] + [1] * (y.dim() - 1 - dim))
    return torch.index_select(y, dim, lower) * (1 - weight) + \
        torch.index_select(y, dim, upper) * weight


def _linear_double(y: torch.Tensor, dim: int) -> torch.Tensor:
    # Twice the size along `dim` (align_corners=False): output 2k is 0.25 y[k-1] + 0.75 y[k]
    # (output 0: 1 y[0] + 0 y[1]) and 2k+1 is 0.75 y[k] + 0.25 y[k+1] (the last: 0.75 y[n-1]
    # + 0.25 y[n-1]), _linear_source's positions and weights, exact in binary, in its order
    # of operations: shifted slices, not gathers. Along the last dim the gathers ran
    # element by element, an upsampling of 64 x 112 x 112 three times slower than eager.
    size = y.size(dim)
    rest = size - 1
    head = y.narrow(dim, 0, 1) * 1.0 + y.narrow(dim, 1, 1) * 0.0
    even = torch.cat([head, y.narrow(dim, 0, rest) * 0.25 + y.narrow(dim, 1, rest) * 0.75],
                     dim)
    last = y.narrow(dim, rest, 1)
    odd = torch.cat([y.narrow(dim, 0, rest) * 0.75 + y.narrow(dim, 1, rest) * 0.25,
                     last * 0.75 + last * 0.25], dim)
    return torch.stack([even, odd], dim + 1).flatten(dim, dim + 1)


def _vec_scales(scale_factors: Optional[List[float]], dims: int) -> List[Optional[float]]:
    scales: List[Optional[float]] = []
    for d in range(dims):
        scales.append(None if scale_factors is None else scale_factors[d])
    return scales


@_builtin("aten::upsample_nearest1d", shapes="static")
def _upsample_nearest1d(self: torch.Tensor, output_size: List[int],
                        scales: Optional[float] = None) -> torch.Tensor:
    return _nearest(self, output_size, [scales], 1)


@_builtin("aten::upsample_nearest1d.vec", shapes="static")
def _upsample_nearest1d_vec(input: torch.Tensor, output_size: Optional[List[int]],
                            scale_factors: Optional[List[float]]) -> torch.Tensor:
    return _nearest(input, _output_sizes(input, output_size, scale_factors, 1),
                    _vec_scales(scale_factors, 1), 1)


@_builtin("aten::upsample_nearest2d", shapes="static")
def _upsample_nearest2d(self: torch.Tensor, output_size: List[int],
                        scales_h: Optional[float] = None,
                        scales_w: Optional[float] = None) -> torch.Tensor:
    return _nearest(self, output_size, [scales_h, scales_w], 2)


def _repeated_pixels(x: torch.Tensor, output_size: Optional[List[int]],
                     scale_factors: Optional[List[float]]) -> Optional[torch.Tensor]:
    # Nearest upsampling by whole factors (a U-Net's or an FPN's x2) repeats each pixel: a
    # broadcast and a reshape, which fuse with their neighbours (codegen writes them into
    # a concatenation in place) whatever the image size. None for other sizes.
    if output_size is None and scale_factors is not None and x.dim() == 4:
        factor_h, factor_w = scale_factors[0], scale_factors[1]
        if factor_h == math.floor(factor_h) and factor_w == math.floor(factor_w) and \
                factor_h >= 1.0 and factor_w >= 1.0:
            n, c, h, w = x.size(0), x.size(1), x.size(2), x.size(3)
            repeat_h, repeat_w = int(factor_h), int(factor_w)
            grid = x.reshape([n, c, h, 1, w, 1]).expand([n, c, h, repeat_h, w, repeat_w])
            return grid.reshape([n, c, h * repeat_h, w * repeat_w])
    return None


@_builtin("aten::upsample_nearest2d.vec", shapes="static")
def _upsample_nearest2d_vec(input: torch.Tensor, output_size: Optional[List[int]],
                            scale_factors: Optional[List[float]]) -> torch.Tensor:
    repeated = _repeated_pixels(input, output_size, scale_factors)
    if repeated is not None:
        return repeated
    return _nearest(input, _output_sizes(input, output_size, scale_factors, 2),
                    _vec_scales(scale_factors, 2), 2)


@_builtin("aten::upsample_nearest2d.vec", shapes="dynamic")
def _upsample_nearest2d_vec_dynamic(input: torch.Tensor, output_size: Optional[List[int]],
                                    scale_factors: Optional[List[float]]) -> torch.Tensor:
    # With constant factors, constant propagation keeps one branch; other sizes keep the op.
    repeated = _repeated_pixels(input, output_size, scale_factors)
    if repeated is not None:
        return repeated
    return torch._C._nn.upsample_nearest2d(input, output_size, scale_factors)


@_builtin("aten::upsample_linear1d", shapes="static")
def _upsample_linear1d(self: torch.Tensor, output_size: List[int], align_corners: bool,
                       scales: Optional[float] = None) -> torch.Tensor:
    return _linear(self, output_size, align_corners, [scales], 1)


@_builtin("aten::upsample_linear1d.vec", shapes="static")
def _upsample_linear1d_vec(input: torch.Tensor, output_size: Optional[List[int]],
                           align_corners: bool,
                           scale_factors: Optional[List[float]]) -> torch.Tensor:
    return _linear(input, _output_sizes(input, output_size, scale_factors, 1), align_corners,
                   _vec_scales(scale_factors, 1), 1)


@_builtin("aten::upsample_bilinear2d", shapes="static")
def _upsample_bilinear2d(self: torch.Tensor, output_size: List[int], align_corners: bool,
                         scales_h: Optional[float] = None,
                         scales_w: Optional[float] = None) -> torch.Tensor:
    return _linear(self, output_size, align_corners, [scales_h, scales_w], 2)


@_builtin("aten::upsample_bilinear2d.vec", shapes="static")
def _upsample_bilinear2d_vec(input: torch.Tensor, output_size: Optional[List[int]],
                             align_corners: bool,
                             scale_factors: Optional[List[float]]) -> torch.Tensor:
    return _linear(input, _output_sizes(input, output_size, scale_factors, 2), align_corners,
                   _vec_scales(scale_factors, 2), 2)


@_builtin("aten::upsample_nearest2d_backward", shapes="static")
def _upsample_nearest2d_backward(grad_output: torch.Tensor, output_size: List[int],
                                 input_size: List[int], scales_h: Optional[float] = None,
                                 scales_w: Optional[float] = None) -> torch.Tensor:
    # Each input pixel's gradient sums the outputs that read it (the forward's source
    # positions): a scatter_add per dim, the last first.
    scales: List[Optional[float]] = [scales_h, scales_w]
    grad = grad_output
    for d in range(1, -1, -1):
        dim = 2 + d
        # float32 arithmetic whatever the dtype, as PyTorch's backward kernel.
        source = _nearest_source(input_size[dim], output_size[d], scales[d], torch.float32,
                                 grad.device)
        shape = [-1] + [1] * (1 - d)
        index = source.reshape(shape).expand(grad.shape)
        target = grad.shape
        target[dim] = input_size[dim]
        grad = torch.zeros(target, dtype=grad.dtype, device=grad.device).scatter_add(
            dim, index, grad)
    return grad
