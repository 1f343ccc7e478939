"""The pipeline's inline-user-converters pass (blade.partition.user_converters) with a
converter that fails: the error names the node. mlir/stablehlo/inline-user-converters.mlir
checks the body a converter builds, inlined."""
import runpy

import pytest

from blade.codegen.errors import CodegenError
from ir_runner import MLIR, run_pass

CASE = MLIR / "stablehlo" / "inline-user-converters.mlir"


def test_a_converter_that_fails_is_reported_with_its_node():
    def broken(ctx):
        raise ValueError("broken on purpose")

    user_call = runpy.run_path(str(CASE.with_suffix(".py")))["user_call"]
    with pytest.raises(CodegenError, match="broken on purpose") as failure:
        run_pass(CASE.read_text(), "inline-user-converters", user_calls=(user_call(broken),))
    assert failure.value.node_index == 0
