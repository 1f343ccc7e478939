"""Decompositions: an op rewritten in terms of other ops before clustering.

    @blade.register_decomposition("mylib::softplus2")
    def softplus2(x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.log1p(torch.exp(x * beta)) / beta

The function is scripted once, when registered; `blade.optimize` inlines its body in place
of every node calling that overload (C++ pass `_C.decompose`), before the types of the
graph are materialized, so the ops it is made of are clustered and converted like any other.
A user's decomposition replaces Blade's own for the same overload. Ops named in
`Config.excluded_ops` are not decomposed.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from blade import _C
from blade.graph_queries import constant_arguments, insert_op
from blade.frontend.decomposition_registry import (  # noqa: F401 (the registry's API)
    _BUILTIN, _BUILTIN_DYNAMIC, _USER, Decomposition, DecompositionError, _make)
from blade.frontend.decomposition_registry import builtin as _builtin


def register_decomposition(overload: str):
    """Decorator: rewrite every call of `overload` as the decorated function's body.

    Example:
        >>> @blade.register_decomposition("aten::logsumexp")
        ... def logsumexp(x: torch.Tensor, dim: List[int], keepdim: bool) -> torch.Tensor:
        ...     ...
    """
    def wrap(fn):
        _USER[overload] = _make(overload, fn, builtin=False)
        return fn
    return wrap


def unregister_decomposition(overload: str) -> None:
    """Removes the user's decomposition of `overload` (Blade's own, if any, applies again)."""
    _USER.pop(overload, None)


def active(dynamic: bool = False) -> Dict[str, Decomposition]:
    """The decompositions by overload, for static shapes or (`dynamic`) dynamic ones."""
    return {**_BUILTIN, **(_BUILTIN_DYNAMIC if dynamic else {}), **_USER}


def _undefined_attention_weights(graph: torch._C.Graph) -> None:
    """nn.MultiheadAttention's fast path asked for no weights, with no mask, returns them
    undefined (None in Python), through the branches and tuples of its forward: their
    readers read an undefined tensor of their own instead (`prim::AutogradZero`, which the
    interpreter runs as one), so that the op's result is unread and its decomposition
    applies."""
    for node in graph.findAllNodes("aten::_native_multi_head_attention", True):
        mask, need_weights = node.inputsAt(9), node.inputsAt(10)
        weights = node.outputsAt(1)
        if not weights.uses() or need_weights.node().kind() != "prim::Constant" or \
                need_weights.toIValue() is not False or \
                mask.node().kind() != "prim::Constant" or mask.toIValue() is not None:
            continue
        undefined = graph.create("prim::AutogradZero")
        undefined.insertBefore(node)
        undefined.output().setType(weights.type())
        weights.replaceAllUsesWith(undefined.output())


def decompose(graph: torch._C.Graph, excluded_ops: Sequence[str] = (),
              dynamic: bool = False) -> Dict[str, int]:
    """Applies every active decomposition to `graph`; returns overload -> nodes rewritten.
    With `dynamic`, those for dynamic shapes."""
    _undefined_attention_weights(graph)
    counts = {}
    if "aten::conv1d" not in excluded_ops and "aten::conv1d" not in _USER:
        count = conv1d_as_conv2d(graph)
        if count:
            counts["aten::conv1d"] = count
    for overload, decomposition in active(dynamic).items():
        kind = overload.split(".")[0]
        if overload in excluded_ops or kind in excluded_ops:
            continue
        if decomposition.static_only and dynamic:
            continue
        if graph.findNode(kind, True) is None:  # none to rewrite: not scripted for nothing
            continue
        count = _C.decompose(graph, overload, decomposition.graph,
                             list(decomposition.unused_results))
        if count:
            counts[overload] = count
    return counts


_CONV1D = ("aten::conv1d(Tensor input, Tensor weight, Tensor? bias=None, SymInt[1] "
           "stride=[1], SymInt[1] padding=[0], SymInt[1] dilation=[1], SymInt groups=1) "
           "-> Tensor")


def conv1d_as_conv2d(graph: torch._C.Graph) -> int:
    """Makes each `aten::conv1d` whose geometry is constant an `aten::conv2d` of the same
    values: the input [N, C, L] (or [C, L]) viewed with a dim of 1 before its last, the
    weight [O, C / groups, 1, k], stride, padding and dilation (1, s), (0, p), (1, d), the
    result's dim squeezed out again. The 2-d convolutions' library calls (and in int8, the
    int8 convolutions) then run it; a 1-d convolution compiled as loops of its own. A
    constant weight becomes a constant of the new shape under the weight's name, so that
    the report and Config.float_layers name the layer as before. Returns how many."""
    count = 0
    for node in graph.findAllNodes("aten::conv1d", True):
        if node.schema() != _CONV1D:
            continue
        arguments = constant_arguments(node)
        geometry = [arguments[name] for name in ("stride", "padding", "dilation")]
        groups = arguments["groups"]
        if not isinstance(groups, int) or any(
                len(g) != 1 or not isinstance(g[0], int) for g in geometry):
            continue
        (stride,), (padding,), (dilation,) = geometry
        weight = node.inputsAt(1)
        constant = weight.toIValue() if weight.node().kind() == "prim::Constant" else None
        with graph.insert_point_guard(node):
            image = insert_op(graph, "aten::unsqueeze", node.inputsAt(0), -2)
            if isinstance(constant, torch.Tensor):
                filters = graph.insertConstant(constant.unsqueeze(-2).contiguous())
            else:
                filters = insert_op(graph, "aten::unsqueeze", weight, -2)
            result = insert_op(graph, "aten::conv2d", image, filters, node.inputsAt(2),
                               [1, stride], [0, padding], [1, dilation], groups)
            squeezed = insert_op(graph, "aten::squeeze", result, -2)
        node.output().replaceAllUsesWith(squeezed)
        node.destroy()
        if isinstance(constant, torch.Tensor):
            name = weight.debugName()
            if not weight.uses():
                weight.node().destroy()
            filters.setDebugName(name)
        count += 1
    return count


# --- Blade's own -------------------------------------------------------------------------

@_builtin("aten::logsumexp")
def _logsumexp(x: torch.Tensor, dim: List[int], keepdim: bool) -> torch.Tensor:
    # The shift by the maximum keeps exp in range; a maximum of +-inf shifts by 0 instead,
    # so a row of -inf gives -inf and a +inf gives +inf, as PyTorch does.
    peak = torch.amax(x, dim, True)
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
    total = torch.sum(torch.exp(x - peak), dim, keepdim)
    return torch.log(total) + torch.reshape(peak, total.shape)


@_builtin("aten::tril", shapes="dynamic")
def _tril(x: torch.Tensor, diagonal: int) -> torch.Tensor:
    # Torch-MLIR lowers tril of static sizes only; a causal mask of a dynamic sequence
    # length needs it as index arithmetic.
    rows = torch.arange(x.size(-2), device=x.device).unsqueeze(-1)
    cols = torch.arange(x.size(-1), device=x.device)
    return x.masked_fill(cols > rows + diagonal, 0)


@_builtin("aten::triu", shapes="dynamic")
def _triu(x: torch.Tensor, diagonal: int) -> torch.Tensor:
    # As tril: the mask of future positions, triu(ones(L, L), 1), has a dynamic L.
    rows = torch.arange(x.size(-2), device=x.device).unsqueeze(-1)
    cols = torch.arange(x.size(-1), device=x.device)
    return x.masked_fill(cols < rows + diagonal, 0)


def _variance(x: torch.Tensor, dim: Optional[List[int]], unbiased: bool,
              keepdim: bool) -> torch.Tensor:
    # Torch-MLIR's var of a dynamic size asserts at run time that the correction fits the
    # count (torch.runtime.assert, which its StableHLO lowering does not take). Here the
    # count is a sum of ones, a tensor, so the whole computation compiles and fuses.
    centered = x - torch.mean(x, dim, True)
    count = torch.sum(torch.ones_like(x), dim, keepdim)
    if unbiased:
        # PyTorch divides by max(count - 1, 0): NaN (0 / 0) over one element or none,
        # where count - 1 gave -0 over none.
        count = torch.clamp_min(count - 1, 0.0)
    return torch.sum(centered * centered, dim, keepdim) / count


@_builtin("aten::var.dim", shapes="dynamic")
def _var_dim(x: torch.Tensor, dim: Optional[List[int]], unbiased: bool,
             keepdim: bool) -> torch.Tensor:
    return _variance(x, dim, unbiased, keepdim)


@_builtin("aten::std.dim", shapes="dynamic")
def _std_dim(x: torch.Tensor, dim: Optional[List[int]], unbiased: bool,
             keepdim: bool) -> torch.Tensor:
    return torch.sqrt(_variance(x, dim, unbiased, keepdim))


def _first_extreme(x: torch.Tensor, dim: int, keepdim: bool,
                   largest: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    # PyTorch's max/min along a dim: the extreme value and its first index, or NaN and the
    # first NaN's index where there is one (Torch-MLIR's lowering misses the NaN). The dim
    # is moved last, so the index order broadcasts whatever the rank.
    if x.dim() == 0:
        return x.clone(), torch.zeros_like(x, dtype=torch.long)
    if x.size(dim) == 0:
        raise RuntimeError("max(): expected a non-empty dim to reduce")
    moved = x.transpose(dim, -1)
    size = moved.size(-1)
    values = torch.amax(moved, -1, True) if largest else torch.amin(moved, -1, True)
    order = torch.arange(size, device=x.device)
    indices = torch.amin(torch.where(moved == values, order, size), -1, True)
    if x.is_floating_point():
        # The first NaN's index, its own reduction: the extreme's positions compared with
        # a value that itself depended on a NaN test made the fused loops four times slower
        # (max over [64, 32000] 1.08 -> 0.21 ms).
        first_nan = torch.amin(torch.where(moved != moved, order, size), -1, True)
        has_nan = first_nan < size
        values = torch.where(has_nan, torch.full_like(values, float("nan")), values)
        indices = torch.where(has_nan, first_nan, indices)
    values, indices = values.transpose(dim, -1), indices.transpose(dim, -1)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


@_builtin("aten::max.dim")
def _max_dim(self: torch.Tensor, dim: int,
             keepdim: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    values, indices = _first_extreme(self, dim, keepdim, True)
    return values, indices


@_builtin("aten::min.dim")
def _min_dim(self: torch.Tensor, dim: int,
             keepdim: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    values, indices = _first_extreme(self, dim, keepdim, False)
    return values, indices


def _ones_shape(x: torch.Tensor) -> torch.Tensor:
    # A zero of shape [1] * x.dim(), for a reduction over every dim kept as size 1.
    return torch.sum(torch.zeros_like(x, dtype=torch.long), None, True)


@_builtin("aten::argmax")
def _argmax(self: torch.Tensor, dim: Optional[int] = None,
            keepdim: bool = False) -> torch.Tensor:
    if dim is None:
        index = _first_extreme(self.reshape(-1), 0, False, True)[1]
        return index + _ones_shape(self) if keepdim else index
    return _first_extreme(self, dim, keepdim, True)[1]


@_builtin("aten::argmin")
def _argmin(self: torch.Tensor, dim: Optional[int] = None,
            keepdim: bool = False) -> torch.Tensor:
    if dim is None:
        index = _first_extreme(self.reshape(-1), 0, False, False)[1]
        return index + _ones_shape(self) if keepdim else index
    return _first_extreme(self, dim, keepdim, False)[1]


@_builtin("aten::_transformer_encoder_layer_fwd")
def _transformer_encoder_layer(
        src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
        qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
        use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
        norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
        ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
        ffn_bias_2: torch.Tensor, mask: Optional[torch.Tensor] = None,
        mask_type: Optional[int] = None) -> torch.Tensor:
    # nn.TransformerEncoderLayer's inference fast path, one fused native op that nothing
    # can compile, as the ops it is made of (PyTorch's transformer.cpp): self-attention and
    # the feed-forward block, each around a residual and a LayerNorm (before or after).
    # One function body, no helpers: the decomposition is inlined after call inlining.
    unbatched = src.dim() == 2
    x = src.unsqueeze(0) if unbatched else src
    batch, length = x.size(0), x.size(1)
    head = embed_dim // num_heads
    for block in range(2):
        residual = x
        if norm_first:
            if block == 0:
                x = torch.layer_norm(x, [embed_dim], norm_weight_1, norm_bias_1, eps)
            else:
                x = torch.layer_norm(x, [embed_dim], norm_weight_2, norm_bias_2, eps)
        if block == 0:
            q, k, v = torch.nn.functional.linear(x, qkv_weight, qkv_bias).chunk(3, -1)
            q = q.view(batch, length, num_heads, head).transpose(1, 2)
            k = k.view(batch, length, num_heads, head).transpose(1, 2)
            v = v.view(batch, length, num_heads, head).transpose(1, 2)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head))
            if mask is not None:
                m = mask
                if mask_type is not None and mask_type == 1:   # key padding, [batch, length]
                    m = m.view(batch, 1, 1, length)
                elif m.dim() == 2:                  # one mask for every sequence
                    m = m.view(1, 1, length, length)
                if m.dtype == torch.bool:           # True: masked out; made additive
                    scores = scores + torch.zeros(m.shape, dtype=scores.dtype,
                                                  device=x.device).masked_fill(m, float("-inf"))
                else:
                    scores = scores + m
            context = torch.matmul(torch.softmax(scores, -1), v)
            context = context.transpose(1, 2).reshape(batch, length, embed_dim)
            x = torch.nn.functional.linear(context, proj_weight, proj_bias)
        else:
            hidden = torch.nn.functional.linear(x, ffn_weight_1, ffn_bias_1)
            hidden = torch.nn.functional.gelu(hidden) if use_gelu else torch.relu(hidden)
            x = torch.nn.functional.linear(hidden, ffn_weight_2, ffn_bias_2)
        x = residual + x
        if not norm_first:
            if block == 0:
                x = torch.layer_norm(x, [embed_dim], norm_weight_1, norm_bias_1, eps)
            else:
                x = torch.layer_norm(x, [embed_dim], norm_weight_2, norm_bias_2, eps)
    return x.squeeze(0) if unbatched else x


@_builtin("aten::pow.int_float", shapes="dynamic")
def _int_to_float_power(a: int, b: float) -> float:
    # An attention scale written `q.size(-1) ** -0.5`: with a dynamic head dim the engine
    # computes it at run time, and Torch-MLIR lowers sqrt of an int (aten::sqrt.int) but
    # not pow. Other exponents keep the op, which then stays in TorchScript.
    if b == -0.5:
        return 1.0 / math.sqrt(a)
    if b == 0.5:
        return math.sqrt(a)
    if b == -1.0:
        return 1.0 / float(a)
    if b == 1.0:
        return float(a)
    return a ** b


# Registered before scaled_dot_product_attention's decomposition, which then rewrites the
# one this inserts in the same pass (they run in registration order).
@_builtin("aten::_native_multi_head_attention", unused_results=(1,))
def _native_multi_head_attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
        num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
        proj_weight: torch.Tensor, proj_bias: torch.Tensor,
        mask: Optional[torch.Tensor] = None, need_weights: bool = True,
        average_attn_weights: bool = True,
        mask_type: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    # nn.MultiheadAttention's fused fast path (batch_first, eval, as torchvision's ViT
    # calls it): the in-projection, attention and out-projection as ops the compiler fuses
    # (three GEMMs by the weight's row blocks, scaled_dot_product_attention, one GEMM),
    # where the weights are unread: the op leaves them undefined when they are not asked
    # for (see _undefined_attention_weights), which a TorchScript function cannot return,
    # so this body returns an empty stand-in and is applied only where nothing reads it
    # (csrc/passes/decompose.h). With a mask (its merged key-padding and attention masks
    # follow rules of their own) the op stays.
    if mask is not None:
        return torch._native_multi_head_attention(
            query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
            proj_bias, mask, need_weights, average_attn_weights, mask_type)
    head_dim = embed_dim // num_head
    projected: List[torch.Tensor] = []
    for i, x in enumerate([query, key, value]):
        rows = torch.nn.functional.linear(x, qkv_weight.narrow(0, i * embed_dim, embed_dim),
                                          qkv_bias.narrow(0, i * embed_dim, embed_dim))
        projected.append(rows.view(x.size(0), x.size(1), num_head, head_dim).transpose(1, 2))
    attended = torch.nn.functional.scaled_dot_product_attention(
        projected[0], projected[1], projected[2])
    merged = attended.transpose(1, 2).reshape(query.size(0), query.size(1), embed_dim)
    output = torch.nn.functional.linear(merged, proj_weight, proj_bias)
    return output, torch.empty([0], dtype=output.dtype, device=output.device)


@_builtin("aten::scaled_dot_product_attention")
def _scaled_dot_product_attention(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
        is_causal: bool = False, scale: Optional[float] = None,
        enable_gqa: bool = False) -> torch.Tensor:
    # PyTorch's reference math for F.scaled_dot_product_attention (its safe softmax), with
    # boolean and causal masks made additive (-inf where a key is not attended) as PyTorch's
    # fused CPU kernel does: softmax(q @ k^T * scale + mask) @ v, the chain attention.py
    # runs as one kernel.
    # sqrt of the int itself: Torch-MLIR lowers aten::sqrt.int but not sqrt.float, and
    # with a dynamic head dim the engine computes the scale at run time.
    factor = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scores = torch.matmul(query, key.transpose(-2, -1)) * factor
    if is_causal:
        # tril(ones(L, S)) as index arithmetic, which also compiles when L or S varies (a
        # tril this inserts is not decomposed again: the decompositions run once each).
        rows = torch.arange(query.size(-2), device=query.device).unsqueeze(-1)
        cols = torch.arange(key.size(-2), device=query.device)
        scores = scores + torch.zeros([query.size(-2), key.size(-2)], dtype=scores.dtype,
                                      device=query.device).masked_fill(cols > rows,
                                                                       float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores + torch.zeros(attn_mask.shape, dtype=scores.dtype,
                                          device=query.device).masked_fill(
                                              ~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # PyTorch's own kernels give 0, not softmax's 0/0 = NaN, for a query row that attends
    # no key (its scores all -inf): the row is set to 0 (attention.py folds it into the
    # kernel's `zero_masked_rows`).
    probabilities = torch.softmax(scores, -1).masked_fill(
        torch.amax(scores, -1, True) == float("-inf"), 0.0)
    if dropout_p > 0.0:
        probabilities = torch.dropout(probabilities, dropout_p, True)
    return torch.matmul(probabilities, value)


@_builtin("aten::lstm_cell")
def _lstm_cell(input: torch.Tensor, hx: List[torch.Tensor], w_ih: torch.Tensor,
               w_hh: torch.Tensor, b_ih: Optional[torch.Tensor] = None,
               b_hh: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    # nn.LSTMCell's op (an LSTM unrolled by hand, a decoder stepping one token at a time):
    # no lowering exists in Torch-MLIR. PyTorch's own formula, gates in the order i, f, g, o;
    # the two projections are GEMMs Blade calls its kernels for.
    gates = torch.nn.functional.linear(input, w_ih, b_ih) + \
        torch.nn.functional.linear(hx[0], w_hh, b_hh)
    chunks = gates.chunk(4, -1)
    cell = torch.sigmoid(chunks[1]) * hx[1] + torch.sigmoid(chunks[0]) * torch.tanh(chunks[2])
    return torch.sigmoid(chunks[3]) * torch.tanh(cell), cell


@_builtin("aten::gru_cell")
def _gru_cell(input: torch.Tensor, hx: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
              b_ih: Optional[torch.Tensor] = None,
              b_hh: Optional[torch.Tensor] = None) -> torch.Tensor:
    # nn.GRUCell's op, as PyTorch computes it: gates r, z, n; the hidden projection's n part
    # (with its bias) is scaled by r before it joins the input's.
    gi = torch.nn.functional.linear(input, w_ih, b_ih).chunk(3, -1)
    gh = torch.nn.functional.linear(hx, w_hh, b_hh).chunk(3, -1)
    reset = torch.sigmoid(gi[0] + gh[0])
    update = torch.sigmoid(gi[1] + gh[1])
    new = torch.tanh(gi[2] + reset * gh[2])
    return (hx - new) * update + new


@_builtin("aten::xlogy.Tensor")
def _xlogy(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    # x * log(y), 0 where x is 0 (even where log(y) is -inf), NaN where y is NaN.
    product = self * torch.log(other)
    product = torch.where(self == 0, torch.zeros_like(product), product)
    return torch.where(torch.isnan(other), torch.full_like(product, float("nan")), product)


@_builtin("aten::trace")
def _trace(self: torch.Tensor) -> torch.Tensor:
    # The sum of the main diagonal of a matrix, as a masked sum (Torch-MLIR lowers neither
    # trace nor diagonal to StableHLO).
    rows = torch.arange(self.size(0), device=self.device).unsqueeze(1)
    cols = torch.arange(self.size(1), device=self.device)
    return torch.sum(torch.where(rows == cols, self, torch.zeros_like(self)))


# A Scalar argument (int, float or bool at the call) is TorchScript's `number`, written
# Union[int, float, complex] in a decomposition's signature.

@_builtin("aten::remainder.Tensor")
def _remainder(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    # Python's modulo, with the divisor's sign, as PyTorch's kernel computes it: C's fmod,
    # moved by one divisor when it is not zero and its sign differs from the divisor's.
    # (Torch-MLIR's lowering gives fmod's sign for negative operands; an integer divisor of
    # zero makes the engine call run its fallback, which raises as PyTorch does.)
    r = torch.fmod(self, other)
    return torch.where((r != 0) & ((r < 0) != (other < 0)), r + other, r)


@_builtin("aten::remainder.Scalar")
def _remainder_scalar(self: torch.Tensor, other: Union[int, float, complex]) -> torch.Tensor:
    r = torch.fmod(self, other)
    divisor = torch.full_like(r, other)
    return torch.where((r != 0) & ((r < 0) != (divisor < 0)), r + divisor, r)


# Random ops at inference: in eval mode they are deterministic, and compile; in training
# mode the op itself is kept (the decomposition calls it, and is not applied again).

@_builtin("aten::native_dropout")
def _native_dropout(input: torch.Tensor, p: float,
                    train: Optional[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    # One return of a tuple (the decomposition's results are its elements).
    if train is not None and not train:
        output, mask = input.clone(), torch.ones_like(input, dtype=torch.bool)
    else:
        output, mask = torch.native_dropout(input, p, train)
    return output, mask


@_builtin("aten::rrelu")
def _rrelu(self: torch.Tensor, lower: Union[int, float, complex] = 0.125,
           upper: Union[int, float, complex] = 1.0 / 3.0, training: bool = False,
           generator: Optional[torch.Generator] = None) -> torch.Tensor:
    # Evaluated, RReLU is a leaky ReLU whose slope is the middle of its range.
    if not training:
        return torch.nn.functional.leaky_relu(self, (lower + upper) / 2)
    return torch.rrelu(self, lower, upper, training, generator)


@_builtin("aten::rrelu_with_noise_functional")
def _rrelu_with_noise(self: torch.Tensor, noise: torch.Tensor,
                      lower: Union[int, float, complex] = 0.125,
                      upper: Union[int, float, complex] = 1.0 / 3.0, training: bool = False,
                      generator: Optional[torch.Generator] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    # As rrelu; the noise comes back unchanged, as a new tensor.
    if not training:
        output, noise_out = torch.nn.functional.leaky_relu(self, (lower + upper) / 2), \
            noise.clone()
    else:
        output, noise_out = torch.ops.aten.rrelu_with_noise_functional(
            self, noise, lower, upper, training, generator)
    return output, noise_out


@_builtin("aten::native_batch_norm")
def _native_batch_norm(input: torch.Tensor, weight: Optional[torch.Tensor],
                       bias: Optional[torch.Tensor], running_mean: Optional[torch.Tensor],
                       running_var: Optional[torch.Tensor], training: bool, momentum: float,
                       eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Evaluated with running statistics, it is batch_norm (which compiles; Torch-MLIR's
    # lowering of this op fails on a cast), and the saved statistics are empty, as
    # PyTorch returns them. Training keeps the op.
    if not training and running_mean is not None and running_var is not None:
        output = torch.batch_norm(input, weight, bias, running_mean, running_var, False,
                                  momentum, eps, False)
        empty = torch.zeros([0], dtype=input.dtype, device=input.device)
        saved_mean, saved_invstd = empty, empty.clone()
    else:
        output, saved_mean, saved_invstd = torch.native_batch_norm(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
    return output, saved_mean, saved_invstd


@_builtin("aten::instance_norm")
def _instance_norm(input: torch.Tensor, weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], running_mean: Optional[torch.Tensor],
                   running_var: Optional[torch.Tensor], use_input_stats: bool,
                   momentum: float, eps: float, cudnn_enabled: bool) -> torch.Tensor:
    # Each instance's channels normalized over their own values (biased variance, as
    # PyTorch), then scaled and shifted per channel: fused reductions and elementwise math.
    # Torch-MLIR's lowering of the op without a weight aborted the process (an LLVM
    # "SmallVector unable to grow"), nn.InstanceNorm2d's default. With running statistics
    # and no input statistics it is batch_norm in evaluation; updating running statistics
    # (training) keeps the op.
    if use_input_stats and running_mean is None and running_var is None:
        dims = list(range(2, input.dim()))
        centered = input - torch.mean(input, dims, True)
        variance = torch.mean(centered * centered, dims, True)
        output = centered * torch.rsqrt(variance + eps)
        shape = [1, input.size(1)] + [1] * (input.dim() - 2)
        if weight is not None:
            output = output * weight.reshape(shape)
        if bias is not None:
            output = output + bias.reshape(shape)
        return output
    if not use_input_stats and running_mean is not None and running_var is not None:
        return torch.batch_norm(input, weight, bias, running_mean, running_var, False,
                                momentum, eps, False)
    return torch.instance_norm(input, weight, bias, running_mean, running_var,
                               use_input_stats, momentum, eps, cudnn_enabled)


@_builtin("aten::isclose")
def _isclose(self: torch.Tensor, other: torch.Tensor, rtol: float = 1e-05,
             atol: float = 1e-08, equal_nan: bool = False) -> torch.Tensor:
    # PyTorch's formula (TensorCompare.cpp): equal, or NaN on both sides with equal_nan, or
    # a finite difference within atol + |rtol * other|; bools compared as floats (0 and 1
    # compare alike in any float dtype).
    close = self == other
    if equal_nan and self.is_floating_point():
        close = close | (torch.isnan(self) & torch.isnan(other))
    if rtol == 0.0 and atol == 0.0:
        return close
    a = self.to(torch.float32) if self.dtype == torch.bool else self
    b = other.to(torch.float32) if other.dtype == torch.bool else other
    difference = torch.abs(a - b)
    return close | (torch.isfinite(difference) & (difference <= atol + torch.abs(rtol * b)))


# After isclose, whose decomposition calls it.
@_builtin("aten::isfinite")
def _isfinite(self: torch.Tensor) -> torch.Tensor:
    # Integers and bools are all finite; Torch-MLIR lowers isfinite of floats only.
    if self.is_floating_point() or self.is_complex():
        return torch.isfinite(self)
    return torch.ones_like(self, dtype=torch.bool)


# The op families written in modules of their own register on import.
from blade.frontend import (gradient_decompositions, layout_decompositions,  # noqa: E402,F401
                            pooling_decompositions, scan_decompositions)
