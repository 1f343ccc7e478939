"""The model as TorchScript: scripted (each method's source parsed once for all instances
of its class) or traced with the example inputs, in eval mode."""
import contextlib
import warnings
from typing import Dict, Tuple

import torch

from blade.config import Config
from blade.frontend.inputs import keyword_trace_inputs
from blade.isolation import private_copy
from blade.frontend import quant_fusion


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def each_method_parsed_once():
    """While `torch.jit.script` runs, each method's source is parsed once, and each
    method's overloads are looked up once per class. Scripting parses the methods of every
    module instance again (torch.jit._recursive.make_stub, called for every submodule even
    when its class is compiled already): 152 parses for 12 encoder layers, 190 for a
    ResNet-50, about a third of scripting's time. And it asks for the overloads of every
    callable attribute of every instance's class (get_overload_annotations: 22,000 lookups,
    each naming the function's module and qualified name, for a ResNet-50's 144 modules,
    a fifth of scripting's time). The parse of a function under one name and `self` type
    is the same for every instance, as are a function's overloads in one class, so one
    serves all, for the length of this block only (an edited source is parsed again on the
    next optimize)."""
    recursive, internal = torch.jit._recursive, torch._jit_internal
    parse = getattr(recursive, "get_jit_def", None)
    overloads_of = getattr(internal, "_get_overloaded_methods", None)
    if parse is None or overloads_of is None:  # another torch: scripting as it is
        yield
        return
    parsed, overloads = {}, {}

    def get_jit_def(fn, def_name, self_name=None, is_classmethod=False):
        key = (getattr(fn, "__func__", fn), def_name, self_name, is_classmethod)
        if key not in parsed:
            parsed[key] = parse(fn, def_name, self_name=self_name,
                                is_classmethod=is_classmethod)
        return parsed[key]

    def get_overloaded_methods(method, mod_class):
        key = (getattr(method, "__func__", method), mod_class)
        try:
            if key not in overloads:
                overloads[key] = overloads_of(method, mod_class)
            return overloads[key]
        except TypeError:  # an attribute that cannot be a key: looked up as it is
            return overloads_of(method, mod_class)

    recursive.get_jit_def = get_jit_def
    internal._get_overloaded_methods = get_overloaded_methods
    try:
        yield
    finally:
        recursive.get_jit_def = parse
        internal._get_overloaded_methods = overloads_of


def is_exported_module(model) -> bool:
    """A module torch.export made (`ExportedProgram.module()`, and what PT2E's
    `convert_pt2e` returns from one): an fx GraphModule with export's input spec, which
    refuses train() and eval() (export fixed its mode)."""
    return isinstance(model, torch.fx.GraphModule) and hasattr(model, "_in_spec")


def trace_exported(module, args: Tuple, kwargs: Dict = None) -> torch.jit.ScriptModule:
    """An exported module traced (its graph has no Python control flow), then its PT2E
    quantization fused into Blade's int8 layers (blade.frontend.quant_fusion)."""

    with torch.no_grad(), warnings.catch_warnings():
        # It checks its inputs against export's constraints in Python, which the tracer
        # warns about.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if kwargs:
            traced = torch.jit.trace(module, example_kwarg_inputs=private_copy(
                keyword_trace_inputs(module, args, kwargs)), check_trace=False)
        else:
            traced = torch.jit.trace(module, private_copy(tuple(args)), check_trace=False)
    graph = traced.graph
    torch._C._jit_pass_inline(graph)  # a wrapper's call of the exported module too
    if quant_fusion.has_quantized_ops(graph):
        quant_fusion.fuse(traced, graph)
        quant_fusion.lower(graph)
    return traced


def to_torchscript(model, args: Tuple, kwargs: Dict,
                    config: Config) -> torch.jit.ScriptModule:
    if isinstance(model, torch.jit.ScriptModule):
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError("blade.optimize: model must be a torch.nn.Module or a "
                        f"torch.jit.ScriptModule, got {type(model).__name__}")
    if is_exported_module(model):
        return trace_exported(model, args, kwargs)
    with eval_mode(model):
        if config.allow_tracing:
            return _trace(model, args, kwargs)
        try:
            scripted = torch.jit.script(model)
        except Exception as e:
            raise RuntimeError(
                f"blade.optimize: TorchScript could not script {type(model).__name__}: {e}\n"
                "Make the model scriptable, or pass Config(allow_tracing=True) to trace it "
                "with the example inputs instead.") from e
        if "forward" in scripted._c._method_names():
            return scripted
        # An overloaded forward (nn.LSTM, nn.GRU, nn.RNN: one per input kind) scripts as
        # forward__0, forward__1, ... and no forward: the example inputs pick the one traced.
        overloads = sorted(n for n in scripted._c._method_names() if n.startswith("forward__"))
        warnings.warn(
            f"blade.optimize: {type(model).__name__}'s forward is overloaded in TorchScript "
            f"({', '.join(overloads) or 'no forward'}), so it is traced with the example "
            "inputs; wrap it in a module whose forward calls it to script it instead",
            UserWarning, stacklevel=4)
        return _trace(model, args, kwargs)


def _trace(model, args: Tuple, kwargs: Dict) -> torch.jit.ScriptModule:
    """`model` traced with copies of the example inputs (keyword ones by name)."""
    if kwargs:
        return torch.jit.trace(
            model, example_kwarg_inputs=private_copy(keyword_trace_inputs(model, args, kwargs)),
            check_trace=False)
    return torch.jit.trace(model, private_copy(args), check_trace=False)
