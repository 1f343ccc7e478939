"""The .mlir tests of mlir/: each file's RUN line (`blade-opt ... %s | FileCheck %s`) run in
this process and its CHECK lines applied to what blade-opt printed (tests/ir_runner.py);
every Blade pass of the pipeline has one; and blade-opt, run as a command, prints what
the checks expect."""
import subprocess
import sys

import pytest

from blade.codegen import pipeline
from blade.tools import opt
from ir_runner import MLIR, check_file, run_line

FILES = sorted(MLIR.rglob("*.mlir"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(MLIR)))
def test_mlir_file(path):
    check_file(path)


def test_every_blade_pass_has_a_mlir_file():
    every_option = opt.options(user_calls=("a call",))
    blade_passes = {p.name for p in pipeline.build(every_option) if not p.upstream}
    named = set()
    for path in FILES:
        args = opt.parser().parse_args(run_line(path)[0])
        named.update(name for name in (args.only, args.first, args.last) if name)
    assert not blade_passes - named, sorted(blade_passes - named)


def test_blade_opt_runs_a_file_as_its_run_line_says():
    path = MLIR / "llvm" / "mark-noalias-pointers.mlir"
    run = subprocess.run([sys.executable, "-m", "blade.tools.opt", *run_line(path)[0]],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and not run.stderr, run.stderr
    check_file(path, printed=run.stdout)
