"""outline_branches: if-branches of more than `min_nodes` nodes become functions, inner ones
first, saved a few to a file; branches with an engine call, and small ones, stay.
Same results before and after, and after saving and loading."""
import zipfile

import torch
from torch.testing import FileCheck

from blade import _C
from blade.quiet import quiet_torchscript


class Branchy(torch.nn.Module):
    def forward(self, x, flag: bool, deep: bool):
        if flag:
            y = torch.tanh(x) * 2.0 + 1.0
            if deep:
                z = torch.relu(y) - x
                z = z * z + y
            else:
                z = y
            w = torch.sigmoid(z)
        else:
            y = x - 1.0
            w = x
        return y + w


def scripted_branchy():
    # A class of its own each time: TorchScript shares one type (and graph) per class.
    with quiet_torchscript():
        return torch.jit.script(type("Branchy", (Branchy,), {})().eval())


def test_large_branches_become_methods_inner_first():
    module = scripted_branchy()
    graph = module.graph
    assert _C.outline_branches(graph, 1) == 2
    FileCheck().check("prim::If").check("prim::CallFunction").check("prim::TupleUnpack") \
        .check_not("aten::tanh").run(str(graph))
    # The else branch (one node) stays; inlined again, the calls give back both branches.
    FileCheck().check("aten::sub").run(str(graph))
    inlined = graph.copy()
    torch._C._jit_pass_inline(inlined)
    FileCheck().check("aten::tanh").check("aten::relu").check("aten::sigmoid") \
        .check_not("prim::CallFunction").run(str(inlined))


def test_outlined_model_gives_the_same_results_saved_and_loaded(tmp_path):
    reference = Branchy().eval()
    module = scripted_branchy()
    _C.outline_branches(module.graph, 1)
    path = tmp_path / "outlined.pt"
    torch.jit.save(module, str(path))
    loaded = torch.jit.load(str(path))
    # The functions go to files apart from forward's: loading compiles them from those.
    with zipfile.ZipFile(path) as archive:
        files = [n for n in archive.namelist() if "/blade_branches/" in n and n.endswith(".py")]
        assert len(files) == 1, files
        assert archive.read(files[0]).decode().count("def branch_") == 2
    x = torch.randn(4, 8)
    for flag in (True, False):
        for deep in (True, False):
            want = reference(x, flag, deep)
            torch.testing.assert_close(module(x, flag, deep), want)
            torch.testing.assert_close(loaded(x, flag, deep), want)


def test_small_branches_stay():
    module = scripted_branchy()
    assert _C.outline_branches(module.graph, 100) == 0
    FileCheck().check_not("prim::CallFunction").run(str(module.graph))


def test_branches_with_engine_calls_stay():
    """The report and the debug tools find the engines' calls in the forward graph."""
    import blade

    class Gated(torch.nn.Module):
        def forward(self, x):
            if bool(x.sum() > -1e9):
                y = torch.tanh(x) * 2.0 + 1.0
                y = torch.sigmoid(y) * x
            else:
                y = x
            return y

    x = torch.randn(4, 8)
    optimized = blade.optimize(Gated().eval(), (x,), blade.Config(cache_dir="off"))
    FileCheck().check("blade::execute").run(str(optimized.graph))
    torch.testing.assert_close(optimized(x), Gated()(x))
