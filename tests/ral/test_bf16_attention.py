"""The runtime's fused attention with bfloat16 products (csrc/ral/fused_attention.*), as int8
engines run it: q, k, v and the softmax's probabilities rounded to bfloat16, float32 sums
and softmax. On a CPU without AMX its products are Blade's AVX512-BF16 tiles
(bf16_pairs_gemm, float_conv.h). Compared with a float64 reference that rounds the same operands, which
pins the products down to float32 summation order and exp's rounding."""
import pytest
import torch

from blade import _C

needs_bf16 = pytest.mark.skipif(not _C.bf16_attention_supported(),
                                reason="this CPU lacks AVX512-BF16")


@pytest.fixture(params=["amx tiles where the CPU has them", "dot products"])
def products(request):
    """The bf16 products as the CPU runs them, then with AMX off (the same on a CPU without
    AMX): both ways of multiplying, on an AMX host."""
    _C.set_bf16_attention_amx(request.param != "dot products")
    yield
    _C.set_bf16_attention_amx(True)


def rounded(x):
    return x.to(torch.bfloat16).double()


def reference(q, k, v, mask, scale):
    """softmax(q k^T scale + mask) v as the bf16 products compute it: rounded operands and
    probabilities, the sum of the unrounded exponentials dividing the output."""
    scores = rounded(q) @ rounded(k).transpose(-1, -2) * scale + mask.double()
    top = scores.amax(-1, keepdim=True)
    exps = torch.exp(scores - top).float()   # float32, as the kernel's
    out = rounded(exps) @ rounded(v)
    return out / exps.double().sum(-1, keepdim=True)


@needs_bf16
@pytest.mark.parametrize("batch, heads, rows, keys, head_dim, value_dim", [
    (1, 12, 128, 128, 64, 64),    # BERT-base's heads
    (1, 2, 13, 37, 16, 24),       # row tiles and column blocks with tails; padded keys
    (2, 3, 300, 70, 32, 80),      # several blocks of rows a head; value columns past 64
    (1, 2, 40, 50, 64, 128),      # a 128-column v: two panels of 64 on AMX
])
def test_bf16_products_match_the_rounded_reference(batch, heads, rows, keys, head_dim,
                                                   value_dim, products):
    gen = torch.Generator().manual_seed(rows + keys)
    q = torch.randn(batch, heads, rows, head_dim, generator=gen)
    k = torch.randn(batch, heads, keys, head_dim, generator=gen)
    v = torch.randn(batch, heads, keys, value_dim, generator=gen)
    mask = torch.where(torch.rand(batch, 1, rows, keys, generator=gen) > 0.2, 0.0, -1e4)
    scale = head_dim ** -0.5
    got = _C.fused_attention(q, k, v, mask, scale, True)
    want = reference(q, k, v, mask, scale)
    # A probability within an ulp of a rounding boundary may round the other way than
    # torch.exp's: a bfloat16 step (2^-8) of one term of a sum.
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=5e-4)
    # The float32 products differ from it by bfloat16's rounding, no more.
    f32 = _C.fused_attention(q, k, v, mask, scale, False)
    difference = float((got - f32).abs().max())
    assert 0 < difference < 0.05


@pytest.mark.parametrize("rows, keys", [(128, 128), (300, 300), (45, 70)])
def test_causal_masks_multiply_only_the_keys_a_block_attends(rows, keys, products):
    """A causal mask shared by every head ends each query row's keys early: blocks of rows
    multiply only the keys their rows attend, and give the reference's values (a row
    masked everywhere too: 0), with float32 products on any CPU and bf16 ones where they
    run."""
    gen = torch.Generator().manual_seed(rows)
    q = torch.randn(2, 3, rows, 32, generator=gen)
    k = torch.randn(2, 3, keys, 32, generator=gen)
    v = torch.randn(2, 3, keys, 32, generator=gen)
    attended = torch.ones(rows, keys, dtype=torch.bool).tril(diagonal=keys - rows)
    mask = torch.zeros(rows, keys).masked_fill(~attended, -float("inf"))
    mask[rows // 2] = -float("inf")
    mask = mask[None, None]
    scale = 32 ** -0.5
    f32 = _C.fused_attention(q, k, v, mask, scale, False)
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) * scale + mask.double(),
                          -1).nan_to_num(0.0) @ v.double()
    torch.testing.assert_close(f32.double(), exact, rtol=1e-5, atol=1e-5)
    assert (f32[:, :, rows // 2] == 0).all()
    if _C.bf16_attention_supported():
        got = _C.fused_attention(q, k, v, mask, scale, True)
        want = reference(q, k, v, mask, scale).nan_to_num(0.0)
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=5e-4)
        assert (got[:, :, rows // 2] == 0).all()



@needs_bf16
@pytest.mark.parametrize("keys", [197, 64, 33])
def test_a_key_stored_transposed_gives_the_same_products(keys, products):
    """k handed over as k^T's storage (its keys contiguous, as an engine passes a key it
    transposed itself; ViT's int8 engine did) and q as a view of the projection's [b, t,
    h * d] rows: the bf16 products read k^T's rows, not k's (they read other keys'
    values: errors of 1-3 against a result of magnitude 1)."""
    gen = torch.Generator().manual_seed(keys)
    q = torch.randn(1, keys, 4 * 64, generator=gen).view(1, keys, 4, 64).transpose(1, 2)
    k = torch.randn(1, 4, 64, keys, generator=gen).transpose(-1, -2)
    v = torch.randn(1, 4, keys, 64, generator=gen)
    mask = torch.zeros(1, 1, keys, keys)
    got = _C.fused_attention(q, k, v, None, 0.125, True)
    want = reference(q, k, v, mask, 0.125)
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=5e-4)


@needs_bf16
def test_bf16_products_zero_a_fully_masked_row_and_keep_nan(products):
    q, k, v = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8)
    mask = torch.zeros(1, 1, 5, 9)
    mask[0, 0, 2] = -float("inf")
    v[0, 0, 4, 1] = float("nan")
    got = _C.fused_attention(q, k, v, mask, 0.3, True)
    f32 = _C.fused_attention(q, k, v, mask, 0.3, False)
    # Column 1 is NaN in every row (a zero probability times NaN too), as in float32.
    assert torch.equal(got.isnan(), f32.isnan())
    assert got[0, 0, :, 1].isnan().all()
    assert not got[0, 0][:, [0, 2, 3, 4, 5, 6, 7]].isnan().any()
    assert (got[0, 0, 2, [0, 2, 3, 4, 5, 6, 7]] == 0).all()


def test_the_binding_refuses_operands_that_are_no_attention():
    q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    with pytest.raises(RuntimeError, match="not \\[batch, heads, length, head dim\\]"):
        _C.fused_attention(q, k[:, :, :, :8], v, None, 0.25, False)
    with pytest.raises(RuntimeError, match="not \\[batch, heads, length, head dim\\]"):
        _C.fused_attention(q, k, v[:, :, :5], None, 0.25, False)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        _C.fused_attention(q, k, v, torch.zeros(1, 1, 3, 9), 0.25, False)
