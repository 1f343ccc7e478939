"""`blade optimize | report | bisect | key`: Blade on saved TorchScript models, from a shell.

    blade optimize model.pt -o model.blade.pt --input 'float32[1,128,768]'
    blade report model.blade.pt
    blade bisect model.pt --input 'float32[1,128,768]' --atol 1e-4
    blade key     # the public key this machine signs engines with (docs/security.md)

Inputs are specs, `dtype[d0,d1,...]`, filled with random values (floats from N(0, 1),
integers from [0, HIGH) with `int64[1,128]:30522`, bools at random), or tensors saved
with `torch.save([t1, t2, ...], path)` given with `--inputs path`.
"""
import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import torch

SPEC = re.compile(r"^\s*(\w+)\[([\d,\s]*)\](?::(\d+))?\s*$")
DTYPES = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64,
    "double": torch.float64, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64,
    "int32": torch.int32, "int": torch.int32, "bool": torch.bool,
}


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


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
        return torch.randint(0, int(high or 10), sizes, generator=generator, dtype=dtype)
    return torch.randn(sizes, generator=generator).to(dtype)


def load_inputs(args) -> tuple:
    if args.inputs and args.input:
        raise CliError("give either --input specs or --inputs FILE, not both")
    if args.inputs:
        loaded = torch.load(args.inputs)
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


def config_from(args, **extra):
    from .config import Config

    return Config(excluded_ops=list(args.exclude), min_cluster_size=args.min_cluster_size,
                  fallback=getattr(args, "fallback", "fallback"),
                  signing_key=getattr(args, "signing_key", None),
                  dump_dir=args.dump_dir, progress=not args.quiet, **extra)


def optimize_saved(args):
    from .compiler import optimize
    from .report import REPORT_ATTRIBUTE

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
    from .compiler import private_copy

    try:
        with torch.no_grad():
            model(*private_copy(inputs))
    except (RuntimeError, TypeError, ValueError) as e:
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        # TorchScript's own errors end with the message; Python's start with it.
        message = lines[-1] if "Traceback of TorchScript" in str(e) else lines[0]
        given = "; ".join(f"{str(t.dtype).replace('torch.', '')}"
                          f"[{','.join(str(d) for d in t.shape)}]" for t in inputs)
        raise CliError(f"{path} does not run on the inputs given ({given}): {message}") \
            from None


def cmd_optimize(args) -> int:
    from .report import report

    optimized, inputs = optimize_saved(args)
    with torch.no_grad():
        optimized(*inputs)  # one call: the report shows that the engines run
    torch.jit.save(optimized, args.output)
    if not args.quiet:
        print(report(optimized))
    print(f"saved {args.output}")
    return 0


def cmd_report(args) -> int:
    from .report import REPORT_ATTRIBUTE, report

    model = load_model(args.model)
    if not hasattr(model, REPORT_ATTRIBUTE):
        raise CliError(f"{args.model} was not optimized by Blade (it has no report)")
    result = report(model)
    print(result.to_json() if args.json else result)
    return 0


def cmd_bisect(args) -> int:
    from .debug import compare_clusters

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
    from . import signing_public_key

    print(signing_public_key(args.signing_key))
    return 0


def parser() -> argparse.ArgumentParser:
    from . import __version__

    top = argparse.ArgumentParser(prog="blade", description=__doc__.split("\n\n")[0])
    top.add_argument("--version", action="version", version=f"blade {__version__}")
    commands = top.add_subparsers(dest="command", required=True)

    def model_options(p, with_fallback):
        p.add_argument("model", help="a model saved with torch.jit.save")
        p.add_argument("--input", action="append", default=[], metavar="SPEC",
                       help="one per model input: dtype[d0,d1,...] (random values); "
                            "int64[...]:HIGH for integers in [0, HIGH)")
        p.add_argument("--inputs", metavar="FILE",
                       help="the inputs, saved with torch.save([t1, t2, ...], FILE)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--exclude", action="append", default=[], metavar="OP",
                       help="an op overload or name to keep in TorchScript (repeatable)")
        p.add_argument("--min-cluster-size", type=int, default=1)
        p.add_argument("--dump-dir", help="write the IR of every stage here")
        p.add_argument("--plugin", action="append", default=[], metavar="PY",
                       help="a .py file or module to import first (custom ops, converters, "
                            "decompositions); repeatable")
        p.add_argument("--quiet", action="store_true", help="no progress bar or report")
        if with_fallback:
            p.add_argument("--fallback", choices=["fallback", "error"], default="fallback",
                           help="what engines do with inputs they were not compiled for")
            p.add_argument("--signing-key", metavar="PEM",
                           help="the Ed25519 private key that signs the engines (default: "
                                "this machine's key)")

    p = commands.add_parser("optimize", help="optimize a saved TorchScript model")
    model_options(p, True)
    p.add_argument("-o", "--output", required=True, help="where to save the optimized model")
    p.set_defaults(run=cmd_optimize)

    p = commands.add_parser("report", help="print the report of a saved optimized model")
    p.add_argument("model", help="a model saved after blade.optimize")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(run=cmd_report)

    p = commands.add_parser("bisect", help="find the clusters whose compiled results differ "
                                           "from their TorchScript subgraph")
    model_options(p, False)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-4)
    p.set_defaults(run=cmd_bisect)

    p = commands.add_parser("key", help="print the public key engines compiled here are signed "
                                        "with; machines that load them trust it")
    p.add_argument("--signing-key", metavar="PEM", help="an Ed25519 private key file instead "
                                                        "of this machine's key")
    p.set_defaults(run=cmd_key)
    return top


def main(argv: Optional[List[str]] = None) -> int:
    from .quiet import quiet_torchscript

    args = parser().parse_args(argv)
    with quiet_torchscript():
        try:
            return args.run(args)
        except CliError as e:
            print(f"blade {args.command}: error: {e}", file=sys.stderr)
            return 2
