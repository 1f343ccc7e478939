"""The simplification passes on a corpus of scripted modules full of Python structure
(tests/passes/corpus.py): each gives eager's results, and the share of its tensor ops
that ends up compiled is reported and held to the corpus's bar."""
import pytest
import torch

import blade
from corpus import OptionalMask, corpus
from helpers import assert_same, run_compiled

CORPUS = corpus()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_module_compiles_and_matches_eager(name):
    module, inputs, share = CORPUS[name]
    optimized, report = run_compiled(module.eval(), inputs, rtol=1e-4, atol=1e-5)
    print(f"{name}: {100 * report.coverage:.0f}% of {report.total_ops} tensor ops compiled")
    assert report.coverage >= share, str(report)
    # Fresh values of the same shapes: the specialized graph still computes the model.
    torch.manual_seed(1)
    fresh = tuple(torch.randn_like(t) for t in inputs)
    with torch.no_grad():
        assert_same(optimized(*fresh), module(*fresh), rtol=1e-4, atol=1e-5)
    assert blade.report(optimized).runtime_fallbacks == 0


def test_corpus_is_large_and_mostly_compiled():
    assert len(CORPUS) >= 15
    assert sum(share for _, _, share in CORPUS.values()) / len(CORPUS) >= 0.9


class WritesItsInput(torch.nn.Module):
    def forward(self, x):
        x[:, 0] = 0.0                 # the caller sees this write
        y = torch.tanh(x) * 2.0
        y[1:3] = y[0] + 1.0           # a fresh tensor: made functional
        return y


def test_a_write_into_an_input_stays_and_the_caller_sees_it():
    torch.manual_seed(0)
    module = WritesItsInput()
    x = torch.randn(4, 5)
    optimized = blade.optimize(module, (x.clone(),))
    report = blade.report(optimized)
    # the write into a slice of x stays in place (csrc/passes/functionalize_input_writes.h)
    assert "aten::copy_" in report.unsupported, str(report)
    assert report.clusters and report.compiled_ops >= 4, str(report)
    mine, theirs = x.clone(), x.clone()
    assert_same(optimized(mine), module(theirs))
    assert_same(mine, theirs)         # the input was written the same way
    assert (mine[:, 0] == 0).all()


def test_an_input_specialized_to_none_is_guarded():
    torch.manual_seed(0)
    module, x = OptionalMask(), torch.randn(2, 4, 8)
    optimized = blade.optimize(module, (x,))
    report = blade.report(optimized)
    assert report.guard_specs == "float32[2,4,8];None" and report.coverage == 1.0, str(report)
    mask = torch.randn(2, 4, 4)
    with torch.no_grad():
        assert_same(optimized(x, mask), module(x, mask))
        assert_same(optimized(x), module(x))
    report = blade.report(optimized)
    assert report.guard_fallbacks == 1 and "input 1: is a tensor, expected None" in \
        report.guard_status, str(report)
    assert report.clusters[0].calls == 1
