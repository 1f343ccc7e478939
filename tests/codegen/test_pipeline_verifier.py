"""codegen/pipeline.run verifies the module before each MLIR pass that follows Blade's
passes (and after the last pass), so MLIR's C++ passes never get IR that one of Blade's
broke; with a dump directory, after every pass."""
import pytest
from torch_mlir import ir
from torch_mlir.dialects import arith

from blade.codegen import driver, pipeline
from blade.codegen.errors import CodegenError

MODULE = """
func.func @main(%a: f32) -> f32 {
  %b = arith.addf %a, %a : f32
  return %b : f32
}
"""


def _break_types(compilation):
    """A Blade-style pass that leaves invalid IR: the function returns an i32."""
    function = compilation.module.body.operations[0]
    block = function.regions[0].blocks[0]
    ret = block.operations[len(block.operations) - 1]
    with ir.InsertionPoint(ret):
        wrong = arith.ConstantOp(ir.IntegerType.get_signless(32), 7).result
    ret.operands[0] = wrong


def _run(steps, dump_dir=None):
    driver.register_passes()
    with ir.Context() as context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        module = ir.Module.parse(MODULE)
        compilation = pipeline.Compilation(module, pipeline.Options(num_buffers=0))
        return pipeline.run(compilation, steps, dump_dir)


def test_a_blade_pass_that_breaks_the_ir_is_named_before_an_mlir_pass_runs():
    ran = []
    after = pipeline.Pass("after", lambda c: ran.append("after"))
    steps = [pipeline.Pass("break-types", _break_types), *pipeline._upstream_passes("cse"),
             after]
    with pytest.raises(CodegenError, match="pass break-types left invalid IR"):
        _run(steps)
    assert not ran


def test_consecutive_blade_passes_are_verified_together_and_all_named():
    ran = []
    steps = [pipeline.Pass("break-types", _break_types),
             pipeline.Pass("after", lambda c: ran.append("after")),
             *pipeline._upstream_passes("cse"),
             pipeline.Pass("never", lambda c: ran.append("never"))]
    with pytest.raises(CodegenError,
                       match="one of the passes break-types, after .*left invalid IR"):
        _run(steps)
    assert ran == ["after"]


def test_a_dump_directory_names_the_one_pass(tmp_path):
    steps = [pipeline.Pass("break-types", _break_types), pipeline.Pass("after", lambda c: None)]
    with pytest.raises(CodegenError, match="pass break-types left invalid IR"):
        _run(steps, tmp_path)


def test_what_mlir_passes_left_is_verified_at_the_end():
    # The breaking pass is marked as MLIR's: only the final verification sees it.
    steps = [pipeline.Pass("canonicalize", _break_types, upstream=True)]
    with pytest.raises(CodegenError, match="pass canonicalize left invalid IR"):
        _run(steps)


def test_valid_ir_runs_every_pass(tmp_path):
    steps = [pipeline.Pass("nothing", lambda c: None), *pipeline._upstream_passes("cse")]
    assert set(_run(steps)) == {"00_nothing", "01_cse"}
    assert set(_run(steps, tmp_path)) == {"00_nothing", "01_cse"}
