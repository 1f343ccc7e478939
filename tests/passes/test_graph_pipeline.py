"""Each pass of the TorchScript-level pipeline (blade.frontend.pipeline) on a small model:
the graph before and after it, and what it returned (tests/passes/graph_runner.py). Passes
with more to test have files of their own (test_<pass>.py); every pass of the pipeline is
named by some test here or there (test_every_graph_pass_is_tested)."""
import re
from pathlib import Path
from typing import List, Optional

import pytest
import torch
from torch.testing import FileCheck

import blade
from blade.frontend import pipeline
from graph_runner import run_pass

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Attention(torch.nn.Module):
    """nn.MultiheadAttention puts its weights in a tuple for its fast path's checks:
    freezing leaves them GetAttrs."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class OptionalMask(torch.nn.Module):
    def forward(self, x, mask: Optional[torch.Tensor] = None):
        if mask is not None:
            x = x * mask
        return x + 1


class WritesInput(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class WritesOneElement(torch.nn.Module):
    def forward(self, x, i: torch.Tensor):
        x.index_put_((i,), torch.ones(1))
        return x * 2


class IntoInts(torch.nn.Module):
    def forward(self, x):
        x.add_(0.5)
        return x


class Sizes(torch.nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1) * x.numel()


class Heads(torch.nn.Module):
    def forward(self, x):
        n = x.size(0) * x.size(1)
        return x.reshape(n, -1) + torch.ones(n, 1)


class TopkThenTanh(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.topk(x, 2, sorted=False).values)


class Transposed(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x)
        return y, y.t()


class Branches(torch.nn.Module):
    def forward(self, x, flag: bool):
        if flag:
            x = torch.tanh(x) * 2 + 1
        return torch.relu(x)


def check(text: str, *patterns: str, absent: List[str] = ()) -> None:
    checker = FileCheck()
    for pattern in patterns:
        checker = checker.check(pattern)
    for pattern in absent:
        checker = checker.check_not(pattern)
    checker.run(text)


def test_freeze_makes_weights_constants_and_keeps_rank_checks():
    before, _, after, c = run_pass(Linear(), (torch.randn(4, 8),), "freeze")
    assert "prim::GetAttr" in before and c.module is not None
    check(after, "prim::Constant[value=<Tensor>]", "aten::linear", absent=["prim::GetAttr",
                                                                          "fold_barrier"])


def test_detach_inlined_functions_rebuilds_call_stacks():
    _, rebuilt, _, _ = run_pass(Linear(), (torch.randn(4, 8),), "detach_inlined_functions")
    assert rebuilt > 0


def test_find_dynamic_dims_finds_the_dims_that_vary():
    _, _, _, c = run_pass(Linear(), (torch.randn(4, 8),), "find_dynamic_dims",
                          blade.Config(dynamic=True))
    assert [g.dims for g in c.groups] == [[(0, 0)]] and c.resized_inputs


def test_fold_tensor_attributes_makes_unwritten_attribute_tensors_constants():
    before, folded, after, _ = run_pass(Attention(), (torch.randn(2, 4, 8),),
                                        "fold_tensor_attributes")
    # The reads now read constants (the GetAttrs are left for DCE).
    constant = "prim::Constant[value=<Tensor>]"
    assert folded > 0 and after.count(constant) > before.count(constant)


def test_from_dynamic_quantized_runs_quantize_dynamic_layers_as_blade_s_op():
    if not blade._C.has_int8_dot_product():
        pytest.skip("models quantized before need a dot product (VNNI)")
    model = torch.ao.quantization.quantize_dynamic(Linear().eval(), {torch.nn.Linear})
    before, _, after, _ = run_pass(model, (torch.randn(4, 8),), "from_dynamic_quantized")
    assert "quantized::linear_dynamic" in before
    check(after, "blade::quantized_linear", absent=["quantized::linear_dynamic"])


def test_from_static_quantized_runs_eager_static_quantized_linears_as_blade_s_op():
    if not blade._C.has_int8_dot_product():
        pytest.skip("models quantized before need a dot product (VNNI)")
    model = torch.nn.Sequential(torch.ao.quantization.QuantStub(), torch.nn.Linear(8, 8),
                                torch.ao.quantization.DeQuantStub()).eval()
    model.qconfig = torch.ao.quantization.default_qconfig
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(4, 8))
    torch.ao.quantization.convert(model, inplace=True)
    before, rewritten, after, _ = run_pass(model, (torch.randn(4, 8),), "from_static_quantized")
    assert "quantized::linear" in before and rewritten == 1
    check(after, "blade::quantized_linear", absent=["quantized::linear(", "aten::dequantize",
                                                    "aten::quantize_per_tensor"])


def test_keep_unspecialized_copies_the_graph_before_the_decompositions():
    _, _, _, c = run_pass(Linear(), (torch.randn(4, 8),), "keep_unspecialized")
    kinds = [n.kind() for n in c.graph.nodes()]
    assert [n.kind() for n in c.unspecialized.nodes()] == kinds and "aten::linear" in kinds
    c.graph.eraseOutput(0)  # a copy: the graph's passes leave it as it was
    assert len(list(c.unspecialized.outputs())) == 1


def test_decompose_counts_what_it_decomposed():
    class LogSumExp(torch.nn.Module):
        def forward(self, x):
            return torch.logsumexp(x, 1)

    before, _, after, c = run_pass(LogSumExp(), (torch.randn(4, 8),), "decompose")
    assert "aten::logsumexp" in before and c.decomposed == {"aten::logsumexp": 1}
    check(after, "aten::exp", absent=["aten::logsumexp"])


def test_simplify_structure_makes_in_place_ops_on_fresh_values_functional():
    class Fresh(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            y.add_(1)
            return y

    before, _, after, _ = run_pass(Fresh(), (torch.randn(4),), "simplify_structure")
    assert "aten::add_" in before
    check(after, "aten::mul", "aten::add(", absent=["aten::add_"])


def test_specialize_none_inputs_folds_the_branch_on_a_none_input():
    before, _, after, c = run_pass(OptionalMask(), (torch.randn(4), None),
                                   "specialize_none_inputs")
    assert c.none_inputs == [2] and "prim::If" in before
    check(after, "aten::add", absent=["prim::If", "aten::mul"])


def test_functionalize_input_writes_writes_back_into_the_input():
    before, _, after, _ = run_pass(WritesInput(), (torch.randn(4),),
                                   "functionalize_input_writes")
    assert "aten::add_" in before
    check(after, "aten::add(", "blade::write_back", absent=["aten::add_"])


def int8_model():
    """Layers large enough for int8 (frontend/quantize.MIN_MACS at 128 rows)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(512, 512),
                                                               torch.nn.ReLU())])


def test_quantize_int8_makes_linear_layers_int8():
    if not blade.int8_supported():
        pytest.skip("this CPU has no int8 kernels")
    model = int8_model()
    x = torch.randn(128, 512)
    before, _, after, c = run_pass(model, (x,), "quantize_int8",
                                   blade.Config(precision="int8"))
    assert "blade::quantized_linear" not in before and c.int8 is not None
    assert "blade::quantized_linear" in after


def test_materialize_types_records_every_tensor_s_type():
    before, _, after, c = run_pass(Linear(), (torch.randn(4, 8),), "materialize_types")
    assert "Float(4, 8" not in before
    check(after, "Float(4, 8, strides=[8, 1]", "aten::linear")
    assert len(c.results) == 1 and c.results[0].shape == (4, 8)


def test_check_in_place_casts_raises_eager_s_error():
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        run_pass(IntoInts(), (torch.arange(4),), "check_in_place_casts")


def test_functionalize_small_writes_writes_a_few_elements_as_a_new_value():
    before, _, after, _ = run_pass(WritesOneElement(), (torch.randn(4), torch.tensor([1])),
                                   "functionalize_small_writes")
    assert "aten::index_put_" in before
    check(after, "aten::index_put(", "blade::write_back", absent=["aten::index_put_"])


# A model per typed rewrite (frontend/typed_rewrites.py), which each one rewrites once.
class FreshCast(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.float64) + 1


class FloatComparison(torch.nn.Module):
    def forward(self, x):
        return x < 0


class TensorDivisor(torch.nn.Module):
    def forward(self, x):
        return torch.fmod(x, 3)


class ReductionDtype(torch.nn.Module):
    def forward(self, x):
        return x.sum(dtype=torch.float64)


class FloatMathOfIntegers(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x)


class ScalarIndexSelect(torch.nn.Module):
    def forward(self, x, i):
        return torch.index_select(x, 0, i)


class ScalarVectorNorm(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.vector_norm(x[0, 0])


class NegativeIndices(torch.nn.Module):
    def forward(self, x, i):
        return x[i]


class FloorDivision(torch.nn.Module):
    def forward(self, x):
        return x // 3


class BroadcastBatchMatmul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


class ComputedScatterValue(torch.nn.Module):
    def forward(self, x, index, v):
        return x.scatter(0, index, float(v))


class ShiftByScalar(torch.nn.Module):
    def forward(self, x):
        return x >> 2


class EmbeddingFlags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4, padding_idx=0)

    def forward(self, i):
        return self.table(i)


class ScalarReduction(torch.nn.Module):
    def forward(self, x):
        return x[0, 0].sum()


class UnbatchedImage(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, 2)


TYPED_REWRITES = {
    "fresh_casts": (FreshCast(), (torch.randn(4),), "aten::_to_copy"),
    "float_comparison_scalars": (FloatComparison(), (torch.randn(4),), "aten::lt"),
    "tensor_divisors": (TensorDivisor(), (torch.randn(4),), "aten::fmod"),
    "reduction_dtypes": (ReductionDtype(), (torch.randn(4),), "aten::_to_copy"),
    "float_math_of_integers": (FloatMathOfIntegers(), (torch.arange(4),), "aten::sin"),
    "scalar_index_selects": (ScalarIndexSelect(), (torch.randn(4, 3), torch.tensor(1)),
                             "aten::index_select"),
    "scalar_vector_norms": (ScalarVectorNorm(), (torch.randn(4, 3),), "aten::abs"),
    "negative_tensor_indices": (NegativeIndices(), (torch.randn(4, 3), torch.tensor([-1, 2])),
                                "aten::where"),
    "integer_floor_divisions": (FloorDivision(), (torch.arange(-8, 8),), "aten::where"),
    "broadcast_batch_matmuls": (BroadcastBatchMatmul(),
                                (torch.randn(2, 1, 8, 5), torch.randn(3, 5, 6)),
                                "aten::matmul"),
    "computed_scatter_values": (ComputedScatterValue(),
                                (torch.zeros(4), torch.tensor([1, 2]), torch.tensor(2.5)),
                                "aten::scatter"),
    "shifts_by_scalars": (ShiftByScalar(), (torch.arange(8),), "aten::bitwise_right_shift"),
    "embedding_training_flags": (EmbeddingFlags(), (torch.tensor([1, 2, 0]),),
                                 "aten::embedding"),
    "scalar_reductions": (ScalarReduction(), (torch.randn(4, 3),), "aten::clone"),
    "batched_images": (UnbatchedImage(), (torch.randn(3, 8, 8),), "aten::unsqueeze"),
}


@pytest.mark.parametrize("name", sorted(TYPED_REWRITES))
def test_each_typed_rewrite_rewrites_its_case_once(name):
    model, inputs, made = TYPED_REWRITES[name]
    before, rewritten, after, _ = run_pass(model, inputs, name)
    assert rewritten, (name, after)
    assert before != after and made in after, after


def test_broadcast_batch_matmuls_makes_a_dynamic_3d_matmul_a_bmm():
    """Two 3-d operands whose batch is one dynamic symbol: Torch-MLIR refuses the matmul
    (the batch might broadcast), so it becomes a bmm; a static batch stays a matmul."""
    inputs = (torch.randn(2, 6, 8), torch.randn(2, 8, 5))
    _, rewritten, after, _ = run_pass(BroadcastBatchMatmul(), inputs, "broadcast_batch_matmuls",
                                      blade.Config(dynamic=True))
    assert rewritten == 1 and "aten::bmm" in after and "aten::matmul" not in after, after
    _, rewritten, after, _ = run_pass(BroadcastBatchMatmul(), inputs, "broadcast_batch_matmuls")
    assert not rewritten and "aten::matmul" in after, after


def test_explicit_pool_windows_pads_a_ceil_mode_pooling():
    class CeilPool(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.max_pool2d(x, 2, ceil_mode=True)

    before, rewritten, after, _ = run_pass(CeilPool(), (torch.randn(1, 2, 5, 5),),
                                           "explicit_pool_windows")
    assert rewritten == 1 and "aten::constant_pad_nd" not in before
    check(after, "aten::constant_pad_nd", "aten::max_pool2d")


def test_simplify_shapes_folds_static_sizes():
    before, _, after, _ = run_pass(Sizes(), (torch.randn(4, 2, 3),), "simplify_shapes")
    assert "aten::size" in before and "aten::numel" in before
    check(after, "aten::view", absent=["aten::size", "aten::numel"])


def test_duplicate_shape_arithmetic_gives_each_use_its_own_size():
    before, _, after, _ = run_pass(Heads(), (torch.randn(4, 5, 3),),
                                   "duplicate_shape_arithmetic", blade.Config(dynamic=True))
    assert after.count("aten::mul(%") > before.count("aten::mul(%")


def test_judge_ops_counts_tensor_ops_and_lists_the_unsupported():
    config = blade.Config(kernel_calls=False)
    _, _, _, c = run_pass(TopkThenTanh(), (torch.randn(4, 8),), "judge_ops", config)
    assert c.report.total_ops == 2 and list(c.report.unsupported) == ["aten::topk"]
    assert c.verdicts


def test_cluster_groups_supported_ops():
    before, _, after, c = run_pass(Linear(), (torch.randn(4, 8),), "cluster")
    assert len(c.clusters) == 1 and "prim::FunctionalGraph" not in before
    check(after, "prim::FunctionalGraph")


def test_compile_clusters_calls_engines():
    _, _, after, c = run_pass(Linear(), (torch.randn(4, 8),), "compile_clusters")
    check(after, "blade::execute", absent=["prim::FunctionalGraph"])
    assert [e.name for e in c.report.clusters] == ["blade_engine_0"]


def test_account_for_ops_outside_engines_lists_every_op_left_out():
    _, _, _, c = run_pass(TopkThenTanh(), (torch.randn(4, 8),),
                          "account_for_ops_outside_engines", blade.Config(kernel_calls=False))
    assert c.report.total_ops - c.report.compiled_ops == \
        sum(e.count for e in c.report.unsupported.values())


def test_release_edge_views_makes_a_returned_view_after_the_engine():
    before, _, after, c = run_pass(Transposed(), (torch.randn(4, 8),), "release_edge_views")
    assert c.report.edge_views == 1
    check(after, "blade::execute", "aten::t(")


def test_int8_readers_point_every_reader_at_the_int8_weights():
    if not blade.int8_supported():
        pytest.skip("this CPU has no int8 kernels")
    model = int8_model()
    _, _, _, c = run_pass(model, (torch.randn(128, 512),), "int8_readers",
                          blade.Config(precision="int8"))
    assert "blade::quantized_linear" in str(c.unspecialized) and c.report.int8


def test_guard_puts_the_graph_under_an_input_guard():
    before, _, after, _ = run_pass(Linear(), (torch.randn(4, 8),), "guard")
    assert "blade::guard_admits" not in before
    check(after, "blade::guard_admits", "prim::If", "blade::execute")


def test_read_weights_from_engines_reads_the_unspecialized_model_s_weights_there():
    before, _, after, _ = run_pass(Linear(), (torch.randn(4, 8),), "read_weights_from_engines")
    assert "prim::Constant[value=<Tensor>]" in before
    check(after, 'prim::CallMethod[name="param"]',
          absent=["prim::Constant[value=<Tensor>]"])


def test_remove_unread_attributes_removes_what_no_method_reads():
    _, removed, _, c = run_pass(Attention(), (torch.randn(2, 4, 8),),
                                "remove_unread_attributes")
    # The weights fold_tensor_attributes made constants (an engine's params now).
    assert removed > 0 and not c.module._c.getattr("attn").hasattr("in_proj_weight")


def test_outline_branches_makes_large_branches_functions():
    before, outlined, after, _ = run_pass(Branches(), (torch.randn(4, 8), True),
                                          "outline_branches")
    assert outlined >= 1 and "prim::CallFunction" not in before
    check(after, "prim::CallFunction")


def test_every_graph_pass_is_tested():
    """Every pass of the pipeline, for every option that adds passes, is named by a test
    under tests/passes, but PyTorch's own passes (tested upstream)."""
    every_option = blade.Config(dynamic=True, precision="int8")
    names = {p.name for p in pipeline.build(every_option)}
    upstream = {"inline", "remove_dropout", "constant_propagation", "dce"}
    named = set()
    for path in HERE.glob("test_*.py"):
        named.update(re.findall(r'"([a-z][a-z0-9_]+)"', path.read_text()))
    assert not names - upstream - named, sorted(names - upstream - named)


def test_every_cpp_pass_has_a_test_file():
    """Each graph pass in csrc/passes (a header each) has tests/passes/test_<pass>.py."""
    passes = {p.stem for p in (ROOT / "csrc" / "passes").glob("*.h")} - {"uses"}
    tested = {p.stem[len("test_"):] for p in HERE.glob("test_*.py")}
    assert not passes - tested, sorted(passes - tested)


class TwiceDequantized(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quantize = torch.ao.quantization.QuantStub()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(self.quantize(x))
        return y.dequantize(), y.dequantize()


def test_from_static_quantized_leaves_a_result_dequantized_twice():
    """Two dequantize calls return two tensors in eager; one rewritten value would be
    shared by both."""
    if not blade._C.has_int8_dot_product():
        pytest.skip("models quantized before need a dot product (VNNI)")
    model = TwiceDequantized().eval()
    model.qconfig = torch.ao.quantization.default_qconfig
    torch.ao.quantization.prepare(model, inplace=True)
    model(torch.randn(4, 8))
    torch.ao.quantization.convert(model, inplace=True)
    _, rewritten, after, _ = run_pass(model, (torch.randn(4, 8),), "from_static_quantized")
    assert rewritten == 0 and "quantized::linear" in after
