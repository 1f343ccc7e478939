"""One pass of the codegen pipeline on a small hand-written module, checked FileCheck-style.

    check_pass('''
        func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { ... }
        // CHECK: linalg.generic
        // CHECK-NOT: stablehlo.reduce_window
    ''', "lower-reduce-windows")

runs the pipeline's pass named "lower-reduce-windows" (blade.codegen.pipeline.build) on
the module through `pipeline.run` (so under the verifier, as in a real compilation), then
applies the `// CHECK...` lines of the input to the module it printed, as LLVM's FileCheck
would: CHECK (found after the previous match), CHECK-NEXT (on the next line), CHECK-SAME
(on the same line), CHECK-NOT (not between the matches around it), CHECK-COUNT-N (N times
in a row); `{{regex}}` inside a pattern is a regular expression, the rest literal.
"""
import re
from typing import Tuple

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_dialect

from blade.codegen import driver, pipeline

CHECK_LINE = re.compile(r"^\s*//\s*CHECK(-NEXT|-SAME|-NOT|-COUNT-\d+)?:\s?(.*)$", re.MULTILINE)


def run_pass(text: str, name: str, **options) -> Tuple[str, pipeline.Compilation]:
    """The module after the pass `name`, printed, and the compilation it ran in (its
    statistics and hand-offs). `options` are pipeline.Options fields."""
    driver.register_passes()
    context = ir.Context()
    torch_dialect.register_dialect(context)
    with context, ir.Location.unknown():
        module = ir.Module.parse(text)
        settings = pipeline.Options(num_buffers=options.pop("num_buffers", 0), **options)
        steps = [step for step in pipeline.build(settings) if step.name == name]
        assert steps, f"the pipeline has no pass named {name!r}"
        compilation = pipeline.Compilation(module, settings)
        pipeline.run(compilation, steps[:1])
        return str(module), compilation


def check_pass(text: str, name: str, **options) -> pipeline.Compilation:
    """Runs the pass `name` on `text` and checks its `// CHECK` lines against the result."""
    checks = CHECK_LINE.findall(text)
    assert checks, "a pass test needs at least one // CHECK line"
    result, compilation = run_pass(text, name, **options)
    file_check(checks, result)
    return compilation


def _pattern(check: str):
    parts = re.split(r"\{\{(.*?)\}\}", check.strip())
    return re.compile("".join(part if i % 2 else re.escape(part) for i, part in enumerate(parts)))


def file_check(checks, output: str) -> None:
    """`checks`: (kind, pattern) pairs as CHECK_LINE finds them; raises AssertionError
    naming the first check that fails, with the output."""
    position, line_end, pending_not = 0, 0, []

    def fail(kind, pattern, why):
        raise AssertionError(f"CHECK{kind}: {pattern.strip()}: {why}\n--- output ---\n{output}")

    def found(kind, pattern, match):
        for not_pattern in pending_not:
            if _pattern(not_pattern).search(output, position, match.start()):
                fail("-NOT", not_pattern, "found")
        pending_not.clear()

    for kind, pattern in checks:
        if kind == "-NOT":
            pending_not.append(pattern)
            continue
        times = int(kind.rsplit("-", 1)[1]) if kind.startswith("-COUNT-") else 1
        for _ in range(times):
            if kind == "-SAME":
                match = _pattern(pattern).search(output, position, line_end)
            elif kind == "-NEXT":
                start = line_end + 1
                end = output.find("\n", start)
                match = _pattern(pattern).search(output, start, len(output) if end < 0 else end)
            else:
                match = _pattern(pattern).search(output, position)
            if match is None:
                fail(kind or "", pattern, "not found")
            found(kind, pattern, match)
            position = match.end()
            end = output.find("\n", position)
            line_end = len(output) if end < 0 else end
    for not_pattern in pending_not:
        if _pattern(not_pattern).search(output, position):
            fail("-NOT", not_pattern, "found")
