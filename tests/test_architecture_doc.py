"""docs/architecture.md lists both pipelines as the code builds them: the TorchScript-level
passes (blade.frontend.pipeline) and Blade's own codegen passes (blade.codegen.pipeline),
every one named, in the code's order."""
import re
from pathlib import Path

import blade
from blade.codegen import pipeline as codegen_pipeline
from blade.frontend import pipeline as graph_pipeline

DOC = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
DIAGRAMS = re.findall(r"^```text\n(.*?)^```", DOC, re.DOTALL | re.MULTILINE)


def positions(names, text):
    """Where each name first appears in `text` as a whole word (-1: nowhere)."""
    found = []
    for name in names:
        match = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
        found.append(match.start() if match else -1)
    return found


def test_the_graph_pipeline_is_listed_in_order():
    names = [p.name for p in graph_pipeline.build(blade.Config(dynamic=True, precision="int8"))]
    diagram = next(d for d in DIAGRAMS if "freeze · detach_inlined_functions" in d)
    where = positions(names, diagram)
    assert -1 not in where, [n for n, w in zip(names, where) if w < 0]
    assert where == sorted(where), names


def test_blade_s_codegen_passes_are_listed_in_order():
    every_option = codegen_pipeline.Options(num_buffers=0, user_calls=("a call",))
    names = [p.name for p in codegen_pipeline.build(every_option) if not p.upstream]
    diagram = next(d for d in DIAGRAMS if "signless-boundaries" in d)
    where = positions(names, diagram)
    assert -1 not in where, [n for n, w in zip(names, where) if w < 0]
    assert where == sorted(where), [n for n, w in sorted(zip(names, where), key=lambda t: t[1])]
