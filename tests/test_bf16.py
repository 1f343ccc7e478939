"""Config(precision="bf16"): the GEMMs and convolutions by an engine's weights run in
bfloat16 with float32 accumulation on CPUs with avx512_bf16 (each in whichever of bfloat16
and float32 its precision trial finds faster); everything else stays float32, the mode is
signed into the engine, and a CPU without avx512_bf16 refuses it."""
import zipfile

import pytest
import torch

import blade
from blade import _C
from blade.codegen.llvm.native import host_cpu_features
from helpers import assert_ran_compiled

HAS_BF16 = "avx512_bf16" in host_cpu_features().split(",")
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU lacks avx512_bf16")


class ConvHead(torch.nn.Module):
    """A 3x3 and a 1x1 convolution with a residual, a depthwise one (stays float32), then two
    linear layers: every kind of GEMM and convolution the bf16 mode changes or keeps."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.pointwise = torch.nn.Conv2d(32, 32, 1)
        self.depthwise = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.fc1 = torch.nn.Linear(32 * 8 * 8, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = self.depthwise(y + self.pointwise(y))
        return self.fc2(torch.nn.functional.gelu(self.fc1(y.flatten(1))))


def example():
    torch.manual_seed(0)
    return ConvHead().eval(), torch.randn(2, 16, 8, 8)


def test_precision_must_be_known():
    with pytest.raises(ValueError, match="Config.precision must be one of"):
        blade.Config(precision="fp16")


@pytest.mark.skipif(HAS_BF16, reason="this CPU has avx512_bf16")
def test_cpu_without_avx512_bf16_refuses_bf16_at_compile_time():
    model, x = example()
    with pytest.raises(ValueError, match="avx512_bf16"):
        blade.optimize(model, (x,), blade.Config(precision="bf16"))


@needs_bf16
def test_bf16_engine_multiplies_in_bfloat16_and_stays_close_to_eager(request):
    # Without trials every weight runs bfloat16 (with them, a layer may keep float32).
    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))
    model, x = example()
    full = blade.optimize(model, (x,))
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
        got_full, got_half = full(x), half(x)
    assert got_half.dtype == torch.float32 and got_half.shape == want.shape
    report = assert_ran_compiled(half)
    assert not report.compile_errors, str(report)
    assert [c.precision for c in report.clusters] == ["bf16"], str(report)
    assert "precision: bf16" in str(report)
    assert [c.precision for c in blade.report(full).clusters] == ["float32"]
    # Every weight the engine multiplies or convolves by in bfloat16 has a prepared copy:
    # conv, pointwise, fc1 and fc2 (the depthwise one runs as float32).
    assert report.clusters[0].packed_weights >= 4, str(report)
    scale = float(want.abs().max())
    error_half = float((got_half.double() - want).abs().max())
    error_full = float((got_full.double() - want).abs().max())
    # bfloat16 keeps 8 significant bits: the result moves by about 2^-8 of its scale, far
    # more than float32's rounding (so bfloat16 really ran) and far less than a wrong
    # kernel would.
    assert error_half < 2e-2 * scale, (error_half, scale)
    assert error_half > 20 * error_full, (error_half, error_full)


@needs_bf16
def test_bf16_engine_saves_loads_and_its_precision_is_signed(tmp_path):
    model, x = example()
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    with torch.no_grad():
        expected = half(x)
    path = tmp_path / "bf16.pt"
    torch.jit.save(half, str(path))
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    report = assert_ran_compiled(loaded)
    assert [c.precision for c in report.clusters] == ["bf16"], str(report)

    # The precision is signed with the code: an engine whose fields claim another precision
    # than was signed is refused, and one claiming an unknown precision too.
    engine = getattr(half, report.clusters[0].name)
    state = engine.__getstate__()[0]
    meta = dict(line.split("=", 1) for line in state[7].splitlines())
    assert meta["precision"] == "bf16"
    fields = (state[1], state[8], state[5], state[6], state[3], state[4], state[2],
              meta["cpu_features"], meta["signature"])
    assert torch.classes.blade.Engine(*fields, "bf16").is_compiled()
    relabelled = torch.classes.blade.Engine(*fields, "float32")
    assert not relabelled.is_compiled() and "signature" in relabelled.load_error()
    unknown = torch.classes.blade.Engine(*fields, "fp8")
    assert not unknown.is_compiled()
    assert "precision 'fp8' is not 'float32', 'bf16' or 'int8'" in unknown.load_error()
    with torch.no_grad():  # the refused engines still give the subgraph's results
        torch.testing.assert_close(relabelled.execute([x]), [model(x)], rtol=1e-5,
                                   atol=1e-5)


@needs_bf16
def test_tampered_precision_line_in_a_saved_file_is_refused(tmp_path):
    model, x = example()
    path = tmp_path / "bf16.pt"
    torch.jit.save(blade.optimize(model, (x,), blade.Config(precision="bf16")), str(path))
    tampered = tmp_path / "tampered.pt"
    changed = 0
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("data.pkl") and b"precision=bf16" in data:
                data = data.replace(b"precision=bf16", b"precision=bf32")  # same length
                changed += 1
            dst.writestr(item, data)
    assert changed == 1
    loaded = torch.jit.load(str(tampered))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-5)
    report = blade.report(loaded)
    assert "bf32" in report.clusters[0].status, str(report)
    assert report.runtime_fallbacks > 0, str(report)



def decided_bf16_engine(model, x):
    """A bf16 engine of `model` called until its trials have decided: its last result,
    float64 eager's and its report."""
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
        # A convolution's float32 path has its own trial, called when the precision
        # trial runs that path: it may decide only after the precision trial has.
        for _ in range(2 * _C.kernel_trial_calls()):
            got = half(x)
    return got, want, assert_ran_compiled(half)


@needs_bf16
def test_bf16_convolutions_and_linear_layers_keep_the_faster_precision_per_layer():
    """Each convolution of one group and each linear layer has a precision trial, bfloat16
    (Blade's kernel, or oneDNN's where that does not run) against the float32 path, decided
    by the engine's first calls (the depthwise one has none: it stays float32); whichever
    wins, the result stays within bfloat16's error of eager."""
    model, x = example()
    got, want, report = decided_bf16_engine(model, x)
    choices = [line for c in report.clusters for line in c.kernel_choices]
    precision = [line for line in choices if "bfloat16" in line]
    kernel = "Blade bfloat16" if _C.bf16_conv_available() else "oneDNN bfloat16"
    assert sorted(line.split(", input")[0] for line in precision) == \
        ["weight [10, 64]", "weight [32, 16, 3, 3]", "weight [32, 32, 1, 1]",
         "weight [64, 2048]"], choices
    # A linear layer's input is its rows as oneDNN's 1x1 convolution takes them.
    assert all(line.startswith(("weight [32, 16, 3, 3], input [2, 16, 8, 8]: float32 ",
                                "weight [32, 32, 1, 1], input [2, 32, 8, 8]: float32 ",
                                "weight [64, 2048], input [1, 2048, 1, 2]: float32 ",
                                "weight [10, 64], input [1, 64, 1, 2]: float32 ")) and
               line.endswith(("-> float32", f"-> {kernel}")) and
               f", {kernel} " in line for line in precision), choices
    assert not any("(transposed)" in line for line in precision)
    assert float((got.double() - want).abs().max()) < 2e-2 * float(want.abs().max())


@needs_bf16
def test_bf16_linear_layers_keep_one_copy_of_the_precision_that_won():
    """Once a linear layer's precision trial is decided, the loser's copies are freed:
    bfloat16's pack, or the float32 path's (its oneDNN copy and Blade's float32 pack)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256)).eval()
    got, want, report = decided_bf16_engine(model, torch.randn(64, 256))
    choices = report.clusters[0].kernel_choices
    decided = [line for line in choices if ": float32 " in line]
    assert len(decided) == 2 and all("undecided" not in line for line in decided), choices
    assert report.clusters[0].packed_weights == 2, (str(report), choices)
    assert float((got.double() - want).abs().max()) < 2e-2 * float(want.abs().max())


@needs_bf16
def test_without_kernel_trials_bf16_convolutions_run_in_bfloat16(request):
    _C.set_kernel_trials(False)
    request.addfinalizer(lambda: _C.set_kernel_trials(True))
    torch.manual_seed(0)
    model, x = torch.nn.Conv2d(16, 32, 3, padding=1).eval(), torch.randn(2, 16, 8, 8)
    full = blade.optimize(model, (x,))
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
        error_full = float((full(x).double() - want).abs().max())
        error_half = float((half(x).double() - want).abs().max())
    assert_ran_compiled(half)
    assert 20 * error_full < error_half < 2e-2 * float(want.abs().max()), \
        (error_half, error_full)


@needs_bf16
def test_dynamic_bf16_engine_serves_other_batch_sizes():
    """A dynamic engine multiplies by each weight's reordered bfloat16 copy for a few row
    counts and by its plain bfloat16 copy past them: every batch size stays close."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 32)).eval()
    half = blade.optimize(model, (torch.randn(4, 64),),
                          blade.Config(precision="bf16", dynamic=True))
    with torch.no_grad():
        for rows in (1, 3, 4, 7, 16, 33, 64):
            x = torch.randn(rows, 64)
            want = model.double()(x.double())
            model.float()
            got = half(x)
            assert got.shape == (rows, 32)
            assert float((got.double() - want).abs().max()) < 2e-2 * float(want.abs().max())
    report = assert_ran_compiled(half)
    assert [c.precision for c in report.clusters] == ["bf16"], str(report)
    assert report.clusters[0].calls == 7


def test_a_bfloat16_model_convolves_and_multiplies_by_reordered_weight_copies():
    """A model cast to bfloat16 by its user (no precision mode): where oneDNN takes
    bfloat16 on this CPU, its convolutions and linear layers run oneDNN's kernels by
    reordered weight copies into the engine's buffers, as float32 ones do."""
    model, x = example()
    model = model.bfloat16()
    x = x.bfloat16()
    optimized = blade.optimize(model, (x,))
    with torch.no_grad():
        got, want = optimized(x), model(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    report = assert_ran_compiled(optimized)
    assert [c.precision for c in report.clusters] == ["float32"], str(report)
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo")
                  if line.startswith("flags")), [])
    takes_bf16 = {"avx512bw", "avx512vl", "avx512dq"} <= set(flags) or \
        "avx_ne_convert" in flags
    assert (report.clusters[0].packed_weights >= 4) == takes_bf16, str(report)


@needs_bf16
def test_bf16_relu_after_a_convolution_keeps_nan_as_eager():
    """The ReLU after a bfloat16 convolution (in the registers of Blade's kernel, or in the
    pass that widens oneDNN's bfloat16 result) keeps NaN (a max(x, 0) that turned it into 0
    would make every output finite below)."""
    model, x = example()
    half = blade.optimize(model, (x,), blade.Config(precision="bf16"))
    x = x.clone()
    x[0, 3, 4, 4] = float("nan")
    with torch.no_grad():
        got, want = half(x), model(x)
    assert want[0].isnan().all() and not want[1].isnan().any()
    assert torch.equal(got.isnan(), want.isnan())
    assert_ran_compiled(half)
