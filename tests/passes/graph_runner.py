"""One pass of the TorchScript-level pipeline (blade.frontend.pipeline) on a small model, as
tests/ir_runner.py does for the codegen pipeline:

    before, result, after, c = run_pass(model, (x,), "fold_tensor_attributes")

runs the pipeline's passes for `config` in order up to the one named, and returns the graph
before it and after it (printed), what the pass returned and the GraphCompilation (the
report, the unspecialized graph, ... as the passes left them)."""
from typing import Any, Optional, Tuple

import torch

from blade.config import Config
from blade.dump import Dumper, Progress
from blade.frontend import pipeline
from blade.frontend.inputs import bind_inputs
from blade.quiet import quiet_torchscript


def run_pass(model, inputs: Tuple, name: str, config: Optional[Config] = None,
             calibration: Tuple = ()) -> Tuple[str, Any, str, pipeline.GraphCompilation]:
    config = config or Config()
    with quiet_torchscript():
        scripted = model if isinstance(model, torch.jit.ScriptModule) else \
            torch.jit.script(model.eval())
        bound = bind_inputs(scripted, tuple(inputs), {})
        passes = pipeline.build(config)
        names = [p.name for p in passes]
        assert name in names, f"the pipeline has no pass named {name!r} for this Config"
        index = names.index(name)
        c = pipeline.GraphCompilation(scripted, bound, config, Progress(False), Dumper(None),
                                      calibration or [bound])
        pipeline.run(c, passes[:index])
        before = str(c.graph) if c.module is not None else str(scripted.graph)
        result = passes[index].run(c)
        return before, result, str(c.graph), c
