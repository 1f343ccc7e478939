"""The docs' code blocks run as written: each document's blocks, in order, as one script
(a real file, because TorchScript reads the source of the classes it scripts)."""
import re
import runpy
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(path: Path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.DOTALL)


@pytest.mark.parametrize("name", ["adding_a_converter.md"])
def test_code_blocks_run(name, tmp_path):
    blocks = python_blocks(DOCS / name)
    assert blocks, f"{name} has no python code blocks"
    script = tmp_path / (Path(name).stem + ".py")
    script.write_text("".join(f"# --- {name}, code block {i}\n{block}\n"
                              for i, block in enumerate(blocks)))
    runpy.run_path(str(script), run_name=f"docs_{Path(name).stem}")
