"""Shared checks: a compiled model must match eager AND have really run compiled code."""
import importlib
import math
import sys
import zipfile
from pathlib import Path

import torch

import blade

# Tests that cut clusters apart with an op nothing lowers (an unsorted topk) keep it in
# TorchScript: by default it would be a kernel call inside the engine
# (blade/partition/kernel_calls.py).
NO_KERNEL_CALLS = dict(kernel_calls=False)


def run_compiled(model, inputs, config=None, rtol=1e-5, atol=1e-5, min_compiled_ops=1,
                 allow_compile_errors=False):
    """Optimizes `model`, checks its outputs against eager, that at least one engine ran
    its compiled code with no run-time fallback, and that no cluster failed to compile (an
    exception in a pass would otherwise be a silent fallback) unless the test expects one
    (`allow_compile_errors`). Returns (optimized, report)."""
    model = model.eval() if isinstance(model, torch.nn.Module) else model
    optimized = blade.optimize(model, inputs, config)
    with torch.no_grad():
        expected = model(*inputs)
        actual = optimized(*inputs)
    assert_same(actual, expected, rtol, atol)
    report = blade.report(optimized)
    assert report.compiled_ops >= min_compiled_ops, str(report)
    assert allow_compile_errors or not report.compile_errors, str(report)
    assert report.clusters and all(c.calls > 0 for c in report.clusters), str(report)
    assert report.runtime_fallbacks == 0, str(report)
    assert_every_op_accounted_for(report)
    return optimized, report


def assert_every_op_accounted_for(report):
    """No engine without a compute op, and every op that ran outside an engine is listed as
    not compiled with a reason of its own (not the report's catch-all for a reason that no
    stage recorded)."""
    assert all(sum(c.ops.values()) > 0 for c in report.clusters), str(report)
    assert sum(e.count for e in report.unsupported.values()) == \
        report.total_ops - report.compiled_ops, str(report)
    assert not any("recorded no reason" in reason for entry in report.unsupported.values()
                   for reason in entry.reasons), str(report)


def assert_ran_compiled(optimized):
    """Every engine compiled, ran its code on every call (a silent fallback fails this),
    and the input guard let every call in. Returns the report."""
    report = blade.report(optimized)
    assert not report.compile_errors, str(report)
    assert report.clusters and all(c.compiled and c.calls > 0 for c in report.clusters), \
        str(report)
    assert report.runtime_fallbacks == 0, str(report)
    assert_every_op_accounted_for(report)
    return report


def assert_same_values(actual, expected, rtol=1e-5, atol=1e-5):
    """Same shape and dtype, NaN and +-inf at the same positions, the finite values close."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        (actual.shape, expected.shape)
    assert torch.equal(torch.isnan(actual), torch.isnan(expected)), \
        (torch.isnan(actual).sum(), torch.isnan(expected).sum())
    assert torch.equal(torch.isposinf(actual), torch.isposinf(expected))
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(actual[finite], expected[finite], rtol=rtol, atol=atol)


def compiled_whole(fn, inputs, rtol=1e-5, atol=1e-5):
    """Optimizes `fn` (traced, as a Lambda) on `inputs`, checks every output against eager
    with assert_same_values (NaN and infinities in place) and that every op the inputs ran
    was compiled and ran in an engine. Returns (optimized, report)."""
    model = Lambda(fn)
    optimized = blade.optimize(model, inputs, blade.Config(allow_tracing=True))
    got, want = optimized(*inputs), model(*inputs)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert_same_values(g, w, rtol, atol)
    report = assert_ran_compiled(optimized)
    assert report.compiled_ops == report.total_ops and not report.unsupported, str(report)
    return optimized, report


def assert_same(actual, expected, rtol=1e-5, atol=1e-5):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
        return
    assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_same(a, e, rtol, atol)


# Tolerances per dtype: low-precision floats are compared at their own precision.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5), torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2),
    torch.int64: (0, 0), torch.int32: (0, 0), torch.bool: (0, 0),
}


def random_tensor(shape, dtype, low=-3, high=3):
    """Random values of `dtype`: normal floats, integers in [low, high), random bools."""
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    if dtype in (torch.int64, torch.int32):
        return torch.randint(low, high, shape, dtype=dtype)
    return torch.randn(*shape).to(dtype)


class Lambda(torch.nn.Module):
    """A module calling `fn` on its inputs; traced (lambdas cannot be scripted)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


class TanhChain(torch.nn.Module):
    """A tiny model compiled into one engine; tests that tamper with saved files use it."""

    def forward(self, x):
        return torch.tanh(x) * 2.0 + 1.0


class GeluMlp(torch.nn.Module):
    """Two Linear layers with a GELU between: 32 -> 64 -> 16."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TwoClusters(torch.nn.Module):
    """A Linear/tanh cluster and a sigmoid cluster, cut apart by erfinv (no converter) when
    it stays TorchScript (Config(kernel_calls=False); else it is a kernel call between them)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.tanh(self.fc(x)) * 2
        return torch.erfinv(y * 0.4) * torch.sigmoid(y)


def save_tampered(tmp_path, config, change):
    """Optimizes TanhChain, saves it, and writes a copy whose archive members are passed
    through `change(filename, data) -> new data or None (unchanged)`. Returns the copy's
    path, the example input, and how many members were changed."""
    x = torch.randn(4, 8)
    path = tmp_path / "model.pt"
    torch.jit.save(blade.optimize(TanhChain(), (x,), config), str(path))
    tampered = tmp_path / "tampered.pt"
    changed = 0
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            new = change(item.filename, data)
            if new is not None and new != data:
                data = new
                changed += 1
            dst.writestr(item, data)
    return tampered, x, changed


def flip_code_bytes(filename, data):
    """For save_tampered: inverts 16 bytes in the middle of the engine's shared library."""
    if not data.startswith(b"\x7fELF"):
        return None
    middle = len(data) // 2
    return data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 16]) + \
        data[middle + 16:]


def bump_format_version(filename, data):
    """For save_tampered: the engine claims a format version this runtime does not know."""
    from blade import _C

    version = _C.ENGINE_FORMAT_VERSION
    if not filename.endswith("data.pkl"):
        return None
    # The engine's state is a tuple whose first item is the format version: "(" (MARK)
    # then "K" (BININT1) and the version byte, after the class.
    cls = data.find(b"classes.blade\nEngine\n")
    at = data.find(b"(K" + bytes([version]), cls)
    if cls < 0 or at < 0:
        return None
    return data[:at + 2] + bytes([version + 1]) + data[at + 3:]


def ir_before(dump_root, pass_name: str) -> str:
    """The module as the codegen pipeline's first pass named `pass_name` got it, from a dump
    directory (Config.dump_dir) of one cluster: `passes/NN_<pass>.mlir` of the pass before
    it (blade.codegen.pipeline). `dump_root` is the cluster's directory or the dump's."""
    from pathlib import Path

    root = Path(dump_root)
    passes = sorted(root.glob("passes/*.mlir")) or sorted(next(root.glob("*/passes")).glob("*.mlir"))
    names = [p.name.split("_", 1)[1][:-len(".mlir")] for p in passes]
    index = names.index(pass_name)
    return passes[index - 1].read_text()


def ir_after_last_pass(dump_root) -> str:
    """The LLVM-dialect module the codegen pipeline ended with (see ir_before)."""
    from pathlib import Path

    root = Path(dump_root)
    passes = sorted(root.glob("passes/*.mlir")) or sorted(next(root.glob("*/passes")).glob("*.mlir"))
    return passes[-1].read_text()


def count_calls(monkeypatch, owner, name: str) -> dict:
    """Wraps `owner.name` (for this test) to count its calls in the returned {"n": count}."""
    count = {"n": 0}
    real = getattr(owner, name)

    def counting(*args, **kwargs):
        count["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return count


def run_both(op):
    """`op()` by Blade's own int8 kernels, then by oneDNN's (blade._C.set_int8_conv_enabled),
    and how many calls of Blade's kernels each made: the results and [calls, calls]."""
    from blade import _C

    results, ran = [], []
    try:
        for enabled in (True, False):
            _C.set_int8_conv_enabled(enabled)
            before = _C.int8_conv_calls()
            results.append(op())
            ran.append(_C.int8_conv_calls() - before)
    finally:
        _C.set_int8_conv_enabled(True)
    return results, ran


def int8_linear_reference(real, weight, scale, bias, post_op):
    """A quantized linear layer in float64: the dequantized input `real` by the int8
    `weight` times its per-channel `scale`, plus `bias`, then `post_op` ("none", "relu",
    "gelu" or "gelu_tanh")."""
    want = real @ (weight.double() * scale.double().unsqueeze(1)).t() + bias.double()
    if post_op == "relu":
        return torch.relu(want)
    if post_op == "gelu":
        return want * 0.5 * (1 + torch.erf(want / math.sqrt(2)))
    if post_op == "gelu_tanh":
        inner = math.sqrt(2 / math.pi) * (want + 0.044715 * want ** 3)
        return want * 0.5 * (1 + torch.tanh(inner))
    return want


def assert_int8_linear_result(mine, onednn, want, output_range):
    """A quantized linear layer's result by Blade's kernel (`mine`) against the float64
    reference `want` and oneDNN's: a uint8 one (as int8 bytes, with `output_range`, or None
    for float32) within half a step of the clamped reference and a step of oneDNN's, a
    float32 one within float32 rounding of both."""
    if output_range is None:
        torch.testing.assert_close(mine.double(), want, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mine, onednn, rtol=1e-5, atol=1e-4)
        return
    step, zero_point = output_range[0].item(), output_range[1].item()
    got = (mine.view(torch.uint8).double() - zero_point) * step
    clamped = want.clamp(min=-zero_point * step, max=(255 - zero_point) * step)
    assert (got - clamped).abs().max() <= 0.5 * step + 1e-4
    assert (mine.view(torch.uint8).int() - onednn.view(torch.uint8).int()).abs().max() <= 1


def bench_module(name):
    """A module of benchmarks/ (`workloads`, `run`, ...), imported as its scripts import
    each other (their folder first on sys.path while it loads)."""
    folder = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)
