"""Dynamic shapes: one engine, compiled once, serves every batch size and sequence length
with eager's results and no fallback; the guard keeps what the code assumes."""
import math
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch

import blade
from helpers import ir_before, assert_ran_compiled, assert_same, assert_same_values

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
from zoo import BertLayer, GptBlock, bert_inputs  # noqa: E402

DYNAMIC = blade.Config(dynamic=True)
OTHER_SHAPES = [(1, 5), (3, 16), (4, 33), (2, 7), (1, 1)]   # (batch, sequence)


def check_every_shape(optimized, model, make_inputs):
    with torch.no_grad():
        for batch, seq in OTHER_SHAPES:
            inputs = make_inputs(batch, seq)
            assert_same(optimized(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and not report.compile_errors, str(report)
    assert len(report.clusters) == 1, str(report)
    assert report.clusters[0].calls == len(OTHER_SHAPES), str(report)
    assert report.runtime_fallbacks == 0, str(report)
    return report


def serves_whole(optimized, model, input_sets):
    """The dynamic engine gives eager's results for every set of inputs, compiled whole
    into one engine that ran each time; returns the report."""
    with torch.no_grad():
        for inputs in input_sets:
            assert_same(optimized(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and not report.compile_errors, str(report)
    assert len(report.clusters) == 1, str(report)
    assert report.clusters[0].calls == len(input_sets), str(report)
    assert report.runtime_fallbacks == 0, str(report)
    return report


def test_bert_layer_serves_every_batch_and_length():
    torch.manual_seed(0)
    model = BertLayer().eval()
    optimized = blade.optimize(model, bert_inputs(2, 16), DYNAMIC)
    report = check_every_shape(optimized, model, bert_inputs)
    # The mask's batch and length are tied to the input's: the signature says so.
    assert report.clusters[0].inputs == "float32[s0,s1,64];float32[s0,1,1,s1]", str(report)
    assert report.dynamic_dims == [["input 0 ('x') dim 0", "input 1 ('mask') dim 0"],
                                   ["input 0 ('x') dim 1", "input 1 ('mask') dim 3"]]


def test_gpt_block_with_a_causal_mask_of_dynamic_length():
    torch.manual_seed(0)
    model = GptBlock().eval()
    optimized = blade.optimize(model, (torch.randn(2, 16, 64),), DYNAMIC)
    report = check_every_shape(optimized, model, lambda b, s: (torch.randn(b, s, 64),))
    assert report.clusters[0].outputs == "float32[s0,s1,64]", str(report)
    assert report.decomposed == {"aten::tril": 1}


def test_gpt_blocks_of_one_sequence_of_dynamic_length_compile_whole():
    """A batch of one and a dynamic length: the head transposes drop their batch loop
    (unit_loops.py) and read q, k and v, strided slices of the fused projection, through
    views whose outer stride is dynamic; once a wrong static stride there failed the
    whole engine."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(GptBlock(64, 4), GptBlock(64, 4)).eval()
    optimized = blade.optimize(model, (torch.randn(1, 16, 64),),
                               blade.Config(dynamic_dims={0: [1]}))
    report = serves_whole(optimized, model,
                          [(torch.randn(1, length, 64),) for length in (1, 7, 16, 33)])
    assert report.clusters[0].inputs == "float32[1,s0,64]", str(report)
    assert_ran_compiled(optimized)


class FutureMask(torch.nn.Module):
    """The other spelling of a causal mask: triu of ones over the future positions."""

    def forward(self, scores):
        t = scores.size(-1)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        return scores.masked_fill(future, float("-inf")).softmax(-1) + torch.triu(scores, 2)


def test_triu_of_a_dynamic_length():
    model = FutureMask().eval()
    optimized = blade.optimize(model, (torch.randn(2, 16, 16),), DYNAMIC)
    report = serves_whole(optimized, model,
                          [(torch.randn(b, t, t),) for b, t in ((1, 5), (3, 33), (2, 1))])
    assert report.decomposed == {"aten::triu": 2}, str(report)


class Hidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(dim=-1)


def test_explicit_dynamic_dims_and_static_ones_still_guarded():
    torch.manual_seed(0)
    model = Hidden().eval()
    optimized = blade.optimize(model, (torch.randn(4, 5, 32),),
                               blade.Config(dynamic_dims={0: [0]}))   # only dim 0 varies
    assert blade.report(optimized).clusters[0].inputs == "float32[s0,5,32]"
    with torch.no_grad():
        for batch in (1, 9):
            x = torch.randn(batch, 5, 32)
            assert_same(optimized(x), model(x))
        assert blade.report(optimized).runtime_fallbacks == 0
        x = torch.randn(2, 3, 32)                            # dim 1 is static: fallback
        assert_same(optimized(x), model(x))
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 1
    assert "size of dim 1 is 3, expected 5" in report.guard_status


class Gate(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) * y + x


def test_a_broken_relation_between_dims_falls_back_correctly():
    optimized = blade.optimize(Gate(), (torch.randn(6, 10), torch.randn(6, 10)), DYNAMIC)
    report = blade.report(optimized)
    assert report.clusters[0].inputs == "float32[s0,s1];float32[s0,s1]", str(report)
    x, y = torch.randn(3, 7), torch.randn(3, 1)               # y broadcasts: s1 differs
    with torch.no_grad():
        assert_same(optimized(x, y), Gate()(x, y))
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 1
    assert "needs it equal to dim 1 of input 0" in report.guard_status
    strict = blade.optimize(Gate(), (torch.randn(6, 10), torch.randn(6, 10)),
                            blade.Config(dynamic=True, fallback="error"))
    with pytest.raises(RuntimeError, match="both are s1"):
        strict(x, y)


def test_dims_the_model_needs_stay_static():
    model = Hidden().eval()
    optimized = blade.optimize(model, (torch.randn(4, 5, 32),), DYNAMIC)
    report = blade.report(optimized)
    assert report.dynamic_dims == [["input 0 ('x') dim 0"], ["input 0 ('x') dim 1"]], \
        str(report)
    assert report.clusters[0].inputs == "float32[s0,s1,32]"
    assert report.clusters[0].outputs == "float32[s0,s1]"
    with torch.no_grad():
        x = torch.randn(9, 2, 32)
        assert_same(optimized(x), model(x), rtol=1e-5, atol=1e-5)
    assert blade.report(optimized).runtime_fallbacks == 0


class Positions(torch.nn.Module):
    """Learned positions for at most 24 tokens: longer inputs fail, as a BERT's past 512."""

    def __init__(self):
        super().__init__()
        self.positions = torch.nn.Parameter(torch.randn(24, 16))

    def forward(self, x):
        return torch.tanh(x + self.positions[: x.shape[1]]).sum(-1)


def test_a_model_refusing_the_doubled_length_is_typed_at_half_of_it():
    """The types are first recorded on the grown sizes and, untried, the doubled ones; the
    model refuses length 36, so the probes choose the variants again (here the grown one
    alone: halving the batch of 2 gives 2 again) and the types are recorded anew."""
    model = Positions().eval()
    optimized = blade.optimize(model, (torch.randn(2, 16, 16),), DYNAMIC)
    report = blade.report(optimized)
    assert report.clusters[0].inputs == "float32[s0,s1,16]", str(report)
    with torch.no_grad():
        for length in (3, 16, 24):
            x = torch.randn(5, length, 16)
            assert_same(optimized(x), model(x), rtol=1e-5, atol=1e-5)
    assert blade.report(optimized).runtime_fallbacks == 0


def test_dynamic_dims_that_the_model_refuses_are_a_clear_error():
    with pytest.raises(ValueError, match="dim 2 of input 0 may vary, but the model fails"):
        blade.optimize(Hidden().eval(), (torch.randn(4, 5, 32),),
                       blade.Config(dynamic_dims={0: [2]}))
    # Named beside one the model takes, the refused dim is still named, not made static.
    with pytest.raises(ValueError, match="dim 2 of input 0 may vary, but the model fails"):
        blade.optimize(Hidden().eval(), (torch.randn(4, 5, 32),),
                       blade.Config(dynamic_dims={0: [0, 2]}))
    with pytest.raises(ValueError, match="input 3"):
        blade.optimize(Hidden().eval(), (torch.randn(4, 5, 32),),
                       blade.Config(dynamic_dims={3: [0]}))


def test_saved_dynamic_model_serves_new_shapes_and_releases_outputs(tmp_path):
    from blade import _C

    torch.manual_seed(0)
    model = BertLayer().eval()
    optimized = blade.optimize(model, bert_inputs(2, 16), DYNAMIC)
    torch.jit.save(optimized, str(tmp_path / "bert.pt"))
    loaded = torch.jit.load(str(tmp_path / "bert.pt"))
    live = _C.live_allocations()
    with torch.no_grad():
        for batch, seq in OTHER_SHAPES * 4:
            inputs = bert_inputs(batch, seq)
            assert_same(loaded(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert _C.live_allocations() == live
    assert blade.report(loaded).runtime_fallbacks == 0


class Convs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def optimize_told_all(model, inputs, config=DYNAMIC):
    """`blade.optimize`, checked to have found nothing the example cannot tell."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimized = blade.optimize(model, inputs, config)
    notes = [str(w.message) for w in caught if w.category is blade.DynamicShapesWarning]
    assert not notes and not blade.report(optimized).dynamic_notes, notes
    return optimized


def test_convolutions_of_dynamic_image_size():
    torch.manual_seed(0)
    model = Convs().eval()
    optimized = optimize_told_all(model, (torch.randn(2, 3, 16, 16),))
    report = blade.report(optimized)
    # Height and width are equal in the example, but the model takes them apart.
    assert report.clusters[0].inputs == "float32[s0,3,s1,s2]", str(report)
    with torch.no_grad():
        for shape in ((1, 3, 15, 15), (3, 3, 9, 9), (2, 3, 33, 33), (2, 3, 12, 20)):
            x = torch.randn(*shape)
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 0 and report.clusters[0].library_calls == 2, str(report)


def test_a_batch_equal_to_the_channels_varies_alone():
    torch.manual_seed(0)
    model = Convs().eval()
    optimized = optimize_told_all(model, (torch.randn(3, 3, 16, 16),))
    assert blade.report(optimized).clusters[0].inputs == "float32[s0,3,s1,s2]"
    serves_whole(optimized, model, [(torch.randn(*shape),) for shape in
                                    ((5, 3, 16, 16), (1, 3, 10, 14), (3, 3, 16, 16))])


def test_a_batch_equal_to_the_length_varies_apart_and_ties_stay_tied():
    torch.manual_seed(0)
    model = BertLayer().eval()
    optimized = optimize_told_all(model, bert_inputs(4, 4))
    report = blade.report(optimized)
    # Each of the input's dims is tied to the mask's, and not to the other.
    assert report.clusters[0].inputs == "float32[s0,s1,64];float32[s0,1,1,s1]", str(report)
    serves_whole(optimized, model, [bert_inputs(b, s) for b, s in ((2, 7), (4, 4), (6, 3))])


class TokenMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, ids):
        return torch.softmax(self.proj(self.embed(ids)), dim=-1)


def test_a_batch_of_one_is_said_to_stay_static_with_the_fix():
    """A size-1 dim may be a broadcast, so it stays static: optimize says so, where the
    model also runs with it larger, and names the fix; the fix serves other batches."""
    model = TokenMlp().eval()
    ids = torch.randint(0, 50, (1, 12))
    with pytest.warns(blade.DynamicShapesWarning, match=r"input 0 \('ids'\) dim 0 has size 1 in the example.*"
                      r"Config\.dynamic_dims") as caught:
        optimized = blade.optimize(model, (ids,), DYNAMIC)
    notes = [str(w.message) for w in caught if w.category is blade.DynamicShapesWarning]
    assert len(notes) == 1, notes
    report = blade.report(optimized)
    assert report.clusters[0].inputs == "int64[1,s0]", str(report)
    assert "the example cannot tell: input 0 ('ids') dim 0 has size 1" in str(report)
    fixed = optimize_told_all(model, (ids,), blade.Config(dynamic=True, dynamic_dims={0: [0, 1]}))
    serves_whole(fixed, model, [(torch.randint(0, 50, s),) for s in ((3, 7), (1, 30))])


class CrossAttention(torch.nn.Module):
    def forward(self, queries, keys):
        scores = queries @ keys.transpose(1, 2) / math.sqrt(queries.shape[-1])
        return torch.softmax(scores, dim=-1) @ keys


def test_equal_lengths_of_two_inputs_the_model_takes_apart_are_said_to_be_tied():
    model = CrossAttention()
    with pytest.warns(blade.DynamicShapesWarning, match=r"input 0 \('queries'\) dim 1 and input 1 \('keys'\) "
                      r"dim 1 are equal in the example.*give an example where they differ"):
        optimized = blade.optimize(model, (torch.randn(2, 6, 8), torch.randn(2, 6, 8)), DYNAMIC)
    assert blade.report(optimized).guard_specs == "float32[s0,s1,s2];float32[s0,s1,s2]"
    # The fix the warning names: an example with the lengths apart.
    apart = optimize_told_all(model, (torch.randn(2, 6, 8), torch.randn(2, 9, 8)))
    assert blade.report(apart).guard_specs == "float32[s0,s1,s2];float32[s0,s3,s2]"
    serves_whole(apart, model, [(torch.randn(3, 4, 8), torch.randn(3, 11, 8)),
                                (torch.randn(1, 7, 8), torch.randn(1, 7, 8))])


def test_attention_of_3d_operands_compiles_whole():
    """Batched matmuls of rank 3 with a dynamic batch (heads folded into the batch)."""
    model = CrossAttention()
    optimized = optimize_told_all(model, (torch.randn(2, 6, 8), torch.randn(2, 9, 8)))
    serves_whole(optimized, model, [(torch.randn(5, 3, 8), torch.randn(5, 4, 8))])


class SquareOnly(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x + x.t())


def test_dims_the_model_needs_equal_share_a_symbol():
    optimized = optimize_told_all(SquareOnly(), (torch.randn(5, 5),))
    assert blade.report(optimized).clusters[0].inputs == "float32[s0,s0]"
    serves_whole(optimized, SquareOnly(), [(torch.randn(n, n),) for n in (2, 9)])


def test_group_norm_of_dynamic_size():
    # GroupNorm's element count per group is a product over a dynamic shape
    # (shape.num_elements), which the shape lowering has to take.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.GroupNorm(4, 16),
                                torch.nn.SiLU()).eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 12, 12),), DYNAMIC)
    shapes = ((1, 8, 5, 5), (3, 8, 12, 12), (2, 8, 17, 17), (2, 8, 6, 11))
    report = serves_whole(optimized, model, [(torch.randn(*shape),) for shape in shapes])
    assert report.clusters[0].inputs == "float32[s0,8,s1,s2]", str(report)


class Lookups(torch.nn.Module):
    """Gathers whose sizes vary: an embedding of a dynamic token batch (a table that is a
    param, read inside the loop) and index_select along a middle dim and along the first
    dim of an input."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(50, 16)

    def forward(self, tokens, rows, x):
        e = self.table(tokens)                                   # [b, s, 16]
        picked = torch.index_select(e, 1, rows)                  # [b, k, 16]
        return picked.mean(1) * 2.0 + e.sum(1) + x.index_select(0, rows).sum(0)


def test_gathers_of_dynamic_size():
    torch.manual_seed(0)
    model = Lookups().eval()

    def inputs(b, s, k, n):
        return (torch.randint(0, 50, (b, s)), torch.randint(0, min(s, n), (k,)),
                torch.randn(n, 16))

    optimized = blade.optimize(model, inputs(2, 7, 3, 9), DYNAMIC)
    serves_whole(optimized, model,
                 [inputs(*sizes) for sizes in ((1, 5, 1, 5), (4, 12, 6, 20), (3, 2, 9, 2))])


class Flips(torch.nn.Module):
    def forward(self, x):
        return x.flip(0) * 2.0 + x.flip(1, 2) - torch.roll(x, 3, 1)


def test_flips_of_dynamic_size():
    torch.manual_seed(0)
    model = Flips().eval()
    optimized = blade.optimize(model, (torch.randn(64, 40, 30),), DYNAMIC)
    serves_whole(optimized, model,
                 [(torch.randn(*shape),) for shape in ((1, 3, 2), (65, 41, 31), (200, 17, 40))])


class Spread(torch.nn.Module):
    def forward(self, x):
        normalized = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
        return normalized + torch.var(x, [0, 2], unbiased=False).view(1, -1, 1)


def test_std_and_var_of_dynamic_size():
    torch.manual_seed(0)
    model = Spread().eval()
    optimized = blade.optimize(model, (torch.randn(4, 6, 32),), DYNAMIC)
    report = serves_whole(optimized, model,
                          [(torch.randn(*shape),) for shape in ((1, 2, 2), (5, 9, 70), (3, 1, 33))])
    assert report.decomposed == {"aten::std.dim": 1, "aten::var.dim": 1}, str(report)


class RowSpread(torch.nn.Module):
    def forward(self, x):
        return x.var(-1) * 2, x.std(-1, keepdim=True) + 1


def test_std_and_var_of_one_element_or_none_are_nan_as_in_eager():
    """PyTorch divides by max(count - 1, 0): NaN over one element or none (the decomposition
    divided by count - 1, -0 over none)."""
    torch.manual_seed(0)
    model = RowSpread().eval()
    optimized = blade.optimize(model, (torch.randn(4, 6, 32),), DYNAMIC)
    with torch.no_grad():
        for shape in ((2, 3, 0), (2, 3, 1), (0, 3, 5)):
            x = torch.randn(*shape)
            for actual, expected in zip(optimized(x), model(x)):
                assert_same_values(actual, expected)
    report = assert_ran_compiled(optimized)
    assert report.decomposed == {"aten::std.dim": 1, "aten::var.dim": 1}, str(report)


class ScalarsOfSizes(torch.nn.Module):
    """Floats computed from a dynamic size and used as elementwise scalars: the engine
    computes them itself (duplicate_shape_arithmetic lists the schemas)."""

    def forward(self, x):
        n = x.size(-1)
        a = (float(n) + 0.5) * 2.0 - 1.0
        b = n * 0.5 / math.sqrt(n)
        return x * a + x / b - 2 / n


class PowerOfASize(torch.nn.Module):
    def __init__(self, exponent):
        super().__init__()
        self.exponent = exponent

    def forward(self, x):
        return x * x.size(-1) ** self.exponent


def test_floats_computed_from_sizes_are_compiled():
    model = ScalarsOfSizes()
    optimized = blade.optimize(model, (torch.randn(3, 5),), DYNAMIC)
    serves_whole(optimized, model, [(torch.randn(*shape),) for shape in ((3, 5), (2, 9), (1, 1))])


@pytest.mark.parametrize("exponent", [-0.5, 0.5, -1.0])
def test_an_attention_scale_power_of_a_size_is_compiled(exponent):
    """`d ** -0.5` of a dynamic size: decomposed into sqrt and a division of the int,
    which the engine computes itself."""
    model = PowerOfASize(exponent)
    optimized = blade.optimize(model, (torch.randn(3, 5),), DYNAMIC)
    report = serves_whole(optimized, model,
                          [(torch.randn(*shape),) for shape in ((3, 5), (2, 9), (1, 1))])
    assert report.decomposed == {"aten::pow.int_float": 1}, str(report)


def test_another_power_of_a_size_stays_in_torchscript_with_the_reason():
    """Torch-MLIR lowers no pow of scalars: the multiply stays out, named, and runs; the
    pow is not counted as decomposed."""
    model = PowerOfASize(1.5)
    optimized = blade.optimize(model, (torch.randn(3, 5),), DYNAMIC)
    report = blade.report(optimized)
    assert report.coverage == 0.0 and not report.decomposed, str(report)
    assert "argument 'other' (%" in str(report) and "made by aten::pow" in str(report), \
        str(report)
    x = torch.randn(2, 9)
    assert_same(optimized(x), model(x), rtol=1e-6, atol=1e-6)


class HeadSplit(torch.nn.Module):
    """The attention idiom: a slice of a fused projection viewed as heads."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x):
        batch, length = x.size(0), x.size(1)
        q = self.qkv(x)[:, :, 64:128]          # strided: every row skips 128 floats
        heads = q.view(batch, length, 4, 16).transpose(1, 2)
        return heads.reshape(batch * 4, length, 16) * 2.0


def test_views_of_dynamic_size_keep_the_dims_they_pass_through(tmp_path):
    torch.manual_seed(0)
    model = HeadSplit().eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 64),),
                               blade.Config(dynamic=True, dump_dir=str(tmp_path)))
    check_every_shape(optimized, model, lambda b, s: (torch.randn(b, s, 64),))
    # The head split expands only the last dim: a view of the strided slice, no copy.
    linalg = ir_before(tmp_path, "write-slices-in-place")
    assert "[[0], [1], [2, 3]]" in linalg, linalg
    bufferized = ir_before(tmp_path, "mark-out-params")
    assert "memref.copy" not in bufferized, bufferized


@pytest.mark.parametrize("source, result, passed, groups", [
    # [s0, s1, 768] -> [s0, s1, 12, 64], both dynamic dims proven to pass through
    ([None, None, 768], [None, None, 12, 64], [0, 1, None, None],
     ([[0], [1], [2]], [[0], [1], [2, 3]])),
    # the merge of heads back, and a static regrouping in the middle
    ([None, 6, 4], [None, 3, 8], [0, None, None], ([[0], [1, 2]], [[0], [1, 2]])),
    # keepdim: a trailing 1 joins the last group; leading 1s join the next group
    ([None, 12, None], [None, 12, None, 1], [0, None, 2, None],
     ([[0], [1], [2]], [[0], [1], [2, 3]])),
    ([1, None], [None], [1], ([[0, 1]], [[0]])),
    # dims not proven equal: no grouping (the caller flattens)
    ([None, None, 768], [None, None, 12, 64], [0, None, None, None], None),
    ([None, 3], [3, None], [None, 0], None),
])
def test_reassociation_groups_only_what_it_can_prove(source, result, passed, groups):
    from blade.codegen.stablehlo.shape_assumptions import reassociation
    assert reassociation(source, result, passed) == groups


class FlattenAndPool(torch.nn.Module):
    """Torch-MLIR sizes a flatten of dynamic dims as numel / the batch size."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return y.flatten(1).sum(-1)


def test_flatten_of_an_empty_batch_divides_nothing_by_zero(tmp_path):
    """An empty batch: eager gives an empty result, where numel / (batch * ...) divided by
    zero (SIGFPE). shape_assumptions.divide_out_sizes multiplies the merged dims instead."""
    torch.manual_seed(0)
    model = FlattenAndPool().eval()
    optimized = blade.optimize(model, (torch.randn(2, 8, 10, 10),),
                               blade.Config(dynamic=True, dump_dir=str(tmp_path)))
    report = serves_whole(optimized, model, [(torch.randn(0, 8, 10, 10),),
                                             (torch.randn(3, 8, 6, 6),),
                                             (torch.randn(0, 8, 4, 4),)])
    assert len(report.dynamic_dims) == 3, str(report)   # the batch, height, width
    # Sizes are never divided by a size (a division by a constant would be safe).
    linalg = ir_before(tmp_path, "write-slices-in-place")
    divisions = re.findall(r"arith\.div[su]i %\w+, (%\w+)", linalg)
    assert all(d.startswith("%c") for d in divisions), divisions


# Run in a process of its own: the failure this guards against is a segfault.
PROBE_AFTER_A_FROZEN_COPY_RAN = """
import torch
import blade
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True,
                                                                dropout=0.0)
                              for _ in range(2)]).eval()
x = torch.randn(1, 16, 64)
plain = torch.jit.freeze(torch.jit.trace(model, (x,), check_trace=False).eval())
with torch.no_grad():
    plain(x)
    plain(x)
optimized = blade.optimize(model, (x,), blade.Config(dynamic=True))
longer = torch.randn(1, 24, 64)
with torch.no_grad():
    assert torch.allclose(optimized(longer), model(longer), rtol=1e-4, atol=1e-4)
report = blade.report(optimized)
assert report.clusters and all(c.compiled and c.calls > 0 for c in report.clusters), report
try:
    with torch.no_grad():
        optimized(torch.randn(1, 16, 65))
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
print("ok")
"""


def test_probing_a_frozen_model_that_raises_does_not_crash():
    """Freezing frees the methods its graph's inlined call stacks point to, and TorchScript
    reads them to print the traceback of an op that raises: probing a resized feature dim
    of an encoder (its attention op raises) segfaulted once another traced copy had run."""
    import subprocess
    run = subprocess.run([sys.executable, "-c", PROBE_AFTER_A_FROZEN_COPY_RAN],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "ok", run.stdout
    assert "raised:" in run.stdout, run.stdout


class _PooledConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_dynamic_image_size_with_a_static_output():
    """Dynamic height and width, a result of static shape (global pooling): main's result
    becomes an out-param while the convolutions' library calls keep results of dynamic
    size (the pass that made out-params took those too, and the whole cluster fell back)."""
    torch.manual_seed(0)
    model = _PooledConvNet().eval()
    optimized = blade.optimize(model, (torch.randn(1, 3, 32, 32),), blade.Config(dynamic=True))
    for size in (32, 40, 17):
        x = torch.randn(1, 3, size, size)
        with torch.no_grad():
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-4)
    report = assert_ran_compiled(optimized)
    assert report.dynamic_dims and report.guard_fallbacks == 0, str(report)
