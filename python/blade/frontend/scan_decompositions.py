"""Decompositions of scans, order statistics, norms and products that neither Blade nor
Torch-MLIR lowers to StableHLO: cumprod, kthvalue, norm.Scalar, conv_tbc, and prims'
reductions and casts.

A cumulative product of up to 16 elements is eager's running product, step by step in its
order and accumulation type, unrolled for the dim's size once the shapes are known (static
shapes only). The k-th smallest of up to 256 values is the k-th of a sort. Longer ones call
the op itself (PyTorch's kernel, a kernel call inside an engine): the unrolled scan and the
sort would cost more than eager's single pass.
Imported by blade.frontend.decompositions.
"""
from typing import List, Optional, Tuple, Union

import torch

from blade.frontend.decomposition_registry import builtin as _builtin

@_builtin("aten::cumprod", shapes="static")
def _cumprod(self: torch.Tensor, dim: int, dtype: Optional[int] = None) -> torch.Tensor:
    # Eager's running product, in its order and its accumulation type (double for float,
    # float for half and bfloat16), each prefix cast to the result's dtype: integers and
    # bools multiply in int64, a given dtype is cast to first.
    if dtype is not None:
        y = self.to(dtype)
    elif self.is_floating_point() or self.is_complex():
        y = self
    else:
        y = self.to(torch.int64)
    if y.dim() == 0 or y.size(dim) == 0:
        return y.clone()
    n = y.size(dim)
    # Up to 16 steps, unrolled (a longer scan calls the op itself, PyTorch's kernel).
    if n > 16 or y.is_complex():
        return torch.cumprod(y, dim)
    accumulated = y
    if y.dtype == torch.float32:
        accumulated = y.to(torch.float64)
    elif y.dtype == torch.float16 or y.dtype == torch.bfloat16:
        accumulated = y.to(torch.float32)
    running = accumulated.narrow(dim, 0, 1)
    prefixes: List[torch.Tensor] = [running.to(y.dtype)]
    for k in range(1, 16):
        if k < n:
            running = running * accumulated.narrow(dim, k, 1)
            prefixes.append(running.to(y.dtype))
    return torch.cat(prefixes, dim)


@_builtin("aten::kthvalue")
def _kthvalue(self: torch.Tensor, k: int, dim: int = -1,
              keepdim: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    if self.dim() == 0:
        if k != 1:
            raise RuntimeError("kthvalue(): selected number k out of range for dimension 0")
        return self.clone(), torch.zeros_like(self, dtype=torch.int64)
    size = self.size(dim)
    if size > 256:
        # A sort costs n log n where eager's selection costs n: longer rows call the op.
        values, indices = torch.kthvalue(self, k, dim, keepdim)
        return values, indices
    if k < 1 or k > size:
        raise RuntimeError("kthvalue(): selected number k out of range for dimension " +
                           str(dim))
    # NaN sorts last, as it counts largest in eager's selection. Among equal values eager
    # names no particular position (its quickselect's), nor does the sort: the value is
    # eager's, the position one that holds it.
    values, indices = torch.sort(self, dim)
    values, indices = values.narrow(dim, k - 1, 1), indices.narrow(dim, k - 1, 1)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@_builtin("aten::norm.Scalar")
def _norm(self: torch.Tensor, p: Union[int, float, complex] = 2) -> torch.Tensor:
    return torch.linalg.vector_norm(self, p)


@_builtin("aten::conv_tbc")
def _conv_tbc(self: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
              pad: int = 0) -> torch.Tensor:
    # Time x batch x channels in, weight [kernel, in, out]: conv1d of batch x channels x time
    # (shorter than the kernel, eager gives an empty result, which conv1d refuses).
    if self.size(0) + 2 * pad < weight.size(0):
        return torch.conv_tbc(self, weight, bias, pad)
    out = torch.conv1d(self.permute(1, 2, 0), weight.permute(2, 1, 0), bias, 1, [pad])
    return out.permute(2, 0, 1).contiguous()


@_builtin("prims::convert_element_type")
def _convert_element_type(a: torch.Tensor, dtype: int) -> torch.Tensor:
    return torch.ops.aten._to_copy(a, dtype=dtype)


@_builtin("prims::sum")
def _prims_sum(inp: torch.Tensor, dims: Optional[List[int]],
               output_dtype: Optional[int] = None) -> torch.Tensor:
    # Eager runs torch.sum's kernel: no dims (or none given) sums everything, integers to
    # int64.
    if dims is None:
        return torch.sum(inp, dtype=output_dtype)
    return torch.sum(inp, dims, dtype=output_dtype)


@_builtin("prims::prod")
def _prims_prod(inp: torch.Tensor, dims: Optional[List[int]],
                output_dtype: Optional[int] = None) -> torch.Tensor:
    # Eager: the product over `dims` (no dims: a copy), integers to int64.
    if output_dtype is not None:
        inp = inp.to(output_dtype)
    if dims is None:
        return torch.prod(inp)
    if len(dims) == 0:
        return inp.clone()
    # The reduced dims moved last and flattened into one, which prod reduces.
    order: List[int] = []
    for d in range(inp.dim()):
        if d not in dims:
            order.append(d)
    for d in range(inp.dim()):
        if d in dims:
            order.append(d)
    return torch.prod(inp.permute(order).flatten(inp.dim() - len(dims)), -1)
