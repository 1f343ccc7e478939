"""The simplification passes on a corpus of scripted modules full of Python structure
(tests/passes/corpus.py): each gives eager's results, and the share of its tensor ops
that ends up compiled is reported and held to the corpus's bar."""
import pytest
import torch

import blade
from corpus import corpus
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
