"""One pass of the codegen pipeline on a small hand-written module, checked FileCheck-style.

    check_pass('''
        func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> { ... }
        // CHECK: linalg.generic
        // CHECK-NOT: stablehlo.reduce_window
    ''', "lower-reduce-windows")

runs the pipeline's pass named "lower-reduce-windows" (blade.codegen.pipeline.build) on
the module with blade-opt's `run` (blade.tools.opt), through `pipeline.run` (so under the
verifier, as in a real compilation), then applies the `// CHECK...` lines of the input to
the module it printed, as LLVM's FileCheck would: CHECK (found after the previous match),
CHECK-NEXT (on the next line), CHECK-SAME (on the same line), CHECK-NOT (not between the
matches around it), CHECK-COUNT-N (N times in a row); `{{regex}}` inside a pattern is a
regular expression, `[[NAME:regex]]` binds what it matches and a later `[[NAME]]` must
match the same text, the rest is literal.
"""
import re
from typing import Tuple

from blade.codegen import pipeline
from blade.tools import opt

CHECK_LINE = re.compile(r"^\s*//\s*CHECK(-NEXT|-SAME|-NOT|-COUNT-\d+)?:\s?(.*)$", re.MULTILINE)


def run_pass(text: str, name: str, handed_on=None,
             **options) -> Tuple[str, pipeline.Compilation]:
    """The module after the pass `name`, printed, and the compilation it ran in (its
    statistics and hand-offs). `options` are pipeline.Options fields; `handed_on` sets
    Compilation fields that earlier passes would have (`{"noalias": ...}`)."""
    compilation = opt.run(text, opt.options(**options), name, name, handed_on)
    return str(compilation.module), compilation


def check_pass(text: str, name: str, handed_on=None, **options) -> pipeline.Compilation:
    """Runs the pass `name` on `text` and checks its `// CHECK` lines against the result."""
    checks = CHECK_LINE.findall(text)
    assert checks, "a pass test needs at least one // CHECK line"
    result, compilation = run_pass(text, name, handed_on, **options)
    file_check(checks, result)
    return compilation


_PIECE = re.compile(r"\{\{(.*?)\}\}|\[\[(\w+):(.*?)\]\](?!\])|\[\[(\w+)\]\]")


def _pattern(check: str, variables=None):
    variables = {} if variables is None else variables
    regex, position, check = [], 0, check.strip()
    for match in _PIECE.finditer(check):
        regex.append(re.escape(check[position:match.start()]))
        raw, name, defined, used = match.groups()
        if raw is not None:
            regex.append(raw)
        elif name is not None:
            regex.append(f"(?P<{name}>{defined})")
        else:
            assert used in variables, f"[[{used}]] is used before it is bound"
            regex.append(re.escape(variables[used]))
        position = match.end()
    regex.append(re.escape(check[position:]))
    return re.compile("".join(regex))


def file_check(checks, output: str) -> None:
    """`checks`: (kind, pattern) pairs as CHECK_LINE finds them; raises AssertionError
    naming the first check that fails, with the output."""
    position, line_end, pending_not, variables = 0, 0, [], {}

    def fail(kind, pattern, why):
        raise AssertionError(f"CHECK{kind}: {pattern.strip()}: {why}\n--- output ---\n{output}")

    def found(kind, pattern, match):
        for not_pattern in pending_not:
            if _pattern(not_pattern, variables).search(output, position, match.start()):
                fail("-NOT", not_pattern, "found")
        pending_not.clear()

    for kind, pattern in checks:
        if kind == "-NOT":
            pending_not.append(pattern)
            continue
        times = int(kind.rsplit("-", 1)[1]) if kind.startswith("-COUNT-") else 1
        for _ in range(times):
            compiled = _pattern(pattern, variables)
            if kind == "-SAME":
                match = compiled.search(output, position, line_end)
            elif kind == "-NEXT":
                start = line_end + 1
                end = output.find("\n", start)
                match = compiled.search(output, start, len(output) if end < 0 else end)
            else:
                match = compiled.search(output, position)
            if match is None:
                fail(kind or "", pattern, "not found")
            variables.update(match.groupdict())
            found(kind, pattern, match)
            position = match.end()
            end = output.find("\n", position)
            line_end = len(output) if end < 0 else end
    for not_pattern in pending_not:
        if _pattern(not_pattern, variables).search(output, position):
            fail("-NOT", not_pattern, "found")
