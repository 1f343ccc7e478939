"""`blade.optimize` of a `torch.export.ExportedProgram`.

The program's module (`ExportedProgram.module()`: its graph with the parameters and
buffers as attributes again) is traced into TorchScript with a forward that takes the
program's user inputs, flattened, by the names export gave them (`x`, `mask`, ...), so
that the optimized model is called as the original was: `optimized(x, mask=mask)`. The
dims export made dynamic (`torch.export.Dim`) become `Config.dynamic_dims`, unless the
Config names its own.

    ep = torch.export.export(model, (x,), {"mask": mask})
    optimized = blade.optimize(ep)          # the program's example inputs by default

The result is a ScriptModule like any other: saved with `torch.jit.save` and loaded in
Python or C++. The ExportedProgram itself is not changed.
"""
import dataclasses
import inspect
from typing import Any, Dict, List, Tuple

import torch
from torch.utils import _pytree as pytree

from blade.config import Config
from blade.frontend.scripting import trace_exported


def is_exported_program(model) -> bool:
    export = getattr(torch, "export", None)
    return export is not None and isinstance(model, export.ExportedProgram)


class _ExportedForward(torch.nn.Module):
    """The program's module, with a forward of named, flat tensor inputs."""

    def __init__(self, program, names: List[str]):
        super().__init__()
        self.program = program.module()
        self.in_spec = program.call_spec.in_spec

        def forward(*inputs):
            args, kwargs = pytree.tree_unflatten(list(inputs), self.in_spec)
            return self.program(*args, **kwargs)

        # torch.jit.trace names forward's arguments after this signature.
        forward.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for name in names])
        self.forward = forward


def _flat_inputs(program, args: Tuple, kwargs: Dict, names: List[str]) -> List[torch.Tensor]:
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    if spec != program.call_spec.in_spec:
        expected = program.call_spec.in_spec
        raise TypeError("blade.optimize: the example inputs are not laid out as the "
                        f"ExportedProgram's inputs ({', '.join(names)}): expected {expected}, "
                        f"found {spec}")
    for name, value in zip(names, flat):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"blade.optimize: the ExportedProgram's input '{name}' is a "
                            f"{type(value).__name__}; Blade takes exported programs whose "
                            "inputs are all tensors")
    return flat


def _dynamic_dims(program, names: List[str]) -> Dict[int, List[int]]:
    """The dims of each user input that export left symbolic, by input position."""
    values = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    dims = {}
    for position, name in enumerate(names):
        value = values.get(name)
        if isinstance(value, torch.Tensor):
            symbolic = [d for d, size in enumerate(value.shape) if isinstance(size, torch.SymInt)]
            if symbolic:
                dims[position] = symbolic
    return dims


def to_torchscript(program, args: Tuple, kwargs: Dict,
                   config: Config) -> Tuple[torch.jit.ScriptModule, Tuple[Any, ...], Config]:
    """The program traced into TorchScript, its example inputs as forward's positional
    inputs, and the Config with the program's dynamic dims."""
    if not args and not kwargs:
        if program.example_inputs is None:
            raise TypeError("blade.optimize: this ExportedProgram keeps no example inputs; "
                            "pass them as example_inputs")
        args, kwargs = program.example_inputs
    names = list(program.graph_signature.user_inputs)
    flat = _flat_inputs(program, args, kwargs, names)
    # No .eval(): the program's module refuses train(); export fixed its mode.
    traced = trace_exported(_ExportedForward(program, names),
                            tuple(t.detach().clone() for t in flat))
    dynamic_dims = _dynamic_dims(program, names)
    if dynamic_dims and config.dynamic_dims is None:
        config = dataclasses.replace(config, dynamic_dims=dynamic_dims)
    return traced, tuple(flat), config
