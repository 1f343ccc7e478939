"""keep_rank_checks: dim() of a convolution's result reads the convolution's input, and a
BatchNorm whose fold needs a batched input the graph does not check gets a fold barrier;
the module handed in is left as it was."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C
from blade.quiet import quiet_torchscript


class ConvBatchNorm2d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x))


class LinearBatchNorm1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x))


def prepared(model):
    with quiet_torchscript():
        scripted = torch.jit.script(model.eval())
        before = str(scripted.graph)
        copy = torch.jit._recursive.wrap_cpp_module(_C.copy_keeping_rank_checks(scripted._c))
    assert str(scripted.graph) == before     # the module handed in is untouched
    return copy


def rank_reads(graph):
    """The nodes whose rank each dim() reads."""
    return [n.input().node().kind() for n in graph.findAllNodes("aten::dim")]


def test_a_rank_read_of_a_conv_result_reads_the_conv_input():
    with quiet_torchscript():
        graph = torch.jit.script(ConvBatchNorm2d().eval()).graph.copy()
    torch._C._jit_pass_inline(graph)
    assert rank_reads(graph) == ["aten::conv2d", "aten::conv2d"]  # the check, its message
    assert _C.keep_rank_checks(graph) == (2, 0)                  # and no barrier
    assert rank_reads(graph) == ["prim::Param", "prim::Param"]


def test_batchnorm2d_still_folds_and_keeps_its_check():
    model = ConvBatchNorm2d().eval()
    with quiet_torchscript():
        frozen = torch.jit.freeze(prepared(model))
    FileCheck().check("aten::conv2d").check("prim::RaiseException") \
        .check_not("aten::batch_norm").run(str(frozen.graph))
    x = torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), model(x), rtol=1e-5, atol=1e-5)
    try:
        frozen(torch.randn(3, 10, 10))
    except torch.jit.Error as e:
        assert "builtins.ValueError: expected 4D input (got 3D input)" in str(e)
    else:
        raise AssertionError("an unbatched input passed BatchNorm2d's check")
    with quiet_torchscript():  # what torch.jit.freeze alone does
        plain = torch.jit.freeze(torch.jit.script(model))
    assert plain(torch.randn(3, 10, 10)).shape == (8, 8, 8)


def test_linear_batchnorm1d_gets_a_barrier_that_freezing_leaves_and_is_removed():
    model = LinearBatchNorm1d().eval()
    copy = prepared(model)
    FileCheck().check("aten::linear").check("blade::fold_barrier").check("aten::batch_norm") \
        .run(str(copy.graph))
    with quiet_torchscript():
        frozen = torch.jit.freeze(copy)
    assert _C.remove_fold_barriers(frozen.graph) == 1
    FileCheck().check_not("blade::fold_barrier").check("aten::linear") \
        .check("aten::batch_norm").run(str(frozen.graph))
    # 3-D input: BatchNorm1d normalizes dim 1, not the Linear's output features.
    x = torch.randn(4, 6, 8)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), model(x))
