"""Matrix products: compiled as RAL calls into PyTorch's kernels, each dtype, two shapes."""
import pytest
import torch

import blade
from blade.codegen.kernels import outlining
from helpers import TOLERANCE, Lambda, random_tensor, run_compiled

TRACE = blade.Config(allow_tracing=True)
DTYPES = [torch.float32, torch.float64, torch.bfloat16]

# name -> (fn, input shapes per case)
OPS = {
    "linear_2d": (lambda x, w, b: torch.nn.functional.linear(x, w, b), [
        [(4, 16), (8, 16), (8,)], [(3, 5), (7, 5), (7,)]]),
    "linear_3d": (lambda x, w, b: torch.nn.functional.linear(x, w, b).relu(), [
        [(2, 4, 16), (8, 16), (8,)], [(3, 1, 6), (2, 6), (2,)]]),
    "matmul_broadcast": (lambda a, b: a @ b, [[(2, 3, 4, 5), (5, 6)], [(3, 4, 5), (5, 2)]]),
    "matmul_batched": (lambda a, b: torch.matmul(a, b) * 2, [
        [(2, 3, 4, 5), (2, 3, 5, 6)], [(4, 2, 3), (4, 3, 2)]]),
    "mm": (lambda a, b: torch.mm(a, b), [[(3, 4), (4, 5)], [(8, 1), (1, 8)]]),
    "mm_transposed": (lambda a, b: torch.mm(a, b.t()), [[(3, 4), (5, 4)], [(6, 9), (2, 9)]]),
    "bmm": (lambda a, b: torch.bmm(a, b), [[(2, 3, 4), (2, 4, 5)], [(5, 1, 3), (5, 3, 7)]]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), [
        [(5,), (3, 4), (4, 5)], [(2, 6), (2, 3), (3, 6)]]),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), [
        [(2, 3, 5), (2, 3, 4), (2, 4, 5)], [(1, 1, 2), (3, 2, 2), (3, 2, 2)]]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [0, 1], ids=["shape0", "shape1"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_matrix_product(name, case, dtype):
    torch.manual_seed(0)
    fn, shapes = OPS[name]
    inputs = tuple(random_tensor(s, dtype) for s in shapes[case])
    rtol, atol = TOLERANCE[dtype]
    if dtype == torch.bfloat16:
        rtol, atol = 5e-2, 1e-1  # products of bf16 accumulate rounding
    _, report = run_compiled(Lambda(fn), inputs, TRACE, rtol=rtol, atol=atol)
    # The product ran as a call into PyTorch's kernels, not as generated loops.
    assert sum(c.library_calls for c in report.clusters) >= 1, str(report)


def test_linear_weight_is_not_transposed_per_call():
    """nn.Linear's weight is read in place by the kernel (a transpose flag), so main holds
    no transpose of it: the transpose moved into the outlined call, whose body the RAL call
    replaces."""
    seen = []
    original = outlining.outline

    def spy(module, main):
        count = original(module, main)
        seen.append((str(main), str(module)))
        return count

    outlining.outline = spy
    try:
        model = torch.nn.Linear(32, 16).eval()
        run_compiled(model, (torch.randn(4, 32),))
    finally:
        outlining.outline = original
    main_text, module_text = seen[0]
    assert "stablehlo.transpose" not in main_text and "call @blade_library_call_0" in main_text
    assert "blade.transpose_b = 1" in module_text
