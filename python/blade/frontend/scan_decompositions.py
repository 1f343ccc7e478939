"""Decompositions of scans, order statistics, norms and products that neither Blade nor
Torch-MLIR lowers to StableHLO: cumprod, kthvalue, norm.Scalar, _weight_norm_interface,
conv_tbc, prims' reductions and casts, and a shift by a Scalar.

A cumulative product is a scan: log2(n) steps, each multiplying every element by the one
`step` positions before it (ones before the start), so that after the steps each holds the
product of its whole prefix. The steps are unrolled for the dim's size, known once the
shapes are (static shapes only). The k-th smallest value is the k-th of a sort.
Imported by blade.frontend.decompositions.
"""
from typing import List, Optional, Tuple, Union

import torch

from blade.frontend.decomposition_registry import builtin as _builtin

@_builtin("aten::cumprod", shapes="static")
def _cumprod(self: torch.Tensor, dim: int, dtype: Optional[int] = None) -> torch.Tensor:
    # As eager: a given dtype is cast to first; integers and bools multiply in int64.
    if dtype is not None:
        y = self.to(dtype)
    elif self.is_floating_point() or self.is_complex():
        y = self
    else:
        y = self.to(torch.int64)
    if y.dim() == 0:
        return y.clone()
    n = y.size(dim)
    if n <= 1:
        return y.clone()
    # More steps than any dim has doublings: those past the dim's size fold away.
    for k in range(40):
        step = 1 << k
        if step < n:
            before = torch.cat([torch.ones_like(y.narrow(dim, 0, step)),
                                y.narrow(dim, 0, n - step)], dim)
            y = y * before
    return y


@_builtin("aten::kthvalue")
def _kthvalue(self: torch.Tensor, k: int, dim: int = -1,
              keepdim: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    if self.dim() == 0:
        if k != 1:
            raise RuntimeError("kthvalue(): selected number k out of range for dimension 0")
        return self.clone(), torch.zeros_like(self, dtype=torch.int64)
    size = self.size(dim)
    if k < 1 or k > size:
        raise RuntimeError("kthvalue(): selected number k out of range for dimension " +
                           str(dim))
    # NaN sorts last, as it counts largest in eager's selection. Among equal values eager
    # names no particular position, nor does the sort.
    values, indices = torch.sort(self, dim)
    values, indices = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@_builtin("aten::norm.Scalar")
def _norm(self: torch.Tensor, p: Union[int, float, complex] = 2) -> torch.Tensor:
    return torch.linalg.vector_norm(self, p)


@_builtin("aten::_weight_norm_interface")
def _weight_norm_interface(v: torch.Tensor, g: torch.Tensor,
                           dim: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    # v * g / ||v||, the norm over every dim but `dim` (over all of them for dim -1), kept
    # with size 1 in the dims it reduces, as eager returns it.
    if dim < -1:
        dim = dim + v.dim()
    reduced: List[int] = []
    for d in range(v.dim()):
        if d != dim:
            reduced.append(d)
    norm = torch.linalg.vector_norm(v, 2, reduced, True)
    return v * (g / norm), norm


@_builtin("aten::conv_tbc")
def _conv_tbc(self: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              pad: int = 0) -> torch.Tensor:
    # Time x batch x channels in, weight [kernel, in, out]: conv1d of batch x channels x time.
    out = torch.conv1d(self.permute(1, 2, 0), weight.permute(2, 1, 0), bias, 1, [pad])
    return out.permute(2, 0, 1).contiguous()


@_builtin("aten::__rshift__.Scalar")
def _rshift_scalar(self: torch.Tensor, other: Union[int, float, complex]) -> torch.Tensor:
    return torch.bitwise_right_shift(self, torch.full_like(self, other))


@_builtin("prims::convert_element_type")
def _convert_element_type(a: torch.Tensor, dtype: int) -> torch.Tensor:
    return torch.ops.aten._to_copy(a, dtype=dtype)


@_builtin("prims::sum")
def _prims_sum(inp: torch.Tensor, dims: Optional[List[int]],
               output_dtype: Optional[int] = None) -> torch.Tensor:
    # Over `dims` only (no dims: none), in the input's dtype unless another is given.
    if output_dtype is not None:
        inp = inp.to(output_dtype)
    if dims is None:
        total = torch.sum(inp)
    elif len(dims) == 0:
        return inp.clone()
    else:
        total = torch.sum(inp, dims)
    if not inp.is_floating_point() and not inp.is_complex():
        total = total.to(inp.dtype)
    return total


@_builtin("prims::prod")
def _prims_prod(inp: torch.Tensor, dims: Optional[List[int]],
                output_dtype: Optional[int] = None) -> torch.Tensor:
    if output_dtype is not None:
        inp = inp.to(output_dtype)
    if dims is None:
        total = torch.prod(inp)
    elif len(dims) == 0:
        return inp.clone()
    else:
        # The reduced dims moved last and flattened into one, which prod reduces.
        order: List[int] = []
        for d in range(inp.dim()):
            if d not in dims:
                order.append(d)
        for d in range(inp.dim()):
            if d in dims:
                order.append(d)
        total = torch.prod(inp.permute(order).flatten(inp.dim() - len(dims)), -1)
    if not inp.is_floating_point() and not inp.is_complex():
        total = total.to(inp.dtype)
    return total


def _pivots(a: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gaussian elimination of the matrices [..., n, n] with partial pivoting, as LAPACK's
    getrf orders it: whether each matrix's rows were swapped an odd number of times, and
    its pivots [..., n] (the diagonal of U; their product is the determinant up to sign).
    A zero pivot (a singular matrix) eliminates nothing below it."""
    n = a.size(-1)
    m = a
    odd = torch.zeros(a.shape[:-2], dtype=torch.bool, device=a.device)
    rows = torch.arange(n, device=a.device)
    pivots: List[torch.Tensor] = []
    # A constant count of steps (the callers eliminate up to 16 rows), unrolled before the
    # types are recorded: each step's sizes are its own.
    for k in range(16):
        if k < n:
            # The row at or below k with the largest magnitude in column k swaps with row k.
            chosen = torch.argmax(m.narrow(-2, k, n - k).select(-1, k).abs(), -1) + k
            chosen_row = chosen.unsqueeze(-1)
            order = torch.where(rows == k, chosen_row, torch.where(rows == chosen_row, k, rows))
            m = torch.gather(m, -2, order.unsqueeze(-1).expand(m.shape))
            odd = odd ^ (chosen != k)
            pivot = m.select(-2, k).select(-1, k)
            pivots.append(pivot)
            if k + 1 < n:
                lower = m.narrow(-2, k + 1, n - k - 1)
                divisor = pivot.unsqueeze(-1)
                factor = torch.where(divisor == 0, torch.zeros_like(divisor),
                                     lower.select(-1, k) / divisor)
                lower = lower - factor.unsqueeze(-1) * m.select(-2, k).unsqueeze(-2)
                m = torch.cat([m.narrow(-2, 0, k + 1), lower], -2)
    return odd, torch.stack(pivots, -1)


@_builtin("aten::linalg_det", shapes="static")
def _linalg_det(A: torch.Tensor) -> torch.Tensor:
    n = A.size(-1)
    # Matrices of up to 16 rows are eliminated in unrolled steps, one per row; larger ones
    # (and integers, and no rows) call the op itself: LAPACK, in TorchScript.
    if n > 16 or n == 0 or not A.is_floating_point():
        return torch.linalg.det(A)
    odd, pivots = _pivots(A)
    determinant = torch.prod(pivots, -1)
    return torch.where(odd, -determinant, determinant)


@_builtin("aten::linalg_slogdet", shapes="static")
def _linalg_slogdet(A: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    n = A.size(-1)
    if n > 16 or n == 0 or not A.is_floating_point():  # as for the determinant
        sign, logabsdet = torch.linalg.slogdet(A)
        return sign, logabsdet
    odd, pivots = _pivots(A)
    sign = torch.prod(torch.sign(pivots), -1)
    return torch.where(odd, -sign, sign), torch.sum(torch.log(pivots.abs()), -1)
