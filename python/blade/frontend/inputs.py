"""The example inputs `optimize` is given: positional, by name or both, bound to forward's
arguments (blade.isolation gives each run of the model its private copy of them)."""
import dataclasses
import difflib
import inspect
from typing import Dict, Tuple

import torch

from blade.config import Config


def split_example_inputs(example_inputs, example_kwarg_inputs) -> Tuple[Tuple, Dict]:
    """The example inputs as (positional, keyword): a tensor, a tuple or list of inputs, or
    a dict of forward's arguments by name, plus `example_kwarg_inputs`."""
    kwargs = dict(example_kwarg_inputs or {})
    if example_kwarg_inputs is not None and not isinstance(example_kwarg_inputs, dict):
        raise TypeError("blade.optimize: example_kwarg_inputs must be a dict of forward's "
                        f"arguments by name, got {type(example_kwarg_inputs).__name__}")
    if isinstance(example_inputs, dict):
        if kwargs:
            raise TypeError("blade.optimize: give the keyword inputs either as a dict of "
                            "example_inputs or as example_kwarg_inputs, not both")
        return (), dict(example_inputs)
    if example_inputs is None:
        return (), kwargs
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), kwargs
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs), kwargs
    raise TypeError("blade.optimize: example_inputs must be a tensor, a tuple of the "
                    "model's inputs or a dict of them by argument name, got "
                    f"{type(example_inputs).__name__}")


def _signature_text(arguments) -> str:
    return ", ".join(a.name + (f"={a.default_value!r}" if a.has_default_value() else "")
                     for a in arguments)


def bind_inputs(scripted: torch.jit.ScriptModule, args: Tuple, kwargs: Dict) -> Tuple:
    """The example inputs in the order of forward's arguments, keyword inputs placed by
    name and arguments not given completed with their default values (the types of the
    graph are materialized from a run with exactly these)."""
    arguments = scripted.forward.schema.arguments[1:]  # the module itself first
    names = [a.name for a in arguments]
    signature = f"forward({_signature_text(arguments)})"
    if len(args) > len(arguments):
        raise TypeError(f"blade.optimize: {signature} takes {len(arguments)} inputs, "
                        f"{len(args)} example inputs were given")
    for name in kwargs:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise TypeError(f"blade.optimize: {signature} has no argument '{name}'{hint}")
        if names.index(name) < len(args):
            raise TypeError(f"blade.optimize: forward's argument '{name}' was given twice, "
                            "as a positional and as a keyword example input")
    completed = list(args)
    for arg in arguments[len(args):]:
        if arg.name in kwargs:
            completed.append(kwargs[arg.name])
        elif arg.has_default_value():
            completed.append(arg.default_value)
        else:
            raise TypeError(f"blade.optimize: no example input for forward's argument "
                            f"'{arg.name}' of {signature}, which has no default value")
    return tuple(completed)


def dynamic_dims_by_position(scripted: torch.jit.ScriptModule, config: Config) -> Config:
    """Config.dynamic_dims with the inputs it names by forward's argument names replaced by
    their positions."""
    if not config.dynamic_dims or all(isinstance(k, int) for k in config.dynamic_dims):
        return config
    arguments = scripted.forward.schema.arguments[1:]
    names = [a.name for a in arguments]
    by_position = {}
    for key, dims in config.dynamic_dims.items():
        if isinstance(key, str) and key not in names:
            raise ValueError(f"Config.dynamic_dims names '{key}', which is not an argument of "
                             f"forward({_signature_text(arguments)})")
        by_position[names.index(key) if isinstance(key, str) else key] = list(dims)
    return dataclasses.replace(config, dynamic_dims=by_position)


def keyword_trace_inputs(model: torch.nn.Module, args: Tuple, kwargs: Dict) -> Dict:
    """Positional and keyword example inputs as one dict by forward's parameter names, in
    forward's order, for `torch.jit.trace(example_kwarg_inputs=...)`; arguments left at
    None are left out (tracing takes tensors only), so forward's default applies."""
    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"blade.optimize: the example inputs do not fit "
                        f"{type(model).__name__}.forward: {e}") from None
    parameters = signature.parameters
    variadic = [name for name in bound.arguments
                if parameters[name].kind in (inspect.Parameter.VAR_POSITIONAL,
                                             inspect.Parameter.VAR_KEYWORD)]
    if variadic:
        raise TypeError(f"blade.optimize: tracing with keyword example inputs needs named "
                        f"parameters; {type(model).__name__}.forward takes "
                        f"'{variadic[0]}' as *args/**kwargs")
    return {name: value for name, value in bound.arguments.items() if value is not None}


class ExampleInputsError(RuntimeError):
    """The model raised when it ran on its example inputs: a user's mistake in the model or
    the inputs, told in one error (`torchscript_error` keeps the interpreter's text)."""

    def __init__(self, message: str, torchscript_error: str = ""):
        super().__init__(message)
        self.torchscript_error = torchscript_error


def describe_inputs(inputs, names=()) -> str:
    """`x: float32[2,8]; mask: bool[2,8]` (names where known, values other than tensors by
    their type)."""
    parts = []
    for i, value in enumerate(inputs):
        name = names[i] if i < len(names) else f"input {i}"
        if isinstance(value, torch.Tensor):
            spec = f"{str(value.dtype).replace('torch.', '')}[{','.join(map(str, value.shape))}]"
        else:
            spec = type(value).__name__
        parts.append(f"{name}: {spec}")
    return "; ".join(parts)


def failure_summary(error: BaseException) -> str:
    """An interpreter error in one line: its message, and where in the model it came from
    (`message (at file:line: source)`); a Python error's first line."""
    text = str(error).strip()
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if "Traceback of TorchScript" not in text:
        return lines[0].strip()
    message = lines[-1].strip()
    frames = [i for i, line in enumerate(lines) if line.strip().startswith("File \"")]
    places = [_frame_place(lines, i) for i in dict.fromkeys([frames[0], frames[-1]])] \
        if frames else []
    return message + (f" (at {', called from '.join(reversed(places))})" if places else "")


def _frame_place(lines, index: int) -> str:
    """`file:line: source` of the interpreter frame whose `File "..."` line is at index."""
    where = lines[index].strip()[len("File "):].split(", in ")[0]
    where = where.replace('"', "").replace(", line ", ":")
    end = next((i for i in range(index + 1, len(lines))
                if lines[i].strip().startswith("File \"")), len(lines))
    marked = [i for i in range(index + 1, end) if "<--- HERE" in lines[i]]
    source = lines[marked[0] - 1].strip() if marked and marked[0] - 1 > index else ""
    return f"{where}: {source}" if source else where
