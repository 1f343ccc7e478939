"""Shape, view, indexing, joining and factory ops; each dtype, two shapes."""
import pytest
import torch

import blade
from helpers import Lambda, random_tensor, run_compiled

TRACE = blade.Config(allow_tracing=True)
DTYPES = [torch.float32, torch.float16, torch.int64, torch.bool]

# Every op is surrounded by a compute op (x + x or a cat) so that a cluster forms.
OPS = {
    "view": lambda x: torch.cat([x, x]).view(2 * x.shape[0], -1),
    "reshape": lambda x: torch.cat([x, x]).reshape(-1),
    "permute": lambda x: torch.cat([x, x]).permute(2, 0, 1).contiguous(),
    "transpose": lambda x: torch.cat([x, x]).transpose(0, 2).contiguous(),
    "unsqueeze_squeeze": lambda x: torch.cat([x, x]).unsqueeze(1).squeeze(1),
    "expand": lambda x: torch.cat([x[:, :1], x[:, :1]]).expand(2 * x.shape[0], 4, x.shape[2]),
    "flatten": lambda x: torch.flatten(torch.cat([x, x]), 1),
    "slice": lambda x: torch.cat([x[:, 1:], x[:, :-1]], dim=2)[::2],
    "select_narrow": lambda x: torch.stack([x[0], x.narrow(0, 1, 1).squeeze(0)]),
    "cat": lambda x: torch.cat([x, x, x], dim=1),
    "stack": lambda x: torch.stack([x, x], dim=-1),
    "repeat": lambda x: x.repeat(1, 2, 1),
    "split": lambda x: torch.cat(torch.split(x, 1, dim=1)[::-1], dim=1),
    "chunk": lambda x: torch.cat(list(reversed(torch.chunk(x, 2, dim=2))), dim=2),
    "flip": lambda x: torch.flip(x, dims=[1]),
    "tril": lambda x: torch.tril(x),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 4), (5, 4, 6)], ids=["small", "larger"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_view_and_join(name, shape, dtype):
    torch.manual_seed(0)
    run_compiled(Lambda(OPS[name]), (random_tensor(shape, dtype),), TRACE, rtol=0, atol=0)


INDEXING = {
    "index_select": (lambda x, i: torch.index_select(x, 1, i), lambda s: (s[1],)),
    "gather": (lambda x, i: torch.gather(x, 1, i), lambda s: s),
    "embedding": (lambda x, i: torch.nn.functional.embedding(i, x), lambda s: (3, 5)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
@pytest.mark.parametrize("shape", [(4, 6), (3, 9)], ids=["small", "larger"])
@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing(name, shape, dtype):
    torch.manual_seed(0)
    fn, index_shape = INDEXING[name]
    x = random_tensor(shape, dtype)
    high = shape[0] if name == "embedding" else shape[1]
    index = torch.randint(0, high, index_shape(shape))
    run_compiled(Lambda(lambda x, i: fn(x * 1, i)), (x, index), TRACE, rtol=0, atol=0)


FACTORIES = {
    "arange": lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype),
    "arange_start_step": lambda x: x * torch.arange(1, 2 * x.shape[-1] + 1, 2).to(x.dtype),
    "full": lambda x: x + torch.full(x.shape, 3, dtype=x.dtype),
    "zeros_ones": lambda x: x + torch.zeros(x.shape[-1], dtype=x.dtype) + torch.ones_like(x),
    "zeros_like": lambda x: torch.zeros_like(x) - x,
    "full_like": lambda x: torch.full_like(x, 2) * x,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 5)], ids=["2d", "3d"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_factory(name, shape, dtype):
    torch.manual_seed(0)
    run_compiled(Lambda(FACTORIES[name]), (random_tensor(shape, dtype),), TRACE, rtol=0,
                 atol=0)


class Lookups(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(1000, 64)

    def forward(self, tokens, x, rows):
        return self.table(tokens).sum(1) + x.index_select(0, rows).sum(0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_an_index_out_of_range_raises_as_in_eager(dynamic):
    # Gathers clamp an index into the table; one outside it must not give a clamped row
    # but PyTorch's error: the compiled code reports it (from a parallel task too: the
    # embedding runs on threads) and the call runs the TorchScript fallback.
    torch.manual_seed(0)
    model = Lookups().eval()
    tokens, x, rows = torch.randint(0, 1000, (32, 128)), torch.randn(10, 64), torch.tensor([1, 9])
    optimized, report = run_compiled(model, (tokens, x, rows), blade.Config(dynamic=dynamic))
    assert report.clusters[0].parallel_loops >= 1, str(report)
    bad_token = tokens.clone()
    bad_token[7, 77] = 1000
    for bad in ((bad_token, x, rows), (tokens, x, torch.tensor([1, 10])),
                (tokens, x, torch.tensor([-1, 2]))):
        with pytest.raises((IndexError, RuntimeError), match="out of range"):
            with torch.no_grad():
                model(*bad)
        with pytest.raises((IndexError, RuntimeError), match="out of range"):
            with torch.no_grad():
                optimized(*bad)
    report = blade.report(optimized)
    assert report.runtime_fallbacks == 3, str(report)
    assert "index -1 is out of bounds for a dimension of size 10" in \
        report.clusters[0].status, str(report)
