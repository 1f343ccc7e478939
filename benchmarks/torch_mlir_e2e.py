"""Torch-MLIR's end-to-end suite through `blade.optimize`, as a user would run it: how many
of its ~1,800 single-purpose modules give eager's results, and how many Blade compiles
whole. The suite is not vendored: give a checkout of torch-mlir (or a bare git directory,
read with `git archive`).

    python benchmarks/torch_mlir_e2e.py --torch-mlir ~/src/torch-mlir [--filter Softmax]
        [--workers 2] [--timeout 120] [--json results.json]

Each module runs in a worker process (a crash or a hang loses that module only, which is
counted as such and the worker replaced). For each module the worker
  1. builds it (seeded) and records the suite's calls on eager PyTorch: the golden outputs;
  2. scripts it and replays the calls: a module TorchScript cannot script or gets wrong is
     `torchscript_fails`, out of Blade's reach;
  3. optimizes it with the first call's inputs and replays every call on the result,
     comparing with eager as the suite does (rtol 1e-3, atol 1e-7, NaNs equal; two ulps
     of each value and of the largest for float16 and bfloat16), each call from the same
     random state;
  4. reads `blade.report`: the module has tensor ops if the example run ran any (views of
     its inputs that it returns as they are are metadata, counted apart), and is compiled
     whole when every one of them ran in an engine and no cluster failed.
Outcomes: `pass` (whole or partly compiled), `mismatch` (a wrong answer: a bug),
`blade_error` (optimize or the optimized call raised), `crash`, `timeout`,
`torchscript_fails`, `not_forward` (the suite calls another method).

The summary prints the share of passing modules with tensor ops compiled whole (the bar of
issue #28), how many of the rest miss only views they return as aliases of their inputs
(which stay TorchScript by design), the ops that keep modules from compiling whole (by
modules held back, and modules whose only missing op it is), and the compile errors by
reason.
"""
import argparse
import collections
import contextlib
import io
import json
import os
import re
import select
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from pathlib import Path

from child import TORCHSCRIPT_DEPRECATION

SUITE_PACKAGE = "torch_mlir_e2e_test"
SUITE_PATH = Path("projects/pt1/python")
RTOL, ATOL = 1e-3, 1e-7
# Half types: two units in the last place, of each value and of the output's largest
# (the suite's 1e-3 is below one float16 ulp of values over 1, and a value near zero that
# comes out of a difference of large ones is only as exact as they are: a normalization in
# float16 rounded once more or less differs by that much; Blade's engine check scales its
# tolerance by the largest value too).
HALF_RTOL = {"float16": 2.0 ** -9 * 2, "bfloat16": 2.0 ** -7}
# Files of the suite that need packages outside Blade's set-up or torch-mlir's own build.
SKIPPED_FILES = {"custom_op_example"}


# --- the suite -------------------------------------------------------------------------


def suite_root(source: str) -> Path:
    """The directory holding `torch_mlir_e2e_test`: in a checkout, or unpacked from a bare
    git directory into a temporary directory."""
    path = Path(source).expanduser()
    if (path / SUITE_PATH / SUITE_PACKAGE).is_dir():
        return path / SUITE_PATH
    if (path / "objects").is_dir() and (path / "HEAD").is_file():  # a bare repository
        out = Path(tempfile.mkdtemp(prefix="blade-e2e-"))
        archive = subprocess.run(["git", f"--git-dir={path}", "archive", "HEAD",
                                  str(SUITE_PATH / SUITE_PACKAGE)],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(out, filter="data")
        return out / SUITE_PATH
    raise SystemExit(f"{source}: not a torch-mlir checkout (no {SUITE_PATH / SUITE_PACKAGE})")


def load_suite(root: Path):
    """Imports the suite's test files and returns its registry of tests. The package's
    own __init__ files are skipped (they import torch-mlir's build-time version module
    and its parallel runner's `multiprocess`, neither of which this runner uses)."""
    sys.modules.setdefault("multiprocess", _unused_module("multiprocess", "set_start_method"))
    for name in (SUITE_PACKAGE, f"{SUITE_PACKAGE}.test_suite"):
        package = types.ModuleType(name)
        package.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = package
    import importlib

    registry = importlib.import_module(f"{SUITE_PACKAGE}.registry")
    skipped = {}
    for path in sorted((root / SUITE_PACKAGE / "test_suite").glob("*.py")):
        if path.stem == "__init__" or path.stem in SKIPPED_FILES:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                importlib.import_module(f"{SUITE_PACKAGE}.test_suite.{path.stem}")
        except Exception as e:  # e.g. torchvision absent: the tests before the import stay
            skipped[path.stem] = f"{type(e).__name__}: {e}"
    return registry.GLOBAL_TEST_REGISTRY, skipped


def _unused_module(name: str, *attributes: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def unused(*args, **kwargs):
        raise RuntimeError(f"{name} is not used by Blade's runner")

    for attribute in attributes:
        setattr(module, attribute, unused)
    return module


# --- one module, in a worker -----------------------------------------------------------


class _Recorder:
    """Stands for the module in the suite's invoker: records each method call's inputs
    (cloned) and eager's outputs."""

    def __init__(self, module):
        self._module = module
        self.calls = []

    def __getattr__(self, name):
        method = getattr(self._module, name)

        def call(*args):
            import torch

            inputs = _clone(args)
            torch.manual_seed(_seed(len(self.calls)))
            with torch.no_grad():
                outputs = method(*args)
            self.calls.append((name, inputs, _clone(outputs)))
            return outputs

        return call


def _clone(value):
    """`value` with a copy of every tensor in it (Blade's own `private_copy`)."""
    from blade.isolation import private_copy

    return private_copy(value)


def _seed(call_index: int) -> int:
    """Each call runs from the same random state in eager, TorchScript and Blade, so that
    modules of random ops (rand, bernoulli, dropout) can be compared too."""
    return 1000 + call_index


def _replay(function, calls) -> bool:
    """Whether `function` gives eager's outputs on every recorded call."""
    import torch

    for i, (_, inputs, expected) in enumerate(calls):
        torch.manual_seed(_seed(i))
        with torch.no_grad():
            if not _same(function(*_clone(inputs)), expected):
                return False
    return True


def _same(got, expected) -> bool:
    import torch

    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return False
        if got.dtype != expected.dtype:
            return False
        if expected.dtype == torch.bool or not expected.is_floating_point():
            return bool(torch.equal(got, expected))
        name = str(expected.dtype).replace("torch.", "")
        if name not in HALF_RTOL:
            return bool(torch.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True))
        finite = expected[expected.isfinite()]
        largest = float(finite.abs().max()) if finite.numel() else 0.0
        return bool(torch.allclose(got.float(), expected.float(), rtol=HALF_RTOL[name],
                                   atol=HALF_RTOL[name] * largest, equal_nan=True))
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(_same(g, e) for g, e in zip(got, expected)))
    if isinstance(expected, float):
        return isinstance(got, float) and (got == expected or abs(got - expected)
                                           <= ATOL + RTOL * abs(expected)
                                           or (got != got and expected != expected))
    return got == expected


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def run_one(test, cache_dir: str) -> dict:
    import torch
    import blade
    from torch_mlir_e2e_test.framework import TestUtils

    torch.manual_seed(0)
    module = test.program_factory()
    recorder = _Recorder(module)
    torch.manual_seed(0)
    test.program_invoker(recorder, TestUtils())
    if any(name != "forward" for name, _, _ in recorder.calls) or not recorder.calls:
        return {"outcome": "not_forward"}
    try:
        if not _replay(torch.jit.script(module), recorder.calls):
            return {"outcome": "torchscript_fails", "reason": "differs from eager"}
    except Exception as e:
        return {"outcome": "torchscript_fails", "reason": _first_line(e)}
    start = time.perf_counter()
    try:
        optimized = blade.optimize(module, _clone(recorder.calls[0][1]),
                                   blade.Config(cache_dir=cache_dir))
    except Exception as e:
        return {"outcome": "blade_error", "reason": "optimize: " + _first_line(e)}
    seconds = time.perf_counter() - start
    report = blade.report(optimized)
    result = {"seconds": round(seconds, 3), "total_ops": report.total_ops,
              "compiled_ops": report.compiled_ops, "input_views": report.input_views,
              "unsupported": {k: v.reasons[:1] for k, v in report.unsupported.items()},
              "unreached": sorted(report.unreached), "compile_errors": report.compile_errors[:3]}
    try:
        if not _replay(optimized, recorder.calls):
            return {**result, "outcome": "mismatch"}
    except Exception as e:
        return {**result, "outcome": "blade_error", "reason": "call: " + _first_line(e)}
    result["whole"] = (report.total_ops > 0 and report.compiled_ops == report.total_ops
                       and not report.compile_errors and not report.unreached)
    return {**result, "outcome": "pass"}


def worker(source: str, cache_dir: str) -> None:
    """Reads test names on stdin, answers one JSON line each on the real stdout (the
    tests' own printing goes to stderr)."""
    import warnings

    warnings.filterwarnings("ignore", message=TORCHSCRIPT_DEPRECATION)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    tests, _ = load_suite(Path(source))
    by_name = {t.unique_name: t for t in tests}
    for line in sys.stdin:
        name = line.strip()
        try:
            result = run_one(by_name[name], cache_dir)
        except Exception as e:  # the suite's own code failed: building or invoking eager
            result = {"outcome": "suite_error", "reason": _first_line(e)}
        answers.write(json.dumps({"name": name, **result}) + "\n")


# --- the parent: workers, crashes, timeouts, the summary -------------------------------


class Worker:
    def __init__(self, root: Path, cache_dir: str):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(root), "--cache-dir", cache_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.test = None
        self.started = 0.0

    def give(self, name: str) -> None:
        self.test, self.started = name, time.monotonic()
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.wait()


def run_all(root: Path, names, workers: int, timeout: float, cache_dir: str, log) -> dict:
    pending = collections.deque(names)
    results = {}
    pool = [Worker(root, cache_dir) for _ in range(min(workers, len(pending)))]
    for w in pool:
        w.give(pending.popleft())
    busy = {w.process.stdout.fileno(): w for w in pool}
    while busy:
        ready, _, _ = select.select(list(busy), [], [], 1.0)
        finished = []
        for fd in ready:
            w = busy[fd]
            line = w.process.stdout.readline()
            if line:
                result = json.loads(line)
            else:  # the worker died inside this test
                code = w.process.wait()
                result = {"name": w.test, "outcome": "crash", "reason": f"exit status {code}"}
            finished.append((w, result, bool(line)))
        for w in list(busy.values()):
            if w.test is not None and time.monotonic() - w.started > timeout and all(
                    w is not f[0] for f in finished):
                finished.append((w, {"name": w.test, "outcome": "timeout"}, False))
        for w, result, alive in finished:
            result["name"] = w.test
            results[w.test] = result
            log(len(results), len(names), result)
            del busy[w.process.stdout.fileno()]
            if not alive:
                w.stop()
                if not pending:
                    continue
                w = Worker(root, cache_dir)
            if pending:
                w.give(pending.popleft())
                busy[w.process.stdout.fileno()] = w
            else:
                w.stop()
    return results


ALIAS_REASON = "may be a view of its input or of another result"
# A cluster of views alone (a module returning `x.view(...)` of its input) leaves an engine
# nothing to compute: the views run as TorchScript, aliasing the input as in eager.
NO_COMPUTE_REASON = "no compute op"


def summarize(results: dict, skipped: dict) -> str:
    outcomes = collections.Counter(r["outcome"] for r in results.values())
    passing = [r for r in results.values() if r["outcome"] == "pass"]
    with_ops = [r for r in passing if r.get("total_ops", 0) > 0]
    whole = [r for r in with_ops if r.get("whole")]
    lines = [f"modules run: {len(results)}"]
    for outcome, count in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {outcome:<18} {count}")
    share = 100.0 * len(whole) / max(1, len(with_ops))
    lines.append(f"passing modules with tensor ops: {len(with_ops)}; compiled whole: "
                 f"{len(whole)} ({share:.1f}%)")
    # Views of inputs returned as they are are metadata, not tensor ops for an engine
    # (Report.input_views): a module of nothing else has nothing to compile. Shown with
    # the share they would make if they counted as modules not compiled whole.
    only_views = [r for r in passing if r.get("total_ops", 0) == 0 and r.get("input_views")]
    lines.append(f"  passing modules that only return views of their inputs (nothing to "
                 f"compute, not counted above): {len(only_views)}; counted as not whole, "
                 f"the share would be "
                 f"{100.0 * len(whole) / max(1, len(with_ops) + len(only_views)):.1f}%")
    # Views that a module returns as aliases of its inputs, with nothing computed around
    # them, stay TorchScript by design (an engine would compute nothing, and the alias is
    # what eager returns); counted apart. Views of computed results are made after the
    # engine call and count as compiled.
    aliases = [r for r in with_ops if not r.get("whole") and r.get("unsupported") and
               not r.get("compile_errors") and not r.get("unreached") and
               all(ALIAS_REASON in reason or NO_COMPUTE_REASON in reason
                   for reasons in r["unsupported"].values() for reason in reasons)]
    lines.append("  not whole only for views of inputs with nothing to compute, or views "
                 f"that cannot be made after the engine: {len(aliases)}")
    lines.append("  views reported as possible aliases (none expected but layout readers "
                 "and ops without schema): " + (", ".join(sorted(
                     {op for r in with_ops for op, reasons in r.get("unsupported", {}).items()
                      if any(ALIAS_REASON in reason for reason in reasons)})) or "none"))
    held_back = collections.Counter()
    only_missing = collections.Counter()
    for r in with_ops:
        if r.get("whole"):
            continue
        missing = set(r.get("unsupported", {})) | set(r.get("unreached", []))
        held_back.update(missing)
        if len(missing) == 1:
            only_missing.update(missing)
    lines.append("ops keeping passing modules from compiling whole (modules held back / "
                 "modules where it is the only one):")
    for op, count in held_back.most_common(40):
        lines.append(f"  {op:<40} {count:>4} {only_missing[op]:>4}")
    errors = collections.Counter()
    for r in results.values():
        for e in r.get("compile_errors", []):
            errors[re.sub(r"\d+", "N", e)[:140]] += 1
    if errors:
        lines.append("compile errors (fallbacks), by reason:")
        lines.extend(f"  {count:>4}  {reason}" for reason, count in errors.most_common(25))
    for outcome in ("mismatch", "crash", "timeout", "blade_error"):
        names = sorted(n for n, r in results.items() if r["outcome"] == outcome)
        if names:
            lines.append(f"{outcome}: " + ", ".join(names[:60]))
    if skipped:
        lines.append("suite files not imported: " + "; ".join(
            f"{k} ({v})" for k, v in skipped.items()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-mlir", help="a torch-mlir checkout or bare git directory")
    parser.add_argument("--filter", default="", help="regex over test names")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds per module (the suite's own default)")
    parser.add_argument("--json", help="write every module's result here")
    parser.add_argument("--cache-dir", default=None,
                        help="Blade's compile cache for the run (default: a fresh one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.cache_dir)
        return
    if not args.torch_mlir:
        parser.error("--torch-mlir is required")
    root = suite_root(args.torch_mlir)
    tests, skipped = load_suite(root)
    names = [t.unique_name for t in tests if re.search(args.filter, t.unique_name)]
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="blade-e2e-cache-")
    start = time.monotonic()

    def log(done, total, result):
        print(f"[{done}/{total} {time.monotonic() - start:6.0f}s] {result['name']}: "
              f"{result['outcome']}{' (whole)' if result.get('whole') else ''}",
              file=sys.stderr, flush=True)

    results = run_all(root, names, args.workers, args.timeout, cache_dir, log)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))
    print(summarize(results, skipped))


if __name__ == "__main__":
    main()
