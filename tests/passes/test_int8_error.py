"""frontend/int8_error.py: each int8 cluster measured against its float twin on the
calibration inputs ("measure_int8_engines"), for the report."""
import pytest
import torch

import blade
from blade.frontend import int8_error
from graph_runner import run_pass
from helpers import assert_ran_compiled
# Its skip without an int8 dot product, and its fixture that quantizes small layers too.
from test_int8_handoffs import blocks, calibration, pytestmark, small_layers_quantized  # noqa: F401


class ThreeLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.fc3 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


def layers_and_calibration():
    torch.manual_seed(0)
    return ThreeLayers().eval(), [(torch.randn(16, 32),) for _ in range(4)]


def test_float_twin_runs_each_int8_op_as_the_float_op_with_the_float_weight():
    model, cal = layers_and_calibration()
    _, _, _, c = run_pass(model, cal[0], "cluster", blade.Config(precision="int8"), cal)
    (cluster,) = c.clusters
    subgraph = cluster.g("Subgraph")
    originals = {w.values.data_ptr(): w.original for w in c.int8.weights.values()}
    twin = int8_error.float_twin(subgraph, originals)
    text = str(twin)
    assert "blade::quantized" not in text and text.count("blade_float_twin::linear(") == 3, text
    function = torch._C._create_function_from_graph("twin", twin)
    x = cal[1][0]
    with torch.no_grad():
        torch.testing.assert_close(function(x), model(x), rtol=1e-6, atol=1e-6)


def test_measure_int8_engines_gives_one_engine_the_whole_model_s_agreement():
    """An engine that takes the model's inputs and gives its outputs: its float twin is the
    float model, so its error is the whole model's."""
    _, _, _, c = run_pass(blocks(), calibration()[0], "measure_int8_engines",
                          blade.Config(precision="int8"), calibration())
    (error,) = c.int8.engines.values()
    # c.int8's agreement: measured by hand_on_uint8 on the graph as it runs.
    assert error["cosine"] == pytest.approx(c.int8.cosine, abs=1e-9)
    assert error["max_abs_error"] == pytest.approx(c.int8.max_abs_error, rel=1e-5)
    assert 0 < error["max_abs_error"] < 0.05 * error["max_abs_value"]


def test_the_report_lists_each_int8_engine_that_compiled():
    """Engines apart (an excluded op between them): each measured on the inputs the int8
    model gives it, so its error is its own."""
    model, cal = layers_and_calibration()
    optimized = blade.optimize(model, cal[0], blade.Config(
        precision="int8", calibration=cal, excluded_ops=["aten::tanh"], min_cluster_size=1))
    report = assert_ran_compiled_after_a_call(optimized, cal[0])
    names = [entry.name for entry in report.clusters if entry.compiled]
    engines = report.int8["engines"]
    assert sorted(engines) == sorted(names) and len(names) == 2, str(report)
    for error in engines.values():
        assert 0.999 < error["cosine"] < 1 and 0 < error["max_abs_error"], engines
    for name in names:
        assert f"{name} vs its float twin on the same inputs: cosine" in str(report)
    # The report survives a save and load (its JSON).
    assert blade.Report.from_json(report.to_json()).int8["engines"] == engines


def assert_ran_compiled_after_a_call(optimized, inputs):
    with torch.no_grad():
        optimized(*inputs)
    return assert_ran_compiled(optimized)


def test_an_engine_whose_twin_cannot_be_made_is_said_not_measured(monkeypatch):
    """A report's figure never stops the compile: the engine compiles, and the report says
    why its error is missing."""
    model, cal = layers_and_calibration()
    monkeypatch.setattr(int8_error, "float_twin", lambda subgraph, weights: None)
    optimized = blade.optimize(model, cal[0], blade.Config(precision="int8", calibration=cal))
    report = assert_ran_compiled_after_a_call(optimized, cal[0])
    assert report.int8["engines"] == {
        "blade_engine_0": {"not_measured": "an int8 layer's weight is not a constant"}}
    assert "blade_engine_0 vs its float twin: not measured: an int8 layer's weight" in \
        str(report)
