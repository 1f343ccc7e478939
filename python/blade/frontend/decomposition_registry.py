"""Blade's decompositions' registry: what a decomposition is, where Blade's own and the
user's are kept, and how one is checked against its op and scripted. The decompositions
themselves live in decompositions.py and the *_decompositions.py modules of op families,
which register with `builtin`.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch

from blade.quiet import quiet_torchscript


class DecompositionError(ValueError):
    """A decomposition that does not fit the op it claims to decompose."""


@dataclass
class Decomposition:
    """One decomposition. A user's is scripted and checked when registered, so that a bad
    one fails there; Blade's own are scripted on first use (`graph`), since scripting all
    of them took a quarter of a second of every process's first optimize and a model uses
    a few (tests/passes/test_decompose.py scripts and checks every one)."""

    overload: str      # "aten::logsumexp", "mylib::op.overload"
    fn: Callable
    builtin: bool = False
    static_only: bool = False  # not applied with Config.dynamic
    # Results that must have no uses for a node to be rewritten (the body returns a
    # stand-in for them; see csrc/passes/decompose.h).
    unused_results: Tuple[int, ...] = ()
    scripted_graph: Optional[torch._C.Graph] = field(default=None, repr=False)

    @property
    def graph(self) -> torch._C.Graph:
        if self.scripted_graph is None:
            self.scripted_graph = _script(self.overload, self.fn)
        return self.scripted_graph


# Blade's own; those for dynamic shapes replace them with Config.dynamic. A user's
# decomposition replaces Blade's for the same overload.
_BUILTIN: Dict[str, Decomposition] = {}
_BUILTIN_DYNAMIC: Dict[str, Decomposition] = {}
_USER: Dict[str, Decomposition] = {}


def _op_schema(overload: str) -> torch._C.FunctionSchema:
    if "::" not in overload:
        raise DecompositionError(f"register_decomposition: '{overload}' is not an op name; "
                                 "expected 'namespace::name' or 'namespace::name.overload'")
    namespace, rest = overload.split("::", 1)
    name, _, overload_name = rest.partition(".")
    schemas = torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}")
    for schema in schemas:
        if schema.overload_name == overload_name:
            return schema
    known = sorted(f"{namespace}::{name}" + (f".{s.overload_name}" if s.overload_name else "")
                   for s in schemas)
    raise DecompositionError(
        f"register_decomposition: no op overload {overload}; "
        + (f"the overloads of {namespace}::{name} are {', '.join(known)}" if known
           else f"{namespace}::{name} is not a registered op"))


def _check_fits(overload: str, schema, scripted) -> None:
    """The function must take every argument of the op, in order, with types the op's values
    have, and return what the op returns."""
    params = scripted.schema.arguments
    args = schema.arguments
    if len(params) != len(args):
        raise DecompositionError(
            f"register_decomposition({overload}): the op takes {len(args)} arguments "
            f"({', '.join(a.name for a in args)}), the function takes {len(params)}")
    for i, (arg, param) in enumerate(zip(args, params)):
        if not arg.type.isSubtypeOf(param.type):
            raise DecompositionError(
                f"register_decomposition({overload}): argument {i} '{arg.name}' of the op is "
                f"{arg.type}, but the function's '{param.name}' takes {param.type}")
    returns = [r.type for r in schema.returns]
    declared = scripted.schema.returns[0].type
    if len(returns) > 1:
        got = declared.elements() if isinstance(declared, torch._C.TupleType) else [declared]
    else:
        got = [declared]
    if len(got) != len(returns) or not all(g.isSubtypeOf(r) for g, r in zip(got, returns)):
        raise DecompositionError(
            f"register_decomposition({overload}): the op returns "
            f"({', '.join(str(r) for r in returns)}), the function returns {declared}")


def _script(overload: str, fn: Callable) -> torch._C.Graph:
    """`fn` scripted and checked against the op's schema: its graph."""
    schema = _op_schema(overload)
    try:
        with quiet_torchscript():
            scripted = torch.jit.script(fn)
    except Exception as e:
        raise DecompositionError(f"register_decomposition({overload}): TorchScript cannot "
                                 f"script {getattr(fn, '__name__', fn)}: {e}") from e
    _check_fits(overload, schema, scripted)
    return scripted.graph


def _make(overload: str, fn: Callable, builtin: bool, static_only: bool = False,
          unused_results: Tuple[int, ...] = ()) -> Decomposition:
    """A user's decomposition (scripted now) or Blade's own (`builtin`: on first use)."""
    graph = None if builtin else _script(overload, fn)
    return Decomposition(overload, fn, builtin, static_only, unused_results, graph)


def builtin(overload: str, shapes: str = "any", unused_results: Tuple[int, ...] = ()):
    """Registers one of Blade's decompositions, for `shapes` "any", "static" (not applied
    with Config.dynamic) or "dynamic" (applied with Config.dynamic only, in place of any
    other for the overload), applied only where the op's `unused_results` are unused."""
    def wrap(fn):
        decomposition = _make(overload, fn, builtin=True, static_only=shapes == "static",
                              unused_results=tuple(unused_results))
        (_BUILTIN_DYNAMIC if shapes == "dynamic" else _BUILTIN)[overload] = decomposition
        return fn
    return wrap
