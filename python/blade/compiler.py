"""The compiler driver: `blade.optimize`.

The levels, in order: the model is scripted (or traced; frontend/scripting, or an exported
program's door, frontend/exported_program), its example inputs bound, and it is looked up
in the model cache (blade.model_cache); then the TorchScript-level pipeline
(blade.frontend.pipeline: freeze, simplify, record types, cluster, compile each cluster
into an engine through blade.engines and blade.codegen, guard) makes the optimized module,
and the report is stored on it.
"""
import contextlib
import gc
import inspect
from typing import Any, Dict, Optional, Tuple

import torch

from blade import _C
from blade.codegen.llvm import native
from blade.config import Config
from blade.dump import Dumper, Progress
from blade.frontend import exported_program, pipeline
from blade.frontend.exported_program import is_exported_program
from blade.frontend.inputs import bind_inputs, dynamic_dims_by_position, split_example_inputs
from blade.frontend.scripting import each_method_parsed_once, eval_mode, to_torchscript
from blade.isolation import preserved_random_state
from blade.model_cache import ModelCache
from blade.quiet import quiet_torchscript
from blade.report import REPORT_ATTRIBUTE
from blade.report import report as read_report


def optimize(model, example_inputs=None, config: Config = None, *,
             example_kwarg_inputs: Optional[Dict[str, Any]] = None) -> torch.jit.ScriptModule:
    """Compiles what it can of `model` and returns a ScriptModule computing the same results.

    `model` is an nn.Module (scripted, or traced with `Config(allow_tracing=True)`), a
    ScriptModule, or a `torch.export.ExportedProgram` (whose own example inputs serve when
    none are given; see `blade.frontend.exported_program`). `example_inputs` is a tensor, a tuple
    of forward's inputs, or a dict of them by argument name; `example_kwarg_inputs` adds
    inputs by name to positional ones. The optimized model takes its inputs as forward did,
    by position or by name.

    Example:
        >>> optimized = blade.optimize(model.eval(), (torch.randn(8, 64),))
        >>> optimized = blade.optimize(model, (ids,), example_kwarg_inputs={"mask": mask})
        >>> torch.jit.save(optimized, "model.pt")
    """
    # No side effects: the model runs on private copies of the example inputs, the random
    # generators and the buffers forward writes into are restored on every exit, and a
    # ScriptModule keeps its training flags.
    # TorchScript's deprecation notices are silenced for the whole of it (blade/quiet.py).
    with preserved_random_state(), quiet_torchscript(), _cyclic_collection_paused():
        return _optimize(model, example_inputs, example_kwarg_inputs, config or Config())



@contextlib.contextmanager

def _cyclic_collection_paused():
    """Python's cyclic garbage collector does not run while optimize does. Scripting,
    freezing and graph rewriting make objects by the hundred thousand, each allocation
    counting towards the next collection, so the collector kept walking every object the
    process holds (the model's modules, torch's, MLIR's): a good share of a warm
    optimize (benchmarks/compile_time.py). Reference counting
    still frees what optimize drops; the few cycles it leaves wait for the collector's
    next run after it returns (peak memory unchanged on the benchmark models). Other
    threads of the process are paused from collecting too, for that long."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _optimize(model, example_inputs, example_kwarg_inputs, config: Config):
    args, kwargs = split_example_inputs(example_inputs, example_kwarg_inputs)
    progress = Progress(Progress.wanted(config.progress))
    try:
        return _optimize_with_progress(model, args, kwargs, config, progress)
    finally:
        progress.finish()


def _required_forward_arguments(model) -> int:
    """How many of forward's arguments have no default (one when it cannot be told)."""
    forward = getattr(model, "forward", model)
    schema = getattr(forward, "schema", None)
    if schema is not None:  # a ScriptModule's method
        return sum(1 for a in schema.arguments[1:] if not a.has_default_value())
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return 1
    named = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)
    return sum(1 for p in parameters if p.default is p.empty and p.kind in named)


def _optimize_with_progress(model, args: Tuple, kwargs: Dict, config: Config,
                            progress: Progress) -> torch.jit.ScriptModule:
    if config.precision == "bf16" and \
            "avx512_bf16" not in native.host_cpu_features().split(","):
        raise ValueError("blade.optimize: Config(precision='bf16') runs GEMMs and "
                         "convolutions with avx512_bf16 instructions, which this CPU lacks "
                         f"(it has: {native.host_cpu_features() or 'none of those Blade uses'}); "
                         "use precision='float32'")
    if config.precision == "int8" and _C.int8_weight_limit() == 0:
        raise ValueError("blade.optimize: Config(precision='int8') runs int8 GEMMs with "
                         "VNNI, AVX-VNNI, AMX-INT8 or AVX2 instructions, which this CPU lacks "
                         f"(it has: {native.host_cpu_features() or 'none of those Blade uses'}); "
                         "use precision='float32'")
    models = ModelCache.for_config(config)
    if is_exported_program(model):
        progress.stage("tracing the exported program")
        scripted, args, config = exported_program.to_torchscript(model, args, kwargs, config)
        kwargs = {}
    else:
        if not args and not kwargs and _required_forward_arguments(model) > 0:
            raise TypeError("blade.optimize: example inputs are needed: a tensor, a tuple of "
                            "forward's inputs or a dict of them by argument name")
        progress.stage("tracing" if config.allow_tracing else "scripting")
        models.hash_ahead(model)
        with each_method_parsed_once():
            scripted = to_torchscript(model, args, kwargs, config)
    with eval_mode(scripted):
        inputs = bind_inputs(scripted, args, kwargs)
        config = dynamic_dims_by_position(scripted, config)
        found = models.look_up(scripted, inputs, config)
        if found is not None:
            progress.stage("taken whole from the model cache")
            if config.verbose:
                print(str(read_report(found)))
            return found
        calibration = [bind_inputs(scripted, *split_example_inputs(c, None))
                       for c in config.calibration or [inputs]] \
            if config.precision == "int8" else []
    c = pipeline.GraphCompilation(scripted, inputs, config, progress,
                                  Dumper.for_config(config.dump_dir), calibration)
    optimized = pipeline.run(c, pipeline.build(config))
    optimized._c._register_attribute(REPORT_ATTRIBUTE, torch._C.StringType.get(),
                                     c.report.to_json())
    if config.verbose or c.dump.enabled:
        text = str(read_report(optimized))
        c.dump.text("report.txt", text + "\n")
        if config.verbose:
            print(text)
    models.keep(optimized)
    return optimized
