"""Each of Blade's own passes in the codegen pipeline has a unit test: a .mlir file of mlir/
whose RUN line runs it (blade-opt --pass NAME), or a test under tests/codegen that runs
it by name (tests/ir_runner.py); upstream passes are tested upstream."""
import re
from pathlib import Path

from blade.codegen import pipeline
from ir_runner import MLIR, RUN_LINE


def test_every_blade_pass_has_a_unit_test():
    every_option = pipeline.Options(num_buffers=0, user_calls=("a call",))
    blade_passes = {p.name for p in pipeline.build(every_option) if not p.upstream}
    assert {"channels-last", "outline-library-calls", "define-entry-point"} <= blade_passes
    named = set()
    for path in MLIR.rglob("*.mlir"):
        for run in RUN_LINE.findall(path.read_text()):
            named.update(re.findall(r"--(?:pass|from|to)[ =]([a-z][a-z-]+)", run))
    for path in Path(__file__).parent.rglob("test_*.py"):
        named.update(re.findall(r'"([a-z][a-z-]+)"', path.read_text()))
    assert not blade_passes - named, sorted(blade_passes - named)
