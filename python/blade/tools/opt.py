"""`blade-opt` (also `python -m blade.tools.opt`): passes of the codegen pipeline on a .mlir
file, printed as they leave it, as iree-opt and torch-mlir-opt do for theirs. mlir/ holds
each pass's tests in this form, and their RUN lines are these commands:

    blade-opt --list                                      the pipeline's passes, in order
    blade-opt --pass sink-slices mlir/stablehlo/sink-slices.mlir
    blade-opt --from mark-out-params --to order-loops --option avx512=true loops.mlir
    blade-opt --pass mark-noalias-pointers \\
        --handed-on "noalias={'task': [(5, False), (5, True)]}" lowered.mlir

The passes are those of blade.codegen.pipeline.build for the options given (`--option
KEY=VALUE` sets a pipeline.Options field; `--user-calls FILE.py`, the user converters the
list USER_CALLS of FILE.py holds), run with pipeline.run, so under its verifier as in a
compilation. A pass is named as `--list` shows it, `sink-slices` (its first run from where
the slice starts) or `24_sink-slices` (that one run). `--handed-on KEY=VALUE` sets what
earlier passes would have handed on (a pipeline.Compilation field, VALUE a Python literal);
`--print-handed-on` prints what the passes handed on after the module, as comments in the
same form. Errors are one line on stderr: exit status 2 for a bad command line or input,
1 for a pass that failed.
"""
import argparse
import ast
import dataclasses
import os
import re
import runpy
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo as stablehlo
from torch_mlir.dialects import torch as torch_dialect

from blade.codegen import driver, pipeline
from blade.codegen.errors import CodegenError
from blade.tools.cli import CliError, OneLineParser

# The Compilation fields that passes hand on to later ones and --handed-on may set.
HANDED_ON = ("parallel_tasks", "noalias")


def options(**fields) -> pipeline.Options:
    """pipeline.Options with `fields` (num_buffers 0 unless given)."""
    return pipeline.Options(num_buffers=fields.pop("num_buffers", 0), **fields)


def labels(passes: Sequence[pipeline.Pass]) -> List[str]:
    """`NN_<name>` per pass, as `--list` prints them and dump files are named."""
    return [pipeline.pass_label(index, step) for index, step in enumerate(passes)]


def select(passes: Sequence[pipeline.Pass], first: Optional[str] = None,
           last: Optional[str] = None) -> List[pipeline.Pass]:
    """The passes from `first` to `last`, both included (from the start or to the end where
    not given); each named as `--list` shows it, a bare name meaning its first run from
    where the slice starts.

    Example:
        >>> select(pipeline.build(options()), "sink-slices", "sink-slices")
    """
    start = 0 if first is None else _position(passes, first, 0)
    end = len(passes) - 1 if last is None else _position(passes, last, start)
    return list(passes[start:end + 1])


def _position(passes: Sequence[pipeline.Pass], name: str, start: int) -> int:
    names = labels(passes)
    if name in names:
        if names.index(name) < start:
            raise CliError(f"pass {name} runs before {names[start]}, where the slice starts")
        return names.index(name)
    for index in range(start, len(passes)):
        if passes[index].name == name:
            return index
    where = "" if start == 0 else f" from {names[start]} on"
    raise CliError(f"the pipeline has no pass {name!r}{where} for these options (blade-opt "
                   "--list, with the same --option and --user-calls flags, lists them)")


def run(text: str, settings: pipeline.Options, first: Optional[str] = None,
        last: Optional[str] = None, handed_on=None, source: str = "-") -> pipeline.Compilation:
    """Parses `text`, a module, and runs the passes from `first` to `last` (see `select`)
    on it with pipeline.run; returns the compilation (its module, statistics and what the
    passes handed on). `handed_on` sets Compilation fields that earlier passes would have
    (`{"noalias": ...}`). Raises CliError when the module does not parse or a pass is not
    in the pipeline, CodegenError when a pass fails.

    Example:
        >>> run(text, options(num_buffers=2), "define-entry-point", "define-entry-point")
    """
    steps = select(pipeline.build(settings), first, last)
    driver.register_passes()
    context = ir.Context()
    torch_dialect.register_dialect(context)
    stablehlo.register_dialect(context)
    with context, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise CliError(_parse_error(e, source)) from None
        compilation = pipeline.Compilation(module, settings, **(handed_on or {}))
        pipeline.run(compilation, steps)
    return compilation


def _parse_error(error: Exception, source: str) -> str:
    """`source:line:column: message` of the first diagnostic of a failed parse."""
    diagnostics = list(getattr(error, "error_diagnostics", None) or ())
    if not diagnostics:
        return f"{source} does not parse: {str(error).splitlines()[-1]}"
    where = re.search(r":(\d+):(\d+)\)$", str(diagnostics[0].location))
    position = f":{where.group(1)}:{where.group(2)}" if where else ""
    return f"{source}{position}: {str(diagnostics[0].message).strip()}"


def printed(compilation: pipeline.Compilation, handed_on: bool = False) -> str:
    """The module as blade-opt prints it: with `handed_on`, then one comment a HANDED_ON
    field, `// handed on: KEY=VALUE`, in the form --handed-on reads."""
    lines = [str(compilation.module).rstrip("\n")]
    if handed_on:
        lines += [f"// handed on: {key}={getattr(compilation, key)!r}" for key in HANDED_ON]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="blade-opt", description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="?", help="the .mlir file, or - for stdin")
    p.add_argument("--list", action="store_true",
                   help="print the pipeline's passes, in order, and exit")
    p.add_argument("--pass", dest="only", metavar="NAME", help="run this pass only")
    p.add_argument("--from", dest="first", metavar="NAME",
                   help="run the pipeline from this pass (default: its first)")
    p.add_argument("--to", dest="last", metavar="NAME",
                   help="run the pipeline to this pass, included (default: its last)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a pipeline.Options field: " + ", ".join(
                       f.name for f in dataclasses.fields(pipeline.Options)
                       if f.name != "user_calls") + "; repeatable")
    p.add_argument("--user-calls", metavar="FILE.py",
                   help="the user converters' calls, the list USER_CALLS of FILE.py "
                        "(blade.importer.UserCall)")
    p.add_argument("--handed-on", action="append", default=[], metavar="KEY=VALUE",
                   help=f"what earlier passes handed on, one of {', '.join(HANDED_ON)} as a "
                        "Python literal; repeatable")
    p.add_argument("--print-handed-on", action="store_true",
                   help="after the module, what the passes handed on, as comments")
    return p


def settings_of(args) -> pipeline.Options:
    """The pipeline.Options that the command line's --option and --user-calls give."""
    fields = {f.name: f for f in dataclasses.fields(pipeline.Options) if f.name != "user_calls"}
    given = {}
    for key, value in _pairs(args.option, "--option"):
        if key not in fields:
            raise CliError(f"--option {key}: no such option; options: {', '.join(fields)}")
        given[key] = _typed(value, fields[key].type, f"--option {key}")
    if args.user_calls:
        given["user_calls"] = tuple(_user_calls(args.user_calls))
    return options(**given)


def handed_on_of(args) -> dict:
    """The Compilation fields that the command line's --handed-on flags set."""
    given = {}
    for key, value in _pairs(args.handed_on, "--handed-on"):
        if key not in HANDED_ON:
            raise CliError(f"--handed-on {key}: not something passes hand on; one of "
                           f"{', '.join(HANDED_ON)}")
        try:
            given[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise CliError(f"--handed-on {key}: {value!r} is not a Python literal") from None
    return given


def _pairs(flags: Sequence[str], flag: str):
    for text in flags:
        key, equals, value = text.partition("=")
        if not equals:
            raise CliError(f"{flag} {text}: expected KEY=VALUE")
        yield key.strip(), value.strip()


def _typed(value: str, kind, what: str):
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise CliError(f"{what}: expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    try:
        return kind(value)
    except ValueError:
        raise CliError(f"{what}: expected {kind.__name__}, got {value!r}") from None


def _user_calls(path: str) -> list:
    if not Path(path).is_file():
        raise CliError(f"--user-calls {path}: no such file")
    calls = runpy.run_path(path).get("USER_CALLS")
    if calls is None:
        raise CliError(f"--user-calls {path}: the file defines no USER_CALLS")
    return list(calls)


def run_input(args) -> pipeline.Compilation:
    """What the command line `args` (parser()'s) asks for, run on its input."""
    if args.only and (args.first or args.last):
        raise CliError("give either --pass or --from/--to, not both")
    if args.input is None:
        raise CliError("no input file (- for stdin)")
    if args.input == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(args.input).read_text()
        except OSError as e:
            raise CliError(f"cannot read {args.input}: {e.strerror}") from None
    return run(text, settings_of(args), args.only or args.first, args.only or args.last,
               handed_on_of(args), args.input)


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.list:
            passes = pipeline.build(settings_of(args))
            output = "".join(label + ("  (upstream)\n" if step.upstream else "\n")
                             for label, step in zip(labels(passes), passes))
        else:
            output = printed(run_input(args), args.print_handed_on)
    except CliError as e:
        print(f"blade-opt: error: {e}", file=sys.stderr)
        return 2
    except CodegenError as e:
        print(f"blade-opt: error: {e.summary}", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `blade-opt ... | head`: the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
