"""Decompositions: an op rewritten in terms of other ops before clustering.

    @blade.register_decomposition("mylib::softplus2")
    def softplus2(x: torch.Tensor, beta: float) -> torch.Tensor:
        return torch.log1p(torch.exp(x * beta)) / beta

The function is scripted once, when registered; `blade.optimize` inlines its body in place
of every node calling that overload (C++ pass `_C.decompose`), before the types of the
graph are materialized, so the ops it is made of are clustered and converted like any other.
A user's decomposition replaces Blade's own for the same overload. Ops named in
`Config.excluded_ops` are not decomposed.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import torch

from . import _C


class DecompositionError(ValueError):
    """A decomposition that does not fit the op it claims to decompose."""


@dataclass
class Decomposition:
    overload: str      # "aten::logsumexp", "mylib::op.overload"
    fn: Callable
    graph: torch._C.Graph
    builtin: bool = False
    dynamic_only: bool = False  # applies only with Config.dynamic


_BUILTIN: Dict[str, Decomposition] = {}
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


def _make(overload: str, fn: Callable, builtin: bool) -> Decomposition:
    schema = _op_schema(overload)
    try:
        scripted = torch.jit.script(fn)
    except Exception as e:
        raise DecompositionError(f"register_decomposition({overload}): TorchScript cannot "
                                 f"script {getattr(fn, '__name__', fn)}: {e}") from e
    _check_fits(overload, schema, scripted)
    return Decomposition(overload, fn, scripted.graph, builtin)


def register_decomposition(overload: str):
    """Decorator: rewrite every call of `overload` as the decorated function's body.

    Example:
        >>> @blade.register_decomposition("aten::logsumexp")
        ... def logsumexp(x: torch.Tensor, dim: List[int], keepdim: bool) -> torch.Tensor:
        ...     ...
    """
    def wrap(fn):
        _USER[overload] = _make(overload, fn, builtin=False)
        return fn
    return wrap


def unregister_decomposition(overload: str) -> None:
    """Removes the user's decomposition of `overload` (Blade's own, if any, applies again)."""
    _USER.pop(overload, None)


def active() -> Dict[str, Decomposition]:
    return {**_BUILTIN, **_USER}


def decompose(graph: torch._C.Graph, excluded_ops: Sequence[str] = (),
              dynamic: bool = False) -> Dict[str, int]:
    """Applies every active decomposition to `graph`; returns overload -> nodes rewritten.
    With `dynamic`, also those that only dynamic shapes need."""
    counts = {}
    for overload, decomposition in active().items():
        if overload in excluded_ops or overload.split(".")[0] in excluded_ops:
            continue
        if decomposition.dynamic_only and not dynamic:
            continue
        count = _C.decompose(graph, overload, decomposition.graph)
        if count:
            counts[overload] = count
    return counts


def _builtin(overload: str, dynamic_only: bool = False):
    def wrap(fn):
        _BUILTIN[overload] = _make(overload, fn, builtin=True)
        _BUILTIN[overload].dynamic_only = dynamic_only
        return fn
    return wrap


# --- Blade's own -------------------------------------------------------------------------

@_builtin("aten::logsumexp")
def _logsumexp(x: torch.Tensor, dim: List[int], keepdim: bool) -> torch.Tensor:
    # The shift by the maximum keeps exp in range; a maximum of +-inf shifts by 0 instead,
    # so a row of -inf gives -inf and a +inf gives +inf, as PyTorch does.
    peak = torch.amax(x, dim, True)
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
    total = torch.sum(torch.exp(x - peak), dim, keepdim)
    return torch.log(total) + torch.reshape(peak, total.shape)


@_builtin("aten::tril", dynamic_only=True)
def _tril(x: torch.Tensor, diagonal: int) -> torch.Tensor:
    # Torch-MLIR lowers tril of static sizes only; a causal mask of a dynamic sequence
    # length needs it as index arithmetic.
    rows = torch.arange(x.size(-2), device=x.device).unsqueeze(-1)
    cols = torch.arange(x.size(-1), device=x.device)
    return x.masked_fill(cols > rows + diagonal, 0)
