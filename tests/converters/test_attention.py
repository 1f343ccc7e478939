"""softmax(q @ k^T * scale + mask) @ v as one fused kernel (python/blade/codegen/kernels/attention.py,
csrc/ral/fused_attention.cpp): eager's results, in every spelling and layout the matcher
takes, and left op by op where fusing would change what the model computes."""
import math
from typing import Optional

import pytest
import torch

import blade
from helpers import ir_before, assert_ran_compiled, assert_same, run_compiled


class Attention(torch.nn.Module):
    """Hand-written attention as in the benchmark's softmax_attn."""

    def __init__(self, divide: bool = False, head_dim: int = 16):
        super().__init__()
        self.divide = divide
        self.root = math.sqrt(head_dim)

    def forward(self, q, k, v, mask):
        if self.divide:
            scores = q @ k.transpose(-2, -1) / self.root
        else:
            scores = q @ k.transpose(-2, -1) * (1.0 / self.root)
        return torch.softmax(scores + mask, dim=-1) @ v


class Unmasked(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.3, dim=-1) @ v


class KeysStoredTransposed(torch.nn.Module):
    """k arrives as [..., head dim, keys]: the kernel reads it without a copy."""

    def forward(self, q, k_t, v):
        return torch.softmax(q @ k_t * 0.25, dim=-1) @ v


class ScoresReturned(torch.nn.Module):
    """The probabilities are an output too: fusing would lose them, so nothing fuses."""

    def forward(self, q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
        return p @ v, p


class Projected(torch.nn.Module):
    """q, k and v as strided head views of one fused projection, as in MultiheadAttention."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def heads(self, x, mask):
        """q's, k's and v's heads, and the attention's."""
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 4, 16).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return q, k, v, torch.softmax(q @ k.transpose(-2, -1) * 0.25 + mask, dim=-1) @ v

    def forward(self, x, mask):
        out = self.heads(x, mask)[3]
        return out.transpose(1, 2).reshape(x.size(0), x.size(1), 64)


def qkv(*shape, dtype=torch.float32):
    torch.manual_seed(0)
    return tuple(torch.randn(*shape, dtype=dtype) for _ in range(3))


def padding_mask(batch, keys, dtype=torch.float32):
    mask = torch.zeros(batch, 1, 1, keys, dtype=dtype)
    mask[0, ..., keys // 2:] = -1e4
    return mask


def assert_serves_other_sizes(optimized, model):
    """A dynamic engine of Projected's form gives eager's results at other batch sizes and
    lengths, every call compiled."""
    with torch.no_grad():
        for batch, length in ((1, 3), (3, 17), (2, 40)):
            inputs = (torch.randn(batch, length, 64), padding_mask(batch, length))
            assert_same(optimized(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert blade.report(optimized).runtime_fallbacks == 0


def fused(report) -> int:
    return sum(c.fused_attention for c in report.clusters)


TRACE = blade.Config(allow_tracing=True)


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("keys", [128, 37])   # a whole number of vectors, and a ragged one
def test_masked_attention_is_one_kernel(divide, keys):
    q = torch.randn(2, 3, 50, 16)
    k, v = torch.randn(2, 3, keys, 16), torch.randn(2, 3, keys, 24)
    _, report = run_compiled(Attention(divide), (q, k, v, padding_mask(2, keys)), TRACE,
                             rtol=1e-4, atol=1e-5)
    assert fused(report) == 1 and report.clusters[0].library_calls == 1, str(report)


def test_unmasked_rank_3():
    q, k, v = qkv(6, 33, 8)
    _, report = run_compiled(Unmasked(), (q, k, v), TRACE, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


@pytest.mark.parametrize("keys,head_dim", [(21, 12), (64, 20), (7, 3)])
def test_head_dims_and_key_counts_off_the_tile_size(keys, head_dim):
    """k^T is copied in 8 x 8 tiles (csrc transpose); the edges element by element."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, 19, head_dim)
    k, v = torch.randn(2, 3, keys, head_dim), torch.randn(2, 3, keys, 5)
    _, report = run_compiled(Attention(head_dim=head_dim), (q, k, v, padding_mask(2, keys)),
                             TRACE, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


def test_keys_stored_transposed():
    q, k, v = qkv(2, 2, 20, 8)
    _, report = run_compiled(KeysStoredTransposed(), (q, k.transpose(-2, -1).contiguous(), v),
                             TRACE, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


def test_long_rows_are_split_into_blocks():
    """More keys than one block of scores holds per 16 rows (csrc kScoresPerBlock)."""
    q = torch.randn(1, 2, 40, 8)
    k, v = torch.randn(1, 2, 3000, 8), torch.randn(1, 2, 3000, 8)
    _, report = run_compiled(Attention(), (q, k, v, padding_mask(1, 3000)), TRACE,
                             rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


def test_strided_heads_of_a_projection():
    x = torch.randn(2, 10, 64)
    mask = padding_mask(2, 10)
    _, report = run_compiled(Projected(), (x, mask), TRACE, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


class ProjectedTwice(Projected):
    """The heads are an output too, besides their transpose back next to the tokens."""

    def forward(self, x, mask):
        out = self.heads(x, mask)[3]
        return out.transpose(1, 2).reshape(x.size(0), x.size(1), 64), out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_heads_are_written_straight_into_the_tokens_layout(tmp_path, dtype):
    """The transpose after the attention moves into its call: the kernel (Blade's for
    float32, PyTorch's for float64) writes each head through a strided view of the
    [batch, tokens, heads, head dim] buffer, and no loop transposes it back."""
    torch.manual_seed(0)
    model = Projected().to(dtype)
    inputs = (torch.randn(2, 10, 64, dtype=dtype), padding_mask(2, 10, dtype))
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    tolerance = 1e-4 if dtype == torch.float32 else 1e-7
    _, report = run_compiled(model, inputs, config, rtol=tolerance, atol=tolerance)
    assert fused(report) == 1, str(report)
    bufferized = ir_before(tmp_path, "mark-out-params")
    assert "blade.out_permutation = array<i64: 0, 2, 1, 3>" in bufferized


def test_heads_of_dynamic_length_are_written_straight_into_the_tokens_layout(tmp_path):
    """The same with the batch and the length dynamic: the importer's reshape of the
    attention's result to its own sizes is dropped (drop-identity-broadcasts), so the
    transpose still moves into the call, whose result is sized in the transposed order;
    eager's results at other lengths."""
    torch.manual_seed(0)
    model = Projected()
    config = blade.Config(allow_tracing=True, dynamic=True, dump_dir=str(tmp_path))
    optimized, report = run_compiled(model, (torch.randn(2, 10, 64), padding_mask(2, 10)),
                                     config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    assert report.clusters[0].inputs == "float32[s0,s1,64];float32[s0,1,1,s1]", str(report)
    bufferized = ir_before(tmp_path, "mark-out-params")
    assert "blade.out_permutation = array<i64: 0, 2, 1, 3>" in bufferized
    assert_serves_other_sizes(optimized, model)


def test_heads_read_twice_keep_their_own_layout(tmp_path):
    torch.manual_seed(0)
    inputs = (torch.randn(2, 10, 64), padding_mask(2, 10))
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    _, report = run_compiled(ProjectedTwice(), inputs, config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    assert "out_permutation" not in ir_before(tmp_path, "mark-out-params")


@pytest.mark.parametrize("bias", [False, True])
def test_heads_are_read_in_place_from_the_projection(tmp_path, bias):
    """q, k and v, heads of one fused projection, are not copied head by head: the call
    takes the projection's result three times and reads each operand's heads through a
    strided view of it ([start, heads, head dim, *permutation]), from elements 0, 64 and
    128 of its rows. Heads of a bias add are written by the add's loop, transposed as it
    goes: no view."""
    torch.manual_seed(0)
    model = Projected()
    if not bias:
        model.qkv = torch.nn.Linear(64, 192, bias=False)
    inputs = (torch.randn(2, 10, 64), padding_mask(2, 10))
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    _, report = run_compiled(model, inputs, config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    bufferized = ir_before(tmp_path, "mark-out-params")
    if bias:
        assert "_view = array" not in bufferized
        return
    for name, start in (("q", 0), ("k", 64), ("v", 128)):
        assert f"blade.{name}_view = array<i64: {start}, 4, 16, 0, 2, 1, 3>" in bufferized
    lowered = ir_before(tmp_path, "tile-transposes")
    assert "offset: [128], sizes: [2, 4, 10, 16], strides: [1920, 16, 192, 1]" in lowered


def test_heads_of_dynamic_length_are_read_in_place(tmp_path):
    """The same with the batch and the length dynamic (the slices and reshapes of the
    importer's dynamic form); eager's results at other sizes, none run by TorchScript."""
    torch.manual_seed(0)
    model = Projected()
    model.qkv = torch.nn.Linear(64, 192, bias=False)
    config = blade.Config(allow_tracing=True, dynamic=True, dump_dir=str(tmp_path))
    optimized, report = run_compiled(model, (torch.randn(2, 10, 64), padding_mask(2, 10)),
                                     config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    bufferized = ir_before(tmp_path, "mark-out-params")
    for name, start in (("q", 0), ("k", 64), ("v", 128)):
        assert f"blade.{name}_view = array<i64: {start}, 4, 16, 0, 2, 1, 3>" in bufferized
    assert_serves_other_sizes(optimized, model)


class KeysReturned(Projected):
    """The keys' heads are an output too (a cache), besides the attention's; no bias."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192, bias=False)

    def forward(self, x, mask):
        _, k, _, out = self.heads(x, mask)
        return out.transpose(1, 2).reshape(x.size(0), x.size(1), 64), k


class QueryHeadsOnly(torch.nn.Module):
    """Only q is a head view of a projection; k and v come in as heads already."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(64, 64, bias=False)

    def forward(self, x, k, v):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 16).transpose(1, 2)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v


def test_heads_used_elsewhere_are_copied_and_views_mix_with_plain_operands(tmp_path):
    """Heads that are also an output stay the transposed copy the output needs (the
    attention reads that copy) while q and v are read in place; a call may view q alone."""
    torch.manual_seed(0)
    inputs = (torch.randn(2, 10, 64), padding_mask(2, 10))
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path / "returned"))
    _, report = run_compiled(KeysReturned(), inputs, config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    bufferized = ir_before(tmp_path / "returned", "mark-out-params")
    assert "blade.q_view" in bufferized and "blade.v_view" in bufferized
    assert "blade.k_view" not in bufferized
    inputs = (torch.randn(2, 10, 64),) + qkv(2, 4, 7, 16)[:2]
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path / "mixed"))
    _, report = run_compiled(QueryHeadsOnly(), inputs, config, rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    bufferized = ir_before(tmp_path / "mixed", "mark-out-params")
    assert "blade.q_view = array<i64: 0, 4, 16, 0, 2, 1, 3>" in bufferized
    assert "blade.k_view" not in bufferized and "blade.v_view" not in bufferized


def test_probabilities_used_elsewhere_are_not_fused():
    q, k, v = qkv(2, 2, 12, 8)
    _, report = run_compiled(ScoresReturned(), (q, k, v), TRACE, rtol=1e-4, atol=1e-5)
    assert fused(report) == 0 and report.clusters[0].library_calls == 2, str(report)


def test_fully_masked_rows_are_nan_as_in_eager():
    q, k, v = qkv(2, 2, 6, 8)
    mask = torch.zeros(2, 2, 6, 6)
    mask[1, 0, 3, :] = float("-inf")            # one query row that sees no key
    mask[0, 1, :, :2] = float("-inf")
    model = Attention()
    optimized = blade.optimize(model, (q, k, v, mask), TRACE)
    with torch.no_grad():
        expected, actual = model(q, k, v, mask), optimized(q, k, v, mask)
    assert torch.isnan(expected[1, 0, 3]).all() and torch.isnan(actual[1, 0, 3]).all()
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    report = blade.report(optimized)
    assert fused(report) == 1 and report.clusters[0].calls == 1, str(report)


def test_float64_uses_pytorchs_fused_kernel():
    q, k, v = qkv(2, 2, 12, 8, dtype=torch.float64)
    _, report = run_compiled(Attention(), (q, k, v, padding_mask(2, 12, torch.float64)), TRACE,
                             rtol=1e-7, atol=1e-7)
    assert fused(report) == 1, str(report)


def test_dynamic_lengths():
    """A dynamic engine fuses the chain too (its shape.assuming regions and broadcasts that
    keep their operand's shape are gone before matching), with eager's results."""
    q, k, v = qkv(2, 4, 16, 8)
    model = Unmasked()
    optimized = blade.optimize(model, (q, k, v), blade.Config(allow_tracing=True, dynamic=True))
    assert fused(blade.report(optimized)) == 1, str(blade.report(optimized))
    with torch.no_grad():
        for batch, length in ((1, 1), (3, 40), (2, 7)):
            q, k, v = qkv(batch, 4, length, 8)
            assert_same(optimized(q, k, v), model(q, k, v), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 3 and report.runtime_fallbacks == 0, str(report)


def test_dynamic_lengths_with_a_mask():
    """The masked kernel in a dynamic engine: batch and sequence length vary, the mask is
    broadcast over heads and query rows."""
    model = Attention(head_dim=8)
    q, k, v = qkv(2, 4, 16, 8)
    optimized = blade.optimize(model, (q, k, v, padding_mask(2, 16)),
                               blade.Config(allow_tracing=True, dynamic=True))
    assert fused(blade.report(optimized)) == 1, str(blade.report(optimized))
    with torch.no_grad():
        for batch, length in ((1, 3), (3, 33), (2, 16)):
            q, k, v = qkv(batch, 4, length, 8)
            mask = padding_mask(batch, length)
            assert_same(optimized(q, k, v, mask), model(q, k, v, mask), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters[0].calls == 3 and report.runtime_fallbacks == 0, str(report)


class ScaledBySize(torch.nn.Module):
    """The scale computed from q's head dim: a run-time value in a dynamic engine."""

    def __init__(self, divide: bool):
        super().__init__()
        self.divide = divide

    def forward(self, q, k, v, mask):
        if self.divide:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        else:
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)))
        return torch.softmax(scores + mask, dim=-1) @ v


@pytest.mark.parametrize("divide", [False, True])
def test_scale_computed_from_a_dynamic_head_dim(divide):
    """The kernel reads the scale the engine computed (library_calls.SCALE_OPERAND)."""
    model = ScaledBySize(divide)
    q, k, v = qkv(2, 3, 10, 8)
    optimized = blade.optimize(model, (q, k, v, padding_mask(2, 10)),
                               blade.Config(dynamic=True))
    report = blade.report(optimized)
    assert report.coverage == 1.0 and fused(report) == 1, str(report)
    shapes = ((1, 2, 5, 16), (3, 1, 33, 4), (2, 3, 10, 8))
    with torch.no_grad():
        for batch, heads, length, head_dim in shapes:
            q, k, v = qkv(batch, heads, length, head_dim)
            mask = padding_mask(batch, length)
            assert_same(optimized(q, k, v, mask), model(q, k, v, mask), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.clusters[0].calls == len(shapes) and report.runtime_fallbacks == 0, \
        str(report)


class ScaledByAnInput(torch.nn.Module):
    def forward(self, q, k, v, temperature):
        return torch.softmax(q @ k.transpose(-2, -1) * temperature, dim=-1) @ v


def test_scale_passed_in_as_a_tensor():
    model = ScaledByAnInput()
    q, k, v = qkv(2, 2, 9, 8)
    temperature = torch.tensor(0.7)
    optimized, report = run_compiled(model, (q, k, v, temperature), rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)
    with torch.no_grad():
        other = torch.tensor(-1.5)
        assert_same(optimized(q, k, v, other), model(q, k, v, other), rtol=1e-4, atol=1e-5)


def test_encoder_layer_attention_is_fused():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True,
                                             dropout=0.0).eval()
    x = torch.randn(2, 16, 64)
    _, report = run_compiled(model, (x,), rtol=1e-4, atol=1e-5)
    assert fused(report) == 1, str(report)


class Sdpa(torch.nn.Module):
    """F.scaled_dot_product_attention, decomposed (decompositions.py) and fused again."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask: Optional[torch.Tensor] = None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                **self.kwargs)


@pytest.mark.parametrize("variant", ["float_mask", "bool_mask", "causal", "scale"])
def test_scaled_dot_product_attention_compiles_to_the_fused_kernel(variant):
    q, k, v = qkv(2, 3, 10, 8)
    mask = None
    kwargs = {}
    if variant == "float_mask":
        mask = torch.randn(2, 1, 10, 10)
    elif variant == "bool_mask":
        mask = torch.rand(2, 1, 1, 10) > 0.3    # True: attend
        mask[..., 0] = True
    elif variant == "causal":
        kwargs = dict(is_causal=True)
    else:
        kwargs = dict(scale=0.2)
    model = Sdpa(**kwargs)
    inputs = (q, k, v) if mask is None else (q, k, v, mask)
    _, report = run_compiled(model, inputs, TRACE, rtol=1e-4, atol=1e-5)
    assert report.decomposed == {"aten::scaled_dot_product_attention": 1}, str(report)
    assert report.coverage == 1.0 and fused(report) == 1, str(report)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_kind", ["float", "bool"])
def test_scaled_dot_product_attention_rows_that_see_no_key_are_zero(dtype, mask_kind):
    """PyTorch's safe softmax gives 0 for a query row whose mask excludes every key (where
    a hand-written softmax gives NaN, test_fully_masked_rows_are_nan_as_in_eager): the
    fused kernel gives 0 too."""
    q, k, v = qkv(2, 2, 6, 8, dtype=dtype)
    if mask_kind == "float":
        mask = torch.zeros(2, 2, 6, 6, dtype=dtype)
        mask[1, 0, 3, :] = float("-inf")
        mask[0, 1, :, :2] = float("-inf")
    else:
        mask = torch.ones(2, 2, 6, 6, dtype=torch.bool)      # True: attend
        mask[1, 0, 3, :] = False
        mask[0, 1, :, :2] = False
    model = Sdpa()
    optimized = blade.optimize(model, (q, k, v, mask), TRACE)
    with torch.no_grad():
        expected, actual = model(q, k, v, mask), optimized(q, k, v, mask)
    assert torch.equal(expected[1, 0, 3], torch.zeros(8, dtype=dtype))
    assert torch.equal(actual[1, 0, 3], torch.zeros(8, dtype=dtype))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert fused(report) == 1 and report.clusters[0].calls == 1, str(report)


def test_scaled_dot_product_attention_dynamic_lengths_zero_rows_that_see_no_key():
    """The head dim varies too, so the engine computes the scale at run time and the
    fused kernel reads it; the safe softmax's select still gives 0 rows."""
    q, k, v = qkv(2, 2, 6, 8)
    mask = torch.zeros(2, 1, 6, 6)
    mask[0, 0, 2, :] = float("-inf")
    model = Sdpa()
    optimized = blade.optimize(model, (q, k, v, mask),
                               blade.Config(allow_tracing=True, dynamic=True))
    for n in (6, 9):
        q, k, v = qkv(2, 2, n, 8)
        mask = torch.zeros(2, 1, n, n)
        mask[1, 0, n - 1, :] = float("-inf")
        with torch.no_grad():
            expected, actual = model(q, k, v, mask), optimized(q, k, v, mask)
        assert torch.equal(actual[1, 0, n - 1], torch.zeros(8))
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and fused(report) == 1, str(report)
    assert report.clusters[0].calls == 2 and report.runtime_fallbacks == 0, str(report)


def test_causal_scaled_dot_product_attention_with_dynamic_lengths():
    """is_causal with a varying sequence length (a decoder served at any length): the
    causal mask is index arithmetic, so the whole attention compiles into the fused kernel
    and matches eager at lengths other than the example's."""
    model = Sdpa(is_causal=True)
    optimized = blade.optimize(model, qkv(2, 2, 6, 8),
                               blade.Config(allow_tracing=True, dynamic=True))
    for n in (5, 11):
        inputs = qkv(2, 2, n, 8)
        with torch.no_grad():
            torch.testing.assert_close(optimized(*inputs), model(*inputs), rtol=1e-4,
                                       atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and fused(report) == 1, str(report)
    assert report.clusters[0].calls == 2 and report.runtime_fallbacks == 0, str(report)


class PaddedEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True,
                                                      dropout=0.0)

    def forward(self, x, padding):
        return self.layer(x, src_key_padding_mask=padding)


def test_encoder_layer_rows_that_see_no_key_are_those_of_its_reference_path():
    """A sequence whose keys are all padding: nn.TransformerEncoderLayer's reference path
    (F.scaled_dot_product_attention, what tracing records) gives finite values, its
    inference fast path NaN. The compiled layer gives the reference path's values."""
    torch.manual_seed(0)
    model = PaddedEncoder().eval()
    x = torch.randn(2, 5, 32)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, :] = True
    optimized = blade.optimize(model, (x, padding), TRACE)
    reference = model(x, padding).detach()      # autograd on: the reference path
    with torch.no_grad():
        fast, actual = model(x, padding), optimized(x, padding)
    assert torch.isnan(fast[0]).all() and torch.isfinite(reference).all()
    torch.testing.assert_close(actual, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(actual[1], fast[1], rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and fused(report) == 1, str(report)


class CrossAttention(torch.nn.Module):
    """nn.MultiheadAttention of queries over keys of another length (a decoder's memory)."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x, memory):
        return self.attention(x, memory, memory, need_weights=False)[0]


def zero_length_cases():
    """(name, model, example inputs, calls with a zero-size dim)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)
    sdpa_calls = [(q[:, :, :0], k, v), (q, k[:, :, :0], v[:, :, :0]), (q[:0], k[:0], v[:0])]
    x, memory = torch.randn(2, 8, 32), torch.randn(2, 6, 32)
    cross_calls = [(x[:, :0], memory), (x, memory[:, :0]), (x[:0], memory[:0])]
    encoder = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    return [("sdpa", Sdpa(), (q, k, v), sdpa_calls),
            ("cross", CrossAttention(), (x, memory), cross_calls),
            ("encoder", encoder, (x,), [(x[:, :0],), (x[:0],)])]


@pytest.mark.parametrize("case", zero_length_cases(), ids=lambda case: case[0])
def test_dynamic_attention_of_zero_length_sequences(case):
    """No queries, no keys (eager: 0 for every query row, the product of an empty softmax
    by v's zero rows) or an empty batch: eager's result, where the fused kernel and
    PyTorch's divided by the key and row counts (SIGFPE)."""
    _, model, example, calls = case
    model = model.eval()
    optimized = blade.optimize(model, example, blade.Config(allow_tracing=True, dynamic=True))
    assert fused(blade.report(optimized)) == 1, str(blade.report(optimized))
    with torch.no_grad():
        for inputs in calls:
            assert_same(optimized(*inputs), model(*inputs))
    report = assert_ran_compiled(optimized)
    assert sum(c.calls for c in report.clusters) >= len(calls), str(report)


def test_static_attention_called_with_no_keys_runs_the_model_as_eager_does():
    """Inputs the engine was not compiled for run the model's own graph, taken before
    Blade's decompositions: SDPA over zero keys gives eager's zeros (the decomposition's
    amax over an empty dim would raise)."""

    class Attend(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    optimized, _ = run_compiled(Attend(), (q, k, v))
    empty_k, empty_v = torch.randn(2, 4, 0, 16), torch.randn(2, 4, 0, 16)
    expected = Attend()(q, empty_k, empty_v)
    assert_same(optimized(q, empty_k, empty_v), expected)
    assert blade.report(optimized).runtime_fallbacks == 1
