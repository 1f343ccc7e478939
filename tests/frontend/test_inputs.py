"""The ways example inputs reach `blade.optimize`: by position, by forward's argument names
(`example_kwarg_inputs`, a dict), and through a `torch.export.ExportedProgram`; and the
messages that name forward's arguments."""
from typing import Optional

import pytest
import torch

import blade
from helpers import assert_every_op_accounted_for, assert_ran_compiled, assert_same_values


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.register_buffer("shift", torch.linspace(-1, 1, 16))

    def forward(self, x, mask: Optional[torch.Tensor] = None, scale: float = 1.0):
        y = torch.relu(self.linear(x)) * scale + self.shift
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return torch.tanh(y)


def _inputs(batch=4):
    torch.manual_seed(batch)
    return torch.randn(batch, 16), torch.rand(batch, 16) > 0.5


@pytest.mark.parametrize("tracing", [False, True], ids=["scripted", "traced"])
def test_keyword_inputs_next_to_positional_ones(tracing):
    model, (x, mask) = Masked().eval(), _inputs()
    optimized = blade.optimize(model, (x,), blade.Config(allow_tracing=tracing),
                               example_kwarg_inputs={"mask": mask})
    with torch.no_grad():
        assert_same_values(optimized(x, mask=mask), model(x, mask=mask))
    report = assert_ran_compiled(optimized)
    # Scripted, an Optional input given a tensor keeps its `is not None` branch, whose
    # engine checks the mask; traced, the guard checks it.
    assert report.guard_inputs == (["x", "mask"] if tracing else ["x"])
    assert "x: float32[4,16]" in str(report)


def test_a_dict_of_example_inputs_by_name():
    model, (x, mask) = Masked().eval(), _inputs()
    optimized = blade.optimize(model, {"mask": mask, "x": x})
    with torch.no_grad():
        assert_same_values(optimized(x=x, mask=mask), model(x, mask=mask))
        assert_same_values(optimized(x, mask), model(x, mask))
    assert_every_op_accounted_for(assert_ran_compiled(optimized))


def test_an_argument_left_out_takes_its_default():
    model, (x, _) = Masked().eval(), _inputs()
    optimized = blade.optimize(model, {"x": x})
    with torch.no_grad():
        assert_same_values(optimized(x), model(x))
    report = assert_ran_compiled(optimized)
    assert "mask: None" in str(report)


def test_a_python_scalar_argument_is_named_as_forward_names_it():
    model, (x, mask) = Masked().eval(), _inputs()
    report = blade.report(blade.optimize(model, {"x": x, "mask": mask, "scale": 2.0}))
    reasons = [r for op in report.unsupported.values() for r in op.reasons]
    assert any("forward's argument 'scale'" in r and "float" in r for r in reasons), reasons
    assert not any("prim::Param" in r for r in reasons), reasons


@pytest.mark.parametrize("given, message", [
    ({"maks": 1}, "forward(x, mask=None, scale=1.0) has no argument 'maks'; did you mean "
                  "'mask'?"),
    ({"x": 1}, "forward's argument 'x' was given twice"),
])
def test_wrong_keyword_inputs_name_forward_arguments(given, message):
    model, (x, _) = Masked().eval(), _inputs()
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        blade.optimize(model, (x,), example_kwarg_inputs=given)


def test_a_missing_input_names_the_argument():
    class TwoInputs(torch.nn.Module):
        def forward(self, query, key):
            return query + key

    with pytest.raises(TypeError, match="no example input for forward's argument 'key' of "
                                        r"forward\(query, key\)"):
        blade.optimize(TwoInputs(), {"query": torch.randn(2)})


def test_both_a_dict_and_keyword_inputs_is_an_error():
    model, (x, mask) = Masked().eval(), _inputs()
    with pytest.raises(TypeError, match="either as a dict of example_inputs or as "
                                        "example_kwarg_inputs"):
        blade.optimize(model, {"x": x}, example_kwarg_inputs={"mask": mask})


def test_guard_fallback_reason_names_the_argument():
    model, (x, mask) = Masked().eval(), _inputs()
    optimized = blade.optimize(model, (x,), example_kwarg_inputs={"mask": mask})
    other_x, other_mask = _inputs(batch=3)
    with torch.no_grad():
        assert_same_values(optimized(other_x, mask=other_mask), model(other_x, mask=other_mask))
    text = str(blade.report(optimized))
    assert "last: input 0 ('x'): size of dim 0 is 3, expected 4" in text, text


def test_dynamic_dims_by_argument_name():
    model, (x, mask) = Masked().eval(), _inputs()
    optimized = blade.optimize(model, (x,), blade.Config(dynamic_dims={"x": [0], "mask": [0]}),
                               example_kwarg_inputs={"mask": mask})
    other_x, other_mask = _inputs(batch=7)
    with torch.no_grad():
        assert_same_values(optimized(other_x, mask=other_mask), model(other_x, mask=other_mask))
    report = assert_ran_compiled(optimized)
    assert "input 0 ('x') dim 0" in str(report)
    with pytest.raises(ValueError, match="Config.dynamic_dims names 'y', which is not an "
                                         "argument of forward"):
        blade.optimize(model, (x,), blade.Config(dynamic_dims={"y": [0]}))


def test_an_exported_program_with_its_own_example_inputs():
    model, (x, mask) = Masked().eval(), _inputs()
    program = torch.export.export(model, (x,), {"mask": mask})
    optimized = blade.optimize(program)
    with torch.no_grad():
        assert_same_values(optimized(x, mask=mask), model(x, mask=mask))
    report = assert_ran_compiled(optimized)
    assert report.guard_inputs == ["x", "mask"]
    assert_every_op_accounted_for(report)


def test_an_exported_program_keeps_its_dynamic_dims(tmp_path):
    model, (x, mask) = Masked().eval(), _inputs()
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (x,), {"mask": mask},
                                  dynamic_shapes={"x": {0: batch}, "mask": {0: batch}})
    optimized = blade.optimize(program, (x,), example_kwarg_inputs={"mask": mask})
    path = tmp_path / "exported.pt"
    torch.jit.save(optimized, str(path))
    loaded = torch.jit.load(str(path))
    for batch_size in (2, 9):
        other_x, other_mask = _inputs(batch_size)
        with torch.no_grad():
            assert_same_values(loaded(other_x, mask=other_mask),
                               model(other_x, mask=other_mask))
    report = assert_ran_compiled(loaded)
    assert report.dynamic_dims == [["input 0 ('x') dim 0", "input 1 ('mask') dim 0"]]


def test_an_exported_program_with_other_input_layout_is_refused():
    model, (x, mask) = Masked().eval(), _inputs()
    program = torch.export.export(model, (x,), {"mask": mask})
    with pytest.raises(TypeError, match="not laid out as the ExportedProgram's inputs "
                                        r"\(x, mask\)"):
        blade.optimize(program, (x, mask))


def test_no_example_inputs_for_a_module_is_an_error():
    with pytest.raises(TypeError, match="example inputs are needed"):
        blade.optimize(Masked().eval())


class TakesEight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, mask):
        return self.fc(x) * mask


def test_a_model_that_raises_on_its_example_inputs_is_one_clear_error():
    with pytest.raises(blade.ExampleInputsError) as caught:
        blade.optimize(TakesEight().eval(), (torch.randn(2, 5), torch.ones(2, 4)))
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    # The inputs by name, eager's message, the op's line and the model's line that called it.
    assert "example inputs (x: float32[2,5]; mask: float32[2,4])" in message
    assert "mat1 and mat2 shapes cannot be multiplied (2x5 and 8x4)" in message
    assert "F.linear(input, self.weight, self.bias), called from" in message
    assert "test_inputs.py" in message and "return self.fc(x) * mask" in message
    assert "blade_materialize_types" not in message
    assert "Traceback of TorchScript" in caught.value.torchscript_error
    assert isinstance(caught.value, RuntimeError)
