"""The .mlir tests of mlir/, run as their RUN lines say and checked FileCheck-style.

    // RUN: blade-opt --pass lower-reduce-windows %s | FileCheck %s
    func.func @main(%a: tensor<1x8x8x8xf32>) -> tensor<1x4x4x8xf32> { ... }
    // CHECK: linalg.generic
    // CHECK-NOT: stablehlo.reduce_window

`check_file(path)` runs the RUN line's blade-opt (blade.tools.opt) in this process, so the
pass runs through `pipeline.run`, under the verifier as in a real compilation, then applies
the file's `// CHECK...` lines to what blade-opt printed, as LLVM's FileCheck would: CHECK
(found after the previous match), CHECK-NEXT (on the next line), CHECK-SAME (on the same
line), CHECK-NOT (not between the matches around it), CHECK-COUNT-N (N times in a row);
`{{regex}}` inside a pattern is a regular expression, `[[NAME:regex]]` binds what it
matches and a later `[[NAME]]` must match the same text, the rest is literal. FileCheck's
`--implicit-check-not=PATTERN` on the RUN line is a CHECK-NOT around every check.
`run_pass(text, name)` runs one pass on a module a test writes, for what a RUN line cannot
give (a converter of the test's own).
"""
import re
import shlex
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from blade.codegen import pipeline
from blade.tools import opt

CHECK_LINE = re.compile(r"^\s*//\s*CHECK(-NEXT|-SAME|-NOT|-COUNT-\d+)?:\s?(.*)$", re.MULTILINE)
RUN_LINE = re.compile(r"^//\s*RUN:\s*(.*)$", re.MULTILINE)
MLIR = Path(__file__).resolve().parent.parent / "mlir"


def run_pass(text: str, name: str, handed_on=None,
             **options) -> Tuple[str, pipeline.Compilation]:
    """The module after the pass `name`, printed, and the compilation it ran in (its
    statistics and hand-offs). `options` are pipeline.Options fields; `handed_on` sets
    Compilation fields that earlier passes would have (`{"noalias": ...}`)."""
    compilation = opt.run(text, opt.options(**options), name, name, handed_on)
    return str(compilation.module), compilation


def run_line(path: Path) -> Tuple[List[str], List[str]]:
    """The blade-opt arguments of a .mlir file's RUN line, `blade-opt ARGS %s | FileCheck %s
    [--implicit-check-not=PATTERN ...]`, with %s and %S (the file's folder) substituted,
    and the patterns that may appear nowhere in the output (between or around the matches
    of its checks, as FileCheck's --implicit-check-not)."""
    runs = RUN_LINE.findall(path.read_text())
    assert len(runs) == 1, f"{path}: expected one // RUN: line, found {len(runs)}"
    command, bar, check = runs[0].partition("|")
    words, check = shlex.split(command), shlex.split(check)
    assert bar and words[0] == "blade-opt" and check[:2] == ["FileCheck", "%s"], \
        f"{path}: expected // RUN: blade-opt ... %s | FileCheck %s"
    absent = []
    for flag in check[2:]:
        assert flag.startswith("--implicit-check-not="), f"{path}: FileCheck {flag}?"
        absent.append(flag.split("=", 1)[1])
    substitutions = {"%s": str(path), "%S": str(path.parent)}
    arguments = [re.sub("%[sS]", lambda m: substitutions[m.group(0)], word)
                 for word in words[1:]]
    return arguments, absent


def run_file(path: Path) -> Tuple[str, pipeline.Compilation]:
    """What blade-opt prints for a .mlir file's RUN line, and the compilation it ran."""
    args = opt.parser().parse_args(run_line(path)[0])
    compilation = opt.run_input(args)
    return opt.printed(compilation, args.print_handed_on), compilation


def check_file(path: Path, printed: Optional[str] = None) -> None:
    """Runs a .mlir file's RUN line (or takes what it `printed`) and checks the file's
    `// CHECK` lines against the result."""
    checks = CHECK_LINE.findall(path.read_text())
    assert checks, f"{path} has no // CHECK line"
    if printed is None:
        printed = run_file(path)[0]
    file_check(checks, printed, implicit_not=run_line(path)[1])


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


def file_check(checks, output: str, implicit_not: Sequence[str] = ()) -> None:
    """`checks`: (kind, pattern) pairs as CHECK_LINE finds them; `implicit_not`: patterns
    checked as a CHECK-NOT before each other check and after the last. Raises
    AssertionError naming the first check that fails, with the output."""
    if implicit_not:
        spread = []
        for kind, pattern in checks:
            if kind != "-NOT":
                spread += [("-NOT", p) for p in implicit_not]
            spread.append((kind, pattern))
        checks = spread + [("-NOT", p) for p in implicit_not]
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
