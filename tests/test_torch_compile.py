"""torch.compile(model, backend="blade"): each graph Dynamo hands over is compiled by Blade
(python/blade/torch_compile.py), gives eager's results and runs its engines."""
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import blade
from helpers import GeluMlp, assert_ran_compiled, bench_module

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graph_indices():
    return {g.index for g in blade.dynamo_graphs()}


def new_graphs(before):
    """The graphs compiled since `before` (earlier tests' may still be alive)."""
    return [g for g in blade.dynamo_graphs() if g.index not in before]


def compile_and_check(model, inputs, options=None, rtol=1e-5, atol=1e-5, graphs=1):
    """Compiles `model` with the "blade" backend, calls it twice under no_grad, compares
    with eager and checks that each of Dynamo's graphs ran Blade's engines. Returns them."""
    model = model.eval()
    compiled = torch.compile(model, backend="blade", options=options)
    before = graph_indices()
    with torch.no_grad():
        expected = model(*inputs)
        for _ in range(2):
            torch.testing.assert_close(compiled(*inputs), expected, rtol=rtol, atol=atol)
    new = new_graphs(before)
    assert len(new) == graphs, new
    for graph in new:
        assert graph.eager_reason is None and graph.eager_calls == 0, graph
        assert len(graph.modules) == 1, graph
        report = assert_ran_compiled(graph.modules[0])
        assert report.clusters[0].calls == 2, str(report)
    return new


def test_mlp():
    (graph,) = compile_and_check(GeluMlp(), (torch.randn(8, 32),), rtol=1e-4, atol=1e-4)
    report = graph.report()
    # Dynamo passes the weights as inputs; they are frozen in, so engines take x alone.
    assert report.clusters[0].inputs == "float32[8,32]", str(report)
    assert report.clusters[0].library_calls == 2, str(report)


def test_conv_net():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    compile_and_check(model, (torch.randn(2, 3, 16, 16),), rtol=1e-4, atol=1e-4)


def test_transformer_encoder_layer():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    compile_and_check(layer, (torch.randn(2, 8, 32),), rtol=1e-4, atol=1e-4)


def _benchmark_workload(name):
    return bench_module("workloads").build(name)


@pytest.mark.parametrize("name", ["ew_chain", "ln_gelu", "softmax_attn", "mlp", "bert_layer",
                                  "convnet"])
def test_benchmark_workloads(name):
    """`make bench`'s workloads through torch.compile: eager's results, engines ran."""
    model, inputs = _benchmark_workload(name)
    compile_and_check(model, inputs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["bert_layer", "gpt_block", "resnet_block", "mlp"])
def test_model_zoo(name):
    """tests/models' models through torch.compile, as test_models runs them through
    blade.optimize."""
    from models.test_models import cases

    model, inputs = cases()[name]
    (graph,) = compile_and_check(model, inputs, rtol=1e-4, atol=1e-4)
    report = graph.report()
    assert report.coverage == 1.0 and not report.unsupported, str(report)


def test_other_sizes_give_a_dynamic_graph_blade_compiles_dynamic():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
    compiled = torch.compile(layer, backend="blade")
    before = graph_indices()
    with torch.no_grad():
        for tokens in (8, 12, 5, 12):
            x = torch.randn(2, tokens, 32)
            torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-4)
    static, dynamic = new_graphs(before)    # Dynamo recompiled once, with symbolic sizes
    report = assert_ran_compiled(dynamic.modules[0])
    # Blade finds the dims that may vary itself: the batch too, which Dynamo left static.
    assert report.clusters[0].inputs == "float32[s0,s1,32]", str(report)
    assert report.clusters[0].calls == 3, str(report)
    assert static.report().clusters[0].calls == 1


def test_what_dynamos_example_cannot_tell_is_in_the_report_not_a_warning():
    """Dynamo, not the user, chose the example: the batch of one that the dynamic graph
    keeps static is said in its report, not in a warning whose fix is another example."""
    model = GeluMlp().eval()
    compiled = torch.compile(model, backend="blade")
    before = graph_indices()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tokens in (8, 12, 5):
            x = torch.randn(1, tokens, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert not [w for w in caught if w.category is blade.DynamicShapesWarning]
    static, dynamic = new_graphs(before)
    report = assert_ran_compiled(dynamic.modules[0])
    assert report.guard_specs == "float32[1,s0,32]", str(report)
    assert any("dim 0 has size 1" in note for note in report.dynamic_notes), str(report)


class TensorLiterals(torch.nn.Module):
    def forward(self, x):
        return x * torch.tensor([0.5, 2.0]) + torch.tensor([], dtype=torch.float32).sum()


def test_tensor_literals_trace_without_warnings_and_computed_ones_would_warn():
    """torch.tensor of literals (Hugging Face's empty tensors) is a constant, so tracing's
    warning about it is not said; a graph whose torch.tensor takes a value it computes
    keeps the warning."""
    from blade.torch_compile import _tensor_literals_only

    literals = torch.compile(TensorLiterals().eval(), backend="blade")
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(literals(torch.randn(3, 2)) * 0, torch.zeros(3, 2))
    assert not [w for w in caught if "registered as constants" in str(w.message)]
    for computed in (False, True):   # torch.tensor([0.5, 2.0]), torch.tensor(x.size(0))
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        value = graph.call_method("size", (x, 0)) if computed else [0.5, 2.0]
        graph.output(graph.call_function(torch.tensor, (value,)))
        module = torch.fx.GraphModule(torch.nn.Module(), graph)
        assert _tensor_literals_only(module) != computed, graph


class Printing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        print("between the layers")   # a graph break: Dynamo makes two graphs
        return torch.tanh(self.fc2(h))


def test_graph_break_gives_two_graphs_both_compiled(capsys):
    compile_and_check(Printing(), (torch.randn(4, 16),), rtol=1e-4, atol=1e-4, graphs=2)
    assert "between the layers" in capsys.readouterr().out


def test_options_are_config_fields():
    model = GeluMlp()
    (graph,) = compile_and_check(model, (torch.randn(8, 32),), rtol=1e-4, atol=1e-4,
                                 options={"excluded_ops": ["aten::gelu"]})
    report = graph.report()
    assert "aten::gelu" in report.unsupported, str(report)
    assert "aten::gelu" not in report.clusters[0].ops, str(report)


def test_a_wrong_option_name_is_a_clear_error():
    compiled = torch.compile(GeluMlp().eval(), backend="blade", options={"min_cluster_sise": 2})
    with pytest.raises(Exception, match="'min_cluster_sise' is not a blade.Config field; "
                                        "the fields are .*min_cluster_size"):
        with torch.no_grad():
            compiled(torch.randn(8, 32))


def test_grad_mode_with_parameters_runs_eagerly():
    model = GeluMlp().eval()
    x = torch.randn(8, 32)
    compiled = torch.compile(model, backend="blade")
    before = graph_indices()
    with pytest.warns(UserWarning, match="requires grad under grad mode"):
        y = compiled(x)
    torch.testing.assert_close(y, model(x))
    y.sum().backward()                      # eager's autograd, as without torch.compile
    assert model.fc1.weight.grad is not None
    (graph,) = new_graphs(before)
    assert not graph.modules and "requires grad" in graph.eager_reason


def test_other_instance_and_weights_written_in_place():
    first, second = GeluMlp().eval(), GeluMlp().eval()
    x = torch.randn(8, 32)
    compiled_first = torch.compile(first, backend="blade")
    compiled_second = torch.compile(second, backend="blade")
    before = graph_indices()
    with torch.no_grad():
        torch.testing.assert_close(compiled_first(x), first(x), rtol=1e-4, atol=1e-4)
        # Dynamo shares its graph between instances: Blade compiles it for their weights.
        torch.testing.assert_close(compiled_second(x), second(x), rtol=1e-4, atol=1e-4)
        first.fc1.weight.add_(1.0)
        torch.testing.assert_close(compiled_first(x), first(x), rtol=1e-4, atol=1e-4)
    (graph,) = new_graphs(before)
    assert len(graph.modules) == 2 and graph.eager_calls == 0, graph


def test_import_blade_stays_cheap_and_the_entry_point_finds_blade(tmp_path):
    # An installed Blade declares the backend in the torch_dynamo_backends entry-point
    # group (setup.py); a dist-info of its own on the path stands in for the installation.
    assert '"torch_dynamo_backends": ["blade=blade.torch_compile:blade_backend"]' in \
        (ROOT / "setup.py").read_text()
    dist = tmp_path / "blade_backend_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: blade-backend-probe\n"
                                   "Version: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\nblade = blade.torch_compile:blade_backend\n")
    script = textwrap.dedent("""
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        x = torch.randn(2, 8)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(model, backend="blade")(x), model(x))
        import blade
        assert [len(g.modules) for g in blade.dynamo_graphs()] == [1]
        assert blade.dynamo_reports()[0].clusters[0].calls == 1
    """)
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'python'}{os.pathsep}{tmp_path}")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    cheap = subprocess.run([sys.executable, "-c", (
        "import sys, blade; loaded = [m for m in ('torch._dynamo', 'blade.compiler', "
        "'torch_mlir') if m in sys.modules]; assert not loaded, loaded")],
        env=env, capture_output=True, text=True)
    assert cheap.returncode == 0, cheap.stderr


def test_an_int_dynamo_made_dynamic_runs_eagerly_with_the_reason():
    def scale(x, n):
        return torch.relu(x) * n

    compiled = torch.compile(scale, backend="blade")
    x = torch.randn(4, 8)
    before = graph_indices()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, 2), scale(x, 2))
        with pytest.warns(UserWarning, match="sizes Dynamo made dynamic that measure no tensor"):
            torch.testing.assert_close(compiled(x, 3), scale(x, 3))
    first, second = new_graphs(before)
    assert first.modules and first.eager_reason is None
    assert not second.modules and "dynamic=False" in second.eager_reason


class BreaksOnce(torch.nn.Module):
    def forward(self, x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        return torch.sigmoid(y) + 1


def test_each_graph_names_the_line_it_starts_at():
    graphs = compile_and_check(BreaksOnce(), (torch.randn(4, 8),), graphs=2)
    # A graph break splits forward in two: each graph says where its code starts.
    origins = [graph.origin for graph in graphs]
    assert origins[0].startswith("test_torch_compile.py:") and origins[0].endswith(" in forward")
    assert origins[0] != origins[1] and all(o in repr(g) for o, g in zip(origins, graphs))


class CacheWriter(torch.nn.Module):
    """A KV cache in the style of Hugging Face's static cache: positions from a length
    counter, the counter advanced in place, the rows written into the cache in place."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, length, cache):
        rows = self.proj(x)
        positions = torch.arange(rows.shape[1]) + length
        length.add_(rows.shape[1])
        cache.index_copy_(1, positions, rows)
        return cache * 2


def test_compiling_does_not_write_the_calls_own_tensors():
    """Dynamo's example inputs are the call's tensors: tracing and optimizing them must not
    run the graph's in-place writes on them (the counter would advance twice)."""
    model = CacheWriter().eval()
    compiled = torch.compile(model, backend="blade")
    before = graph_indices()
    state = {"eager": (torch.tensor(0), torch.zeros(1, 40, 8)),
             "blade": (torch.tensor(0), torch.zeros(1, 40, 8))}
    with torch.no_grad():
        for tokens in (16, 1, 1, 1):    # a prompt, then one token at a time
            x = torch.randn(1, tokens, 8)
            expected = model(x, *state["eager"])
            actual = compiled(x, *state["blade"])
            assert state["blade"][0].item() == state["eager"][0].item()
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(state["blade"][1], state["eager"][1], rtol=1e-5, atol=1e-5)
    for graph in new_graphs(before):
        assert_ran_compiled(graph.modules[0])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_hugging_face_generate_gives_eagers_tokens(cache):
    """Greedy generation of a small Llama-architecture model (random weights, built from its
    config) through backend="blade", with Hugging Face's default cache and its static
    cache (what it recommends for compiled generation)."""
    import transformers   # a test requirement (requirements.txt)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=500, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    if cache == "static":
        model.generation_config.cache_implementation = "static"
    prompt = torch.randint(0, 500, (1, 12))

    def generate():
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)

    expected = generate()
    before = graph_indices()
    model.forward = torch.compile(model.forward, backend="blade")
    assert torch.equal(generate(), expected)
    graphs = new_graphs(before)
    assert graphs and all(g.eager_reason is None for g in graphs), graphs
    for graph in graphs:
        assert_ran_compiled(graph.modules[0])


class CountingCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.tensor(0))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.calls.add_(1)
        return self.proj(x) * self.calls


def test_a_buffer_the_graph_writes_is_passed_not_frozen():
    """Frozen, the counter would be a constant: each call would see the value it had at
    compile time, and writes in place would make every call compile again."""
    model, twin = CountingCalls().eval(), CountingCalls().eval()
    twin.load_state_dict(model.state_dict())
    compiled = torch.compile(twin, backend="blade")
    before = graph_indices()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
            assert twin.calls.item() == model.calls.item()
    (graph,) = new_graphs(before)
    assert len(graph.modules) == 1 and graph.eager_calls == 0, graph
    assert_ran_compiled(graph.modules[0])
