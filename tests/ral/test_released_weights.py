"""Each weight held once after loading: an engine of a loaded model that reads a weight only
through its oneDNN copy gives the plain weight's memory back (csrc/ral/prepared_weights.h)
and puts the values back, exactly, before anything reads them as they are (the subgraph, a
save, `params()`); the optimized module keeps no attribute that only an engine reads; and
the code frees each intermediate buffer after its last use."""
import pytest
import torch

import blade
from blade import _C
from helpers import assert_same


@pytest.fixture
def onednn_kernels():
    """oneDNN's kernel for every GEMM (no trial against MKL's sgemm, whose winner depends
    on the CPU): what the engine releases is then the same everywhere."""
    _C.set_kernel_trials(False)
    yield
    _C.set_kernel_trials(True)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 512)
        self.down = torch.nn.Linear(512, 256)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def saved_and_loaded(model, inputs, tmp_path):
    optimized = blade.optimize(model, inputs, blade.Config(cache_dir="off"))
    path = tmp_path / "model.pt"
    torch.jit.save(optimized, str(path))
    return torch.jit.load(str(path))


def loaded_mlp(tmp_path, calls: int):
    """(model, input, the optimized model saved and loaded, its engine) after `calls`."""
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(64, 256)
    loaded = saved_and_loaded(model, (x,), tmp_path)
    (engine,) = engines(loaded)
    with torch.no_grad():
        for _ in range(calls):
            assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-5)
    return model, x, loaded, engine


def engines(module):
    report = blade.report(module)
    assert report.clusters and all(c.compiled for c in report.clusters), str(report)
    return [module._c.getattr(c.name) for c in report.clusters]


def weight_bytes(*weights):
    return sum(w.numel() * w.element_size() for w in weights)


def test_a_loaded_engine_gives_its_weights_back_and_restores_them(tmp_path, onednn_kernels):
    model, x, loaded, engine = loaded_mlp(tmp_path, 1)
    assert engine.released_bytes() > 0
    with torch.no_grad():
        expected = model(x)
        for _ in range(3):
            assert_same(loaded(x), expected, rtol=1e-4, atol=1e-5)
    # Both weights read only through their copies: all their whole pages given back.
    released = engine.released_bytes()
    both = weight_bytes(model.up.weight, model.down.weight)
    assert both - 4 * 4096 <= released <= both
    # Saving puts the values back first, bit for bit.
    torch.jit.save(loaded, str(tmp_path / "again.pt"))
    assert engine.released_bytes() == 0
    saved = torch.jit.load(str(tmp_path / "again.pt"))
    params = engines(saved)[0].params()
    for weight in (model.up.weight, model.down.weight):
        assert any(torch.equal(p, weight) for p in params if p.shape == weight.shape)
    with torch.no_grad():
        assert_same(saved(x), expected, rtol=1e-4, atol=1e-5)
        assert_same(loaded(x), expected, rtol=1e-4, atol=1e-5)
    assert blade.report(loaded).runtime_fallbacks == 0


def test_a_fallback_after_the_release_reads_the_restored_weights(tmp_path, onednn_kernels):
    model, x, loaded, engine = loaded_mlp(tmp_path, 2)
    assert engine.released_bytes() > 0
    # An input that requires grad, under grad mode: the engine runs its subgraph.
    wants_grad = x.clone().requires_grad_()
    assert_same(loaded(wants_grad), model(x), rtol=1e-4, atol=1e-5)
    assert engine.fallbacks() == 1 and engine.released_bytes() == 0
    with torch.no_grad():
        assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-5)
    assert engine.released_bytes() == 0  # once read as they are, kept


def test_the_unspecialized_model_reads_the_restored_weights(tmp_path, onednn_kernels):
    model, x, loaded, engine = loaded_mlp(tmp_path, 2)
    assert engine.released_bytes() > 0
    with torch.no_grad():
        other = torch.randn(5, 256)  # not the guard's signature: the unspecialized model
        assert_same(loaded(other), model(other), rtol=1e-4, atol=1e-5)
        assert blade.report(loaded).guard_fallbacks == 1
        assert engine.released_bytes() == 0  # it read both weights (Engine.param)
        assert_same(loaded(x), model(x), rtol=1e-4, atol=1e-5)


def test_params_read_as_they_are_are_restored(tmp_path, onednn_kernels):
    model, _, _, engine = loaded_mlp(tmp_path, 1)
    assert engine.released_bytes() > 0
    params = engine.params()
    assert engine.released_bytes() == 0
    for weight in (model.up.weight, model.down.weight):
        assert any(torch.equal(p, weight) for p in params if p.shape == weight.shape)


class Tied(torch.nn.Module):
    """The head's weight is the embedding's, which the code reads itself (a gather)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(256, 256)
        self.mix = torch.nn.Linear(256, 256)
        self.head = torch.nn.Linear(256, 256, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x, tokens):
        return self.head(torch.relu(self.mix(x))) + self.embed(tokens)


def test_a_weight_the_code_reads_itself_is_kept(tmp_path, onednn_kernels):
    torch.manual_seed(0)
    model = Tied().eval()
    inputs = (torch.randn(32, 256), torch.randint(0, 256, (32,)))
    loaded = saved_and_loaded(model, inputs, tmp_path)
    (engine,) = engines(loaded)
    with torch.no_grad():
        expected = model(*inputs)
        for _ in range(3):
            assert_same(loaded(*inputs), expected, rtol=1e-4, atol=1e-5)
    # Only mix's weight: the tied one is also the embedding table the code gathers from.
    assert 0 < engine.released_bytes() <= weight_bytes(model.mix.weight)


def test_the_optimizing_process_keeps_the_users_weights(onednn_kernels):
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(64, 256)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    (engine,) = engines(optimized)
    with torch.no_grad():
        for _ in range(3):
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    assert engine.released_bytes() == 0  # the user's module holds the same tensors


def test_attributes_only_engines_read_are_removed():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 8, 64)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    engines(optimized)
    # Freezing kept in_proj_weight/bias (MultiheadAttention puts them in a tuple); they
    # became constants, then the engine's params, and the module no longer holds them.
    assert not [name for name in optimized.state_dict() if "in_proj" in name]
    with torch.no_grad():
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)


class Chain(torch.nn.Module):
    """Eight [512, 256] intermediates, each dead once the next is computed."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(8))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * 0.5 + x
        return x


def test_intermediates_are_freed_after_their_last_use():
    torch.manual_seed(0)
    model = Chain().eval()
    x = torch.randn(512, 256)
    optimized = blade.optimize(model, (x,), blade.Config(cache_dir="off"))
    engines(optimized)
    blade.release_cached_memory()
    with torch.no_grad():
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-4)
    # What one call freed is what it had live at once: a few intermediates, not all.
    intermediate = 512 * 256 * 4
    assert 0 < _C.cached_bytes() <= 4 * intermediate


class Scored(torch.nn.Module):
    """A submodule method freezing keeps (preserved) reads weights forward does not."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 16)
        self.head = Head()

    def forward(self, x):
        return torch.relu(self.body(x))


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.proj(x)

    @torch.jit.export
    def score(self, x):
        return self.proj(x) * self.scale


def test_preserved_attributes_and_the_methods_that_read_them_stay():
    torch.manual_seed(0)
    model = Scored().eval()
    x = torch.randn(8, 16)
    config = blade.Config(cache_dir="off", preserved_attributes=["head", "body.bias"])
    optimized = blade.optimize(model, (x,), config)
    engines(optimized)
    with torch.no_grad():
        assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
        assert_same(optimized.head.score(x), model.head.score(x), rtol=1e-4, atol=1e-5)
    assert torch.equal(optimized.body.bias, model.body.bias)
