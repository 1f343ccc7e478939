"""Decompositions of ops that move elements without computing new values: padding (F.pad's
modes), diagonals, channel shuffles, prims' collapse.

Torch-MLIR lowers none of them to StableHLO. Each becomes a gather (index_select) with
indices computed from `arange`, which constant propagation folds to a constant for static
shapes, or a reshape of a copy; the gathers compile and fuse with their neighbours.
Results that PyTorch returns as new tensors end in a copy, so that the engine's fresh
result is what PyTorch returns too (a reshape alone may be a view of the input, which
stays outside engines). Imported by blade.frontend.decompositions, which owns the registry.
"""
from typing import List, Optional

import torch

from blade.frontend.decompositions import _builtin


def _pad_by_index(x: torch.Tensor, padding: List[int], mode: str) -> torch.Tensor:
    # padding holds (before, after) pairs from the last dim backwards. Each dim is a
    # gather of source positions p - before: mirrored about both ends without repeating
    # the edge (reflect), clamped to the edge (replicate) or wrapped around (circular).
    for pair in range(len(padding) // 2):
        dim = x.dim() - 1 - pair
        before, after = padding[2 * pair], padding[2 * pair + 1]
        size = x.size(dim)
        source = torch.arange(size + before + after, device=x.device) - before
        if mode == "reflect":
            if before >= size or after >= size:
                # The mirror would wrap around: PyTorch refuses it, and so does this.
                raise RuntimeError("reflection padding: padding size should be less than "
                                   "the corresponding input dimension")
            last = size - 1
            source = last - torch.abs(last - torch.abs(source))
        elif mode == "replicate":
            source = torch.clamp(source, 0, size - 1)
        else:
            if before > size or after > size:
                raise RuntimeError("circular padding: padding value causes wrapping around "
                                   "more than once")
            source = torch.remainder(source, size)
        x = torch.index_select(x, dim, source)
    return x


@_builtin("aten::pad")
def _pad(self: torch.Tensor, pad: List[int], mode: str = "constant",
         value: Optional[float] = None) -> torch.Tensor:
    # F.pad: constant padding is an op Torch-MLIR lowers; the others are the gathers above,
    # for the ranks PyTorch pads (one or two more than the padded dims: with and without a
    # batch); other ranks keep the op, which raises PyTorch's error.
    if mode == "constant":
        return torch.constant_pad_nd(self, pad, 0.0 if value is None else value)
    padded_dims = len(pad) // 2
    if len(pad) % 2 == 0 and 1 <= padded_dims <= 3 and value is None and \
            (self.dim() == padded_dims + 1 or self.dim() == padded_dims + 2) and \
            (mode == "reflect" or mode == "replicate" or mode == "circular"):
        return _pad_by_index(self, pad, mode)
    return torch.ops.aten.pad(self, pad, mode, value)


@_builtin("aten::reflection_pad1d")
def _reflection_pad1d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "reflect")


@_builtin("aten::reflection_pad2d")
def _reflection_pad2d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "reflect")


@_builtin("aten::reflection_pad3d")
def _reflection_pad3d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "reflect")


@_builtin("aten::replication_pad1d")
def _replication_pad1d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "replicate")


@_builtin("aten::replication_pad2d")
def _replication_pad2d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "replicate")


@_builtin("aten::replication_pad3d")
def _replication_pad3d(self: torch.Tensor, padding: List[int]) -> torch.Tensor:
    return _pad_by_index(self, padding, "replicate")


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
    size = self.size(-1) + abs(offset)
    positions = torch.arange(size, device=self.device)
    rows = positions.unsqueeze(-1)
    on_diagonal = positions - rows == offset
    source = torch.clamp(torch.minimum(rows, positions), 0, self.size(-1) - 1)
    values = torch.index_select(self, -1, source.reshape(-1))
    shape = self.shape[:-1] + [size, size]
    square = torch.where(on_diagonal, values.reshape(shape), torch.zeros_like(values).reshape(shape))
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


@_builtin("prims::collapse")
def _collapse(a: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # prims' reshape of dims start..end into one; a new tensor, as the prim returns.
    return torch.flatten(a, start, end).clone()
