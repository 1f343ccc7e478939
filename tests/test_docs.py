"""The code blocks of docs/ and README.md run as written. Per document: its python blocks, in order, as one
script (a real file, because TorchScript reads the source of the classes it scripts), then
its bash blocks, in order, in the same working directory (so they see the files the python
blocks saved), with this environment's `python`, `blade` and `cmake` first on PATH. Blocks
marked `text` are diagrams and output, not code; any other fence is an error. Every
optimized model the python blocks leave behind must have run compiled code."""
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(path: Path):
    return FENCE.findall(path.read_text())


DOCUMENTS = {p.name: p for p in [*DOCS.glob("*.md"), ROOT / "README.md"]}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_code_blocks_run(name, tmp_path, monkeypatch):
    found = blocks(DOCUMENTS[name])
    languages = {language for language, _ in found}
    assert languages <= {"python", "bash", "text"}, f"{name}: fences {languages}"
    python = [code for language, code in found if language == "python"]
    bash = [code for language, code in found if language == "bash"]
    if name != "architecture.md":
        assert python, f"{name} has no python code blocks"

    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if python:
        script = tmp_path / (Path(name).stem + ".py")
        script.write_text("".join(f"# --- {name}, code block {i}\n{code}\n"
                                  for i, code in enumerate(python)))
        namespace = runpy.run_path(str(script), run_name=f"docs_{Path(name).stem}")
        # The examples really compile and run compiled code: every optimized model they
        # leave ran its engines' code at least once, no cluster of it failed to compile,
        # and each document has one.
        models = compiled_path_summary(namespace)
        assert models, f"{name}: its python blocks leave no optimized model"
        for variable, (engines, compiled_calls, dry_run, errors) in models.items():
            assert dry_run or (engines and compiled_calls > 0), \
                f"{name}: `{variable}` has {engines} engines, which ran compiled code " \
                f"{compiled_calls} times"
            assert not errors, f"{name}: `{variable}` failed to compile: {errors}"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    for i, code in enumerate(bash):
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0, f"{name}, bash block {i}:\n{code}\n{run.stdout}\n{run.stderr}"


def compiled_path_summary(namespace):
    """For each optimized model a document's python blocks left in `namespace`: its
    engines, how many of their calls ran compiled code, whether it is a dry run, and its
    compile errors."""
    import torch

    import blade
    from blade.report import REPORT_ATTRIBUTE

    found = {}
    for variable, value in namespace.items():
        if isinstance(value, torch.jit.ScriptModule) and hasattr(value, REPORT_ATTRIBUTE):
            report = blade.report(value)
            found[variable] = (len(report.clusters),
                               sum(c.calls - c.fallbacks for c in report.clusters),
                               report.dry_run, report.compile_errors)
    return found
