"""`blade optimize | report | bisect | key`: Blade on saved TorchScript models, from a shell.

    blade optimize model.pt -o model.blade.pt --input 'float32[1,128,768]'
    blade report model.blade.pt
    blade bisect model.pt --input 'float32[1,128,768]' --atol 1e-4
    blade key     # the public key this machine signs engines with (docs/security.md)

Inputs are specs, `dtype[d0,d1,...]`, filled with random values (floats from N(0, 1),
integers from [0, HIGH) with `int64[1,128]:30522`, bools at random), or tensors saved
with `torch.save([t1, t2, ...], path)` given with `--inputs path`. Every `blade.Config`
field but those in NOT_FLAGS is a flag of `optimize` and `bisect`, generated from the
dataclass and its docstring (`config_flags`).
"""
import argparse
import dataclasses
import importlib
import importlib.util
import re
import sys
import typing
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from blade import __version__, dtypes, signing_public_key
from blade.config import CHOICES, Config
from blade.report import REPORT_ATTRIBUTE, report
from blade.frontend.inputs import describe_inputs, failure_summary
from blade.isolation import private_copy
from blade.tools.bisect import compare_clusters
from blade.quiet import quiet_torchscript

SPEC = re.compile(r"^\s*(\w+)\[([\d,\s]*)\](?::(\d+))?\s*$")
DTYPES = dtypes.BY_NAME  # the names a spec's dtype may have


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def random_input(spec: str, generator: torch.Generator) -> torch.Tensor:
    match = SPEC.match(spec)
    if not match:
        raise CliError(f"--input '{spec}': expected dtype[d0,d1,...] (e.g. float32[1,128,768] "
                       "or int64[1,128]:30522 for integers in [0, 30522))")
    name, dims, high = match.groups()
    if name not in DTYPES:
        raise CliError(f"--input '{spec}': unknown dtype '{name}'; known: "
                       f"{', '.join(sorted(DTYPES))}")
    dtype = DTYPES[name]
    sizes = [int(d) for d in dims.replace(" ", "").split(",") if d]
    if high is not None and (dtype.is_floating_point or dtype == torch.bool):
        raise CliError(f"--input '{spec}': ':{high}' bounds integer inputs only")
    if dtype == torch.bool:
        return torch.rand(sizes, generator=generator) > 0.5
    if not dtype.is_floating_point:
        if high is None:
            raise CliError(f"--input '{spec}': integer inputs need a bound, "
                           f"{name}[{dims}]:HIGH for values in [0, HIGH) (token ids: the "
                           "vocabulary size)")
        return torch.randint(0, int(high), sizes, generator=generator, dtype=dtype)
    return torch.randn(sizes, generator=generator).to(dtype)


def load_inputs(args) -> tuple:
    if args.inputs and args.input:
        raise CliError("give either --input specs or --inputs FILE, not both")
    if args.inputs:
        if not Path(args.inputs).exists():
            raise CliError(f"--inputs {args.inputs}: no such file")
        try:
            loaded = torch.load(args.inputs)
        except Exception as e:
            raise CliError(f"--inputs {args.inputs} is not a file written by torch.save: "
                           f"{str(e).strip().splitlines()[0]}") from None
        items = loaded if isinstance(loaded, (list, tuple)) else [loaded]
        if not all(isinstance(t, torch.Tensor) for t in items):
            raise CliError(f"--inputs {args.inputs}: expected a tensor or a list of tensors "
                           "(torch.save([t1, t2], path)), found "
                           f"{[type(t).__name__ for t in items]}")
        return tuple(items)
    if not args.input:
        raise CliError("the model's example inputs are needed: --input SPEC (one per input) "
                       "or --inputs FILE")
    generator = torch.Generator().manual_seed(args.seed)
    return tuple(random_input(spec, generator) for spec in args.input)


def load_plugins(plugins: Sequence[str]) -> None:
    """Python files or modules that register custom ops, converters or decompositions."""
    for plugin in plugins:
        path = Path(plugin)
        try:
            if path.suffix == ".py":
                if not path.exists():
                    raise CliError(f"--plugin {plugin}: no such file")
                spec = importlib.util.spec_from_file_location(path.stem, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            else:
                importlib.import_module(plugin)
        except CliError:
            raise
        except Exception as e:
            raise CliError(f"--plugin {plugin}: {type(e).__name__}: {e}") from e


def load_model(path: str) -> torch.jit.ScriptModule:
    if not Path(path).exists():
        raise CliError(f"{path}: no such file")
    try:
        return torch.jit.load(path)
    except Exception as e:
        raise CliError(f"{path} is not a saved TorchScript model: "
                       f"{str(e).splitlines()[0]}") from e


# Config fields that are not flags, and why; every other field is one (see config_flags).
NOT_FLAGS = {
    "allow_tracing": "the command line optimizes saved TorchScript models, which are "
                     "scripted already",
    "verbose": "the command prints the report itself, unless --quiet",
}
DYNAMIC_DIMS = re.compile(r"^\s*(\w+)\s*:\s*(\d+(?:\s*,\s*\d+)*)\s*$")


def config_help() -> Dict[str, str]:
    """Each Config field's entry in the `Attributes:` section of Config's docstring, on
    one line."""

    entries, name = {}, None
    attributes = Config.__doc__.split("Attributes:", 1)[1]
    for line in attributes.splitlines():
        entry = re.match(r"^ {8}(\w+): (.*)$", line)
        if entry:
            name, text = entry.groups()
            entries[name] = text
        elif name and line.startswith(" " * 12):
            entries[name] += " " + line.strip()
    return {name: text.replace("``", "") for name, text in entries.items()}


def _dynamic_dims(text: str):
    """`--dynamic-dims 0:0,1` or `--dynamic-dims mask:1`: an input (position or forward's
    argument name) and the dims of it that vary."""
    match = DYNAMIC_DIMS.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"'{text}': expected INPUT:DIM[,DIM...], the input by position or forward's "
            "argument name, like 0:0,1 or mask:1")
    key, dims = match.groups()
    return int(key) if key.isdigit() else key, [int(d) for d in dims.split(",")]


def _calibration(path: str) -> list:
    """`--calibration FILE`: `torch.save([inputs, ...], FILE)`, each entry a tensor or a
    list of tensors (one model call's inputs)."""
    if not Path(path).exists():
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    try:
        loaded = torch.load(path)
    except Exception as e:
        raise argparse.ArgumentTypeError(
            f"{path} is not a file written by torch.save: "
            f"{str(e).strip().splitlines()[0]}") from None

    def entry(item):
        if isinstance(item, torch.Tensor):
            return item
        if isinstance(item, (list, tuple)) and item and \
                all(isinstance(t, torch.Tensor) for t in item):
            return tuple(item)
        return None

    entries = [entry(item) for item in loaded] if isinstance(loaded, (list, tuple)) else []
    if not entries or any(e is None for e in entries):
        raise argparse.ArgumentTypeError(
            f"{path}: expected a non-empty list of calibration inputs, each a tensor or a "
            "list of tensors (torch.save([x1, x2, ...], path))")
    return entries


def config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per Config field (but NOT_FLAGS), named after it, typed after it, with
    its docstring entry as help: the command line cannot drift from Config."""

    helps = config_help()
    hints = typing.get_type_hints(Config)
    for field in dataclasses.fields(Config):
        if field.name in NOT_FLAGS:
            continue
        if field.name not in helps:
            raise TypeError(f"Config.{field.name} has no entry in Config's docstring")
        flag = "--" + field.name.replace("_", "-")
        hint, default = hints[field.name], field.default
        help_text = helps[field.name].replace("%", "%%")
        if hint in (bool, Optional[bool]):
            if default is None:
                help_text += " On the command line: shown unless --quiet."
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                           help=help_text)
        elif hint in (int, Optional[int]):
            p.add_argument(flag, type=int, default=default, metavar="N",
                           help=help_text + (f" (default: {default})" if default is not None
                                             else ""))
        elif hint in (str, Optional[str]):
            choices = CHOICES.get(field.name)
            p.add_argument(flag, default=default, choices=choices,
                           metavar=None if choices else field.name.split("_")[-1].upper(),
                           help=help_text + (f" (default: {default})" if default is not None
                                             else ""))
        elif hint == List[str]:
            aliases = ["--exclude"] if field.name == "excluded_ops" else []
            p.add_argument(flag, *aliases, action="append", default=[], dest=field.name,
                           metavar=field.name.split("_")[-1].upper().rstrip("S"),
                           help=f"{help_text} (repeatable)")
        elif field.name == "dynamic_dims":
            p.add_argument(flag, action="append", type=_dynamic_dims, default=None,
                           metavar="INPUT:DIMS",
                           help=f"{help_text} On the command line: INPUT:DIM[,DIM...], "
                                "repeatable, like 0:0,1 or mask:1.")
        elif field.name == "calibration":
            p.add_argument(flag, type=_calibration, default=None, metavar="FILE",
                           help=f"{help_text} On the command line: a file written by "
                                "torch.save([inputs, ...], FILE), each entry a tensor or a "
                                "list of tensors.")
        else:
            raise TypeError(f"Config.{field.name} ({hint}) has no command-line form; add "
                            "one to blade.tools.cli.config_flags or a reason to NOT_FLAGS")


def config_from(args):

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Config)
              if f.name not in NOT_FLAGS}
    if values["dynamic_dims"] is not None:
        values["dynamic_dims"] = dict(values["dynamic_dims"])
    if values["progress"] is None:
        values["progress"] = not args.quiet
    try:
        return Config(**values)
    except ValueError as e:
        raise CliError(str(e)) from None


def optimize_saved(args):
    # Only the commands that optimize load the compiler.
    from blade.compiler import optimize

    load_plugins(args.plugin)
    model = load_model(args.model)
    if hasattr(model, REPORT_ATTRIBUTE):
        raise CliError(f"{args.model} was already optimized by Blade; give the original model")
    inputs = load_inputs(args)
    check_model_runs(args.model, model, inputs)
    return optimize(model, inputs, config_from(args)), inputs


def check_model_runs(path: str, model, inputs: tuple) -> None:
    """A model that does not take the inputs given is the user's mistake: one line, not the
    interpreter's traceback from inside optimize."""

    try:
        with torch.no_grad():
            model(*private_copy(inputs))
    except (RuntimeError, TypeError, ValueError) as e:
        raise CliError(f"{path} does not run on the inputs given ({describe_inputs(inputs)}): "
                       f"{failure_summary(e)}") from None


def cmd_optimize(args) -> int:

    optimized, inputs = optimize_saved(args)
    with torch.no_grad():
        optimized(*inputs)  # one call: the report shows that the engines run
    try:
        torch.jit.save(optimized, args.output)
    except (OSError, RuntimeError) as e:
        raise CliError(f"cannot write {args.output}: {str(e).strip().splitlines()[0]}") \
            from None
    if not args.quiet:
        print(report(optimized))
    print(f"saved {args.output}")
    return 0


def cmd_report(args) -> int:

    model = load_model(args.model)
    if not hasattr(model, REPORT_ATTRIBUTE):
        raise CliError(f"{args.model} was not optimized by Blade (it has no report)")
    result = report(model)
    print(result.to_json() if args.json else result)
    return 0


def cmd_bisect(args) -> int:

    optimized, inputs = optimize_saved(args)
    comparisons = compare_clusters(optimized, inputs, rtol=args.rtol, atol=args.atol)
    bad = [c for c in comparisons if not c.matches]
    for c in comparisons:
        print(c)
        if not c.matches:
            for line in c.outputs:
                if line != "ok":
                    print(f"    {line}")
    if not comparisons:
        print("no compiled clusters: nothing to compare")
    print(f"{len(bad)} of {len(comparisons)} clusters differ from their TorchScript "
          f"subgraph beyond rtol={args.rtol}, atol={args.atol}"
          + (": " + ", ".join(c.name for c in bad) if bad else ""))
    return 1 if bad else 0


def cmd_key(args) -> int:

    print(signing_public_key(args.signing_key))
    return 0


def parser() -> argparse.ArgumentParser:

    top = OneLineParser(prog="blade", description=__doc__.split("\n\n")[0])
    top.add_argument("--version", action="version", version=f"blade {__version__}")
    commands = top.add_subparsers(dest="command", required=True)

    def model_options(p):
        p.add_argument("model", help="a model saved with torch.jit.save")
        p.add_argument("--input", action="append", default=[], metavar="SPEC",
                       help="one per model input: dtype[d0,d1,...] (random values); "
                            "integers need a bound, int64[...]:HIGH for [0, HIGH)")
        p.add_argument("--inputs", metavar="FILE",
                       help="the inputs, saved with torch.save([t1, t2, ...], FILE)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--plugin", action="append", default=[], metavar="PY",
                       help="a .py file or module to import first (custom ops, converters, "
                            "decompositions); repeatable")
        p.add_argument("--quiet", action="store_true", help="no progress bar or report")
        config = p.add_argument_group("blade.Config", "each flag sets the Config field of "
                                                      "its name")
        config_flags(config)

    p = commands.add_parser("optimize", help="optimize a saved TorchScript model")
    model_options(p)
    p.add_argument("-o", "--output", required=True, help="where to save the optimized model")
    p.set_defaults(run=cmd_optimize)

    p = commands.add_parser("report", help="print the report of a saved optimized model")
    p.add_argument("model", help="a model saved after blade.optimize")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(run=cmd_report)

    p = commands.add_parser("bisect", help="find the clusters whose compiled results differ "
                                           "from their TorchScript subgraph")
    model_options(p)
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="relative tolerance of the comparison (default: 1e-4)")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="absolute tolerance of the comparison (default: 1e-4)")
    p.set_defaults(run=cmd_bisect)

    p = commands.add_parser("key", help="print the public key engines compiled here are signed "
                                        "with; machines that load them trust it")
    p.add_argument("--signing-key", metavar="PEM", help="an Ed25519 private key file instead "
                                                        "of this machine's key")
    p.set_defaults(run=cmd_key)
    return top


def main(argv: Optional[List[str]] = None) -> int:

    args = parser().parse_args(argv)
    with quiet_torchscript():
        try:
            return args.run(args)
        except CliError as e:
            print(f"blade {args.command}: error: {e}", file=sys.stderr)
            return 2
