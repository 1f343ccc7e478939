"""GEMMs by a weight's [K, N] copy through oneDNN's brgemm microkernel
(csrc/ral/blocked_gemm.*): what a dynamic engine's GEMM runs once its weight has all the
oneDNN copies it may have (one per row count, for a few)."""
import pytest
import torch

import blade
from blade import _C
from helpers import GeluMlp, assert_ran_compiled, assert_same

needs_microkernel = pytest.mark.skipif(not _C.blocked_gemm_available(),
                                       reason="this CPU lacks AVX-512F: MKL's GEMM serves")


@needs_microkernel
@pytest.mark.parametrize("m", [1, 77, 130, 300])
@pytest.mark.parametrize("n, k", [(1, 1), (63, 511), (65, 513), (130, 1100)])
@pytest.mark.parametrize("panels", [False, True], ids=["row-major", "column panels"])
def test_blocked_gemm_is_the_product(m, n, k, panels):
    """Row blocks split evenly (130 rows: two of 65), partial column blocks (a panel's
    zeros past N), depth past one microkernel call (added into the result)."""
    torch.manual_seed(m + n + k)
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.testing.assert_close(_C.blocked_gemm(a, b, panels).double(), a.double() @ b.double(),
                               rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_microkernel
def test_blocked_gemm_names_what_it_does_not_take():
    with pytest.raises(RuntimeError, match=r"a \[M, K\] and b \[K, N\] float32"):
        _C.blocked_gemm(torch.randn(2, 8), torch.randn(7, 3))


def test_dynamic_rows_past_the_weights_copies_match_eager():
    """More row counts than a weight keeps oneDNN copies for: every call matches eager
    (the later counts through the weight's one [K, N] copy where the CPU has AVX-512F),
    and the copies stay bounded."""
    torch.manual_seed(0)
    model = GeluMlp().eval()
    optimized = blade.optimize(model, (torch.randn(8, 32),), blade.Config(dynamic=True))
    with torch.no_grad():
        for batch in (9, 10, 11, 12, 13, 14, 15, 16) * _C.kernel_trial_calls():
            x = torch.randn(batch, 32)
            assert_same(optimized(x), model(x), rtol=1e-4, atol=1e-5)
    report = assert_ran_compiled(optimized)
    # Per weight: oneDNN copies for at most 4 row counts, and one [K, N] copy.
    assert report.clusters[0].packed_weights <= 2 * 5, str(report)
