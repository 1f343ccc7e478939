"""blade.optimize end to end: mixed models, no supported op, scripting and tracing, no side
effects, inputs of any dtype."""
import copy
import random
import subprocess
import sys
import textwrap
import warnings
from typing import Dict, List, Tuple

import pytest
import torch

import blade
from helpers import Lambda, assert_ran_compiled, assert_same, run_compiled


class MixedModel(torch.nn.Module):
    """Elementwise chains around linear layers, and a topk that Blade does not compile (an
    unsorted one: Torch-MLIR lowers only sorted ones)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)
        self.scale = torch.nn.Parameter(torch.randn(64))

    def forward(self, x, mask):
        h = self.fc1(x)
        h = torch.nn.functional.gelu(h * self.scale + 1.0) * torch.sigmoid(h)
        h = h.masked_fill(mask, 0.0)
        values, _ = torch.topk(h, 4, dim=-1, sorted=False)
        out = self.fc2(h)
        out = torch.softmax(out - out.amax(dim=-1, keepdim=True), dim=-1)
        return out, values.sum(dim=-1)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 2, sorted=False).values.cummax(dim=0).values


def test_mixed_model_compiles_clusters_and_matches_eager():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    mask = torch.rand(8, 64) > 0.7
    model = MixedModel().eval()
    optimized, report = run_compiled(model, (x, mask), blade.Config(kernel_calls=False),
                                     min_compiled_ops=6)
    assert len(report.clusters) >= 2
    assert set(report.unsupported) == {"aten::topk"}
    assert sum(c.ops.get("aten::linear", 0) for c in report.clusters) == 2
    assert report.compiled_ops == report.total_ops - 1
    assert 0 < report.coverage < 1
    # The graph really calls engines in place of the compiled nodes.
    assert "blade::execute" in str(optimized.graph)
    # Other inputs of the same signature run compiled too.
    x2 = torch.randn(8, 32)
    with torch.no_grad():
        assert_same(optimized(x2, mask), model(x2, mask))


def test_model_without_supported_ops_comes_back_unchanged():
    x = torch.randn(6, 5)
    model = Unsupported().eval()
    optimized = blade.optimize(model, (x,))
    report = blade.report(optimized)
    assert report.compiled_ops == 0 and not report.clusters
    assert "blade::execute" not in str(optimized.graph)
    assert_same(optimized(x), model(x))


def test_tracing_path_compiles():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.ReLU())
    run_compiled(model, (torch.randn(4, 16),), blade.Config(allow_tracing=True))


def test_optimize_accepts_a_script_module_and_a_single_tensor():
    class Chain(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x) * 2 + torch.tanh(x)

    scripted = torch.jit.script(Chain())
    x = torch.randn(3, 7)
    optimized = blade.optimize(scripted, x)
    assert_same(optimized(x), Chain()(x))
    assert blade.report(optimized).clusters[0].calls == 1


class WithExtras(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = 3.0
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.factor

    @torch.jit.export
    def scale(self, x):
        return x * self.factor


def test_preserved_attributes_and_methods_survive_freezing():
    model = WithExtras().eval()
    x = torch.randn(2, 4)
    optimized = blade.optimize(model, (x,),
                               blade.Config(preserved_attributes=["factor", "scale"]))
    assert optimized.factor == 3.0
    torch.testing.assert_close(optimized.scale(x), model.scale(x))
    torch.testing.assert_close(optimized(x), model(x))
    # A preserved attribute stays an attribute (the user may set it): the op reading it
    # runs in TorchScript, and sees the new value.
    report = blade.report(optimized)
    assert report.compiled_ops == 2 and "not a compile-time constant" in \
        report.unsupported["aten::mul.Scalar"].reasons[0], str(report)
    optimized.factor = 5.0
    torch.testing.assert_close(optimized(x), torch.relu(model.fc(x)) * 5.0)
    plain = blade.optimize(model, (x,))
    assert not hasattr(plain, "scale")
    assert blade.report(plain).coverage == 1.0


# optimize has no side effects: the model runs on private copies of the example inputs,
# the random generators come back as they were, a ScriptModule keeps its training flags.

class WritesIntoInputs(torch.nn.Module):
    """Writes into a plain input, into one inside a tuple, one inside a list and one inside
    a dict; the arithmetic after the writes compiles."""

    def forward(self, x, pair: Tuple[torch.Tensor, torch.Tensor], items: List[torch.Tensor],
                named: Dict[str, torch.Tensor], index):
        x.add_(1)
        torch.ops.aten._index_put_impl_(pair[0], (index,), pair[1], True, False)
        items[0].mul_(3)
        named["y"].sub_(2)
        return torch.tanh(x) * 2 + pair[0].sum() + items[0] * named["y"]


def _example_for_writes():
    return (torch.randn(4, 3), (torch.zeros(4, 3), torch.ones(2, 3)), [torch.randn(4, 3)],
            {"y": torch.randn(4, 3)}, torch.tensor([0, 2]))


def test_optimize_leaves_the_example_inputs_unchanged():
    torch.manual_seed(0)
    inputs = _example_for_writes()
    before = copy.deepcopy(inputs)
    optimized = blade.optimize(torch.jit.script(WritesIntoInputs()), inputs)
    assert_same(inputs[0], before[0])
    assert_same(list(inputs[1]), list(before[1]))
    assert_same(inputs[2], before[2])
    assert_same(inputs[3]["y"], before[3]["y"])
    # The optimized model still computes (and writes) what the model does.
    eager_inputs, blade_inputs = copy.deepcopy(inputs), copy.deepcopy(inputs)
    with torch.no_grad():
        expected = WritesIntoInputs()(*eager_inputs)
        actual = optimized(*blade_inputs)
    assert_same(actual, expected)
    assert_same(blade_inputs[0], eager_inputs[0])
    report = blade.report(optimized)
    assert report.clusters and all(c.calls > 0 for c in report.clusters), str(report)
    assert report.runtime_fallbacks == 0 and not report.compile_errors, str(report)


def test_tracing_leaves_the_example_inputs_unchanged():
    x = torch.randn(4, 3)
    before = x.clone()
    model = Lambda(lambda x: torch.tanh(x.add_(1)) * 2)
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=True))
    assert_same(x, before)
    assert blade.report(optimized).clusters[0].compiled


class DrawsRandomNumbers(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(x + torch.rand_like(x)).view(4, 3)


def _draw_after(action) -> torch.Tensor:
    torch.manual_seed(0)
    random.seed(0)
    action()
    return torch.cat([torch.rand(3), torch.tensor([random.random()])])


def test_optimize_restores_the_random_generators():
    x = torch.randn(4, 3)
    untouched = _draw_after(lambda: None)
    assert_same(_draw_after(lambda: blade.optimize(DrawsRandomNumbers(), (x,))), untouched)
    # Tracing runs the Python forward, which may draw from Python's generator too.
    traced = Lambda(lambda x: x * random.random() + torch.rand(1))
    assert_same(_draw_after(lambda: blade.optimize(traced, (x,),
                                                   blade.Config(allow_tracing=True))),
                untouched)
    assert_same(_draw_after(lambda: blade.optimize(DrawsRandomNumbers(), (x,),
                                                   blade.Config(dynamic=True))), untouched)


def test_optimize_restores_the_random_generators_when_it_fails():
    x = torch.randn(4, 3)

    def fail():
        # The model runs (and draws) on inputs resized along dim 0, then refuses them.
        with pytest.raises(ValueError, match="dynamic_dims"):
            blade.optimize(DrawsRandomNumbers(), (x,), blade.Config(dynamic_dims={0: [0]}))

    assert_same(_draw_after(fail), _draw_after(lambda: None))


def test_optimize_keeps_a_script_modules_training_flags():
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    scripted.train()
    x = torch.randn(2, 4)
    optimized = blade.optimize(scripted, (x,))
    assert scripted.training and all(m.training for m in scripted.modules())
    with torch.no_grad():
        assert_same(optimized(x), scripted.eval()(x))


# Input dtypes Blade does not compile: what uses them stays TorchScript, with the reason.

class ComplexInput(torch.nn.Module):
    def forward(self, z, y):
        return torch.view_as_real(z * 2).sin() + torch.tanh(y).unsqueeze(-1)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_inputs_stay_torchscript_and_the_rest_compiles(dtype):
    torch.manual_seed(0)
    z, y = torch.randn(4, 3, dtype=dtype), torch.randn(4, 3, dtype=dtype.to_real())
    optimized, report = run_compiled(ComplexInput(), (z, y), min_compiled_ops=3)
    name = str(dtype).replace("torch.", "")
    assert f"has dtype {name}" in report.unsupported["aten::mul.Scalar"].reasons[0], \
        str(report)
    # The guard checks the complex input's shape and its dtype: other inputs run the
    # unspecialized model, with the model's results.
    other = torch.complex64 if dtype == torch.complex128 else torch.complex128
    for z2, y2 in [(torch.randn(4, 3, dtype=other), y), (torch.randn(5, 3, dtype=dtype), y[:1]),
                   (torch.randn(4, 3, 2).to(dtype.to_real()), y)]:
        with torch.no_grad():
            expected = ComplexInput()(z2, y2) if z2.is_complex() else None
            if expected is not None:
                assert_same(optimized(z2, y2), expected)
            else:
                with pytest.raises(RuntimeError, match="view_as_real"):
                    optimized(z2, y2)
    report = blade.report(optimized)
    assert report.guard_fallbacks == 3 and report.clusters[0].calls == 1, str(report)
    assert f"input 0 ({name})" in report.guard_notes[0]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.bool,
                                   torch.float16, torch.bfloat16, torch.uint16,
                                   torch.float8_e4m3fn, torch.complex32])
def test_inputs_of_any_dtype_compile_or_stay_torchscript_with_a_reason(dtype):
    class CastsItsInput(torch.nn.Module):
        def forward(self, a, y):
            return a.to(torch.float32) * y + 1, y.exp()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is experimental
        a, y = torch.ones(4, 3, dtype=dtype), torch.randn(4, 3)
        optimized, report = run_compiled(CastsItsInput(), (a, y), min_compiled_ops=2)
    if report.total_ops > report.compiled_ops:
        # A cast to another dtype is aten::_to_copy once types are known (fresh_casts).
        reason = report.unsupported["aten::_to_copy"].reasons[0]
        assert str(dtype).replace('torch.', '') in reason, str(report)


def test_optimize_works_under_warnings_as_errors():
    """TorchScript's deprecation notices are Blade's business, not the caller's: optimize
    (decompositions scripted on first use included) raises none under
    -W error::DeprecationWarning, in a fresh process."""
    script = textwrap.dedent("""
        import warnings
        import torch, blade
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            optimized = blade.optimize(model, (torch.randn(4, 16),),
                                       blade.Config(cache_dir="off"))
        assert blade.report(optimized).coverage == 1.0
        assert not caught, [str(w.message) for w in caught]
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", script],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_config_checks_excluded_op_names():
    with pytest.raises(ValueError, match="did you mean 'aten::linear'"):
        blade.Config(excluded_ops=["aten::Linear"])
    with pytest.raises(ValueError, match="did you mean 'aten::gelu'"):
        blade.Config(excluded_ops=["gelu"])  # the namespace left out
    with pytest.raises(ValueError, match="must be a list of op names"):
        blade.Config(excluded_ops="aten::linear")
    with pytest.raises(ValueError, match="not a registered op name"):
        blade.Config(excluded_ops=["mylib::nothing_by_that_name"])
    assert blade.Config(excluded_ops=("aten::add.Tensor", "aten::gelu")).excluded_ops == [
        "aten::add.Tensor", "aten::gelu"]


def test_scripting_parses_each_method_once_and_gives_the_same_module(monkeypatch):
    """optimize's scripting parses a method's source, and looks up its overloads, once for
    all the instances of its class (torch.jit.script does both again for each), and
    scripts what it scripts."""
    from blade.frontend.scripting import each_method_parsed_once

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
                                  for _ in range(4)])
    parsed = []
    real = torch.jit._recursive.get_jit_def
    counting = lambda fn, *args, **kwargs: parsed.append(fn) or real(fn, *args, **kwargs)  # noqa: E731
    monkeypatch.setattr(torch.jit._recursive, "get_jit_def", counting)
    plain = torch.jit.script(model)
    assert len(parsed) == 13  # the forward of every module instance
    parsed.clear()
    with each_method_parsed_once():
        once = torch.jit.script(model)
    assert len(parsed) == 3  # Sequential's, Linear's and ReLU's forward
    assert torch.jit._recursive.get_jit_def is counting
    # Overloads: looked up per callable attribute of each instance's class, or once.
    looked_up = []
    real_overloads = torch._jit_internal._get_overloaded_methods
    monkeypatch.setattr(torch._jit_internal, "_get_overloaded_methods",
                        lambda m, c: looked_up.append((m, c)) or real_overloads(m, c))
    torch.jit.script(model)
    every_instance = len(looked_up)
    looked_up.clear()
    with each_method_parsed_once():
        torch.jit.script(model)
    assert 0 < len(looked_up) < every_instance / 3, (len(looked_up), every_instance)
    assert str(once.inlined_graph) == str(plain.inlined_graph)
    x = torch.randn(2, 8)
    torch.testing.assert_close(once(x), model(x))


class StridedReadOfAView(torch.nn.Module):
    """`as_strided` reads its input's storage from the start (storage_offset=0), and
    `is_contiguous` reads strides: both see the slices as eager made them, never an
    engine's fresh copy."""

    def forward(self, x):
        view = torch.ops.aten._unsafe_view(torch.ops.aten.slice(x * 2, 0, 1, 3, 1), [4, 4])
        strided = torch.ops.aten.as_strided(view, size=(2, 2), stride=(8, 1), storage_offset=0)
        t = (x + 1).transpose(0, 2)
        flag = 1.0 if t.is_contiguous() else 2.0
        return strided + 1, t * flag


def test_views_whose_memory_layout_is_read_stay_torchscript():
    x = torch.arange(24, dtype=torch.float32).reshape(3, 2, 4)
    _, report = run_compiled(StridedReadOfAView(), (x,))
    kept = {kind for kind, entry in report.unsupported.items()
            if any("reads the memory layout" in reason for reason in entry.reasons)}
    assert kept == {"aten::slice.Tensor", "aten::_unsafe_view", "aten::transpose.int"}, \
        str(report)


class NoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.arange(6.0))

    def forward(self):
        return torch.softmax(self.steps.reshape(2, 3) * 0.5, dim=1)


def test_a_forward_without_inputs_is_optimized_with_no_example_inputs():
    model = NoInputs()
    for example in ((), None):
        optimized = blade.optimize(model, example, blade.Config(cache_dir="off"))
        assert_same(optimized(), model())


def test_missing_example_inputs_are_named_when_forward_needs_some():
    with pytest.raises(TypeError, match="example inputs are needed"):
        blade.optimize(torch.nn.Linear(2, 2))


class Casts(torch.nn.Module):
    def forward(self, x, y):
        widened = torch.ops.aten.to(x, dtype=torch.float64, layout=None, device=None,
                                    pin_memory=None)
        return x.to(torch.int64), y.to(torch.float32), widened * 2


def test_casts_to_another_dtype_compile_and_a_cast_to_the_same_dtype_keeps_aliasing():
    x, y = torch.randn(3, 4) * 10, torch.randn(3)
    optimized, report = run_compiled(Casts(), (x, y))
    # y.to(float32) is y itself: its use reads y (typed_rewrites.fresh_casts), no op left.
    assert "aten::to.dtype" not in report.unsupported, str(report)
    assert report.compiled_ops == report.total_ops, str(report)
    assert optimized(x, y)[1].data_ptr() == y.data_ptr()


def test_optimize_pauses_the_cyclic_garbage_collector_and_restores_it(monkeypatch):
    import gc

    import blade.frontend.pipeline

    seen = []
    real = blade.frontend.pipeline.run
    monkeypatch.setattr(blade.frontend.pipeline, "run",
                        lambda *args, **kwargs: seen.append(gc.isenabled()) or
                        real(*args, **kwargs))
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), \
        torch.randn(2, 8)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        blade.optimize(model, (x,), blade.Config(cache_dir="off"))
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
    with torch.no_grad():
        torch.testing.assert_close(optimized(x), model(x))
    assert_ran_compiled(optimized)


def test_an_unknown_config_option_names_the_closest_one():
    with pytest.raises(TypeError, match=r"no option 'dynamc' \(did you mean 'dynamic'\?\)"):
        blade.Config(dynamc=True)
    with pytest.raises(TypeError, match="no option 'colour'. The options are: allow_tracing"):
        blade.Config(colour="blue")
    assert blade.Config(dynamic=True).dynamic and blade.Config(True).allow_tracing


@pytest.mark.parametrize("rnn", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
def test_a_module_of_overloaded_forward_is_traced_with_a_warning(rnn):
    """nn.LSTM's and nn.GRU's forward is overloaded in TorchScript (forward__0 and
    forward__1, no forward): optimize traces it with the example inputs, says so, and
    answers as eager does (output and hidden state)."""
    torch.manual_seed(0)
    model = rnn(16, 24, num_layers=2, batch_first=True).eval()
    x = torch.randn(3, 7, 16)
    with pytest.warns(UserWarning, match="forward is overloaded in TorchScript"):
        optimized = blade.optimize(model, (x,))
    with torch.no_grad():
        got, want = optimized(x), model(x)
    torch.testing.assert_close(got, want)
