"""Elementwise ops split into the slices that read them (slices.py) and elementwise loops
writing over an input that dies there (blade.codegen.buffers.arguments.reuse_dead_inputs): eager's results, from
compiled code, and the IR shows each rewrite (or its absence where it would be wrong)."""
import re

import torch

import blade
from helpers import ir_before, Lambda, run_compiled

TRACE = blade.Config(allow_tracing=True)


class QkvHeads(torch.nn.Module):
    """A fused QKV projection split into heads, as nn.MultiheadAttention's fast path."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 192)

    def forward(self, x):
        q, k, v = self.proj(x).chunk(3, dim=-1)
        heads = [t.reshape(2, 32, 4, 16).transpose(1, 2) for t in (q, k, v)]
        return heads[0] * 2.0, heads[1] + 1.0, heads[2]


def full_product_loops(linalg: str, shape: str) -> int:
    """Loop nests writing a whole tensor of `shape` (tensor<...> text)."""
    return len(re.findall(rf"linalg\.generic[^\n]*outs\([^)]*{re.escape(shape)}\)", linalg))


def test_the_bias_of_a_split_projection_is_added_in_each_slices_loop(tmp_path):
    torch.manual_seed(0)
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    run_compiled(QkvHeads(), (torch.randn(2, 32, 64),), config)
    linalg = ir_before(tmp_path, "write-slices-in-place")
    # no loop writes the biased [2, 32, 192] product: each head transpose adds its bias
    assert full_product_loops(linalg, "tensor<2x32x192xf32>") == 0, linalg


def strided_halves(x, w, b):
    y = torch.sigmoid(x @ w + b)
    return y[:, ::2] * 3.0, y[:, 1::2] - 1.0


def overlapping_slices(x, w, b):
    y = torch.sigmoid(x @ w + b)
    return y[:, :100] * 3.0, y[:, 50:] - 1.0


def test_strided_slices_split_the_op_and_overlapping_ones_do_not(tmp_path):
    torch.manual_seed(0)
    inputs = (torch.randn(16, 32), torch.randn(32, 128), torch.randn(128))
    for fn, split in ((strided_halves, True), (overlapping_slices, False)):
        dump = tmp_path / fn.__name__
        run_compiled(Lambda(fn), inputs, blade.Config(allow_tracing=True, dump_dir=str(dump)))
        linalg = ir_before(dump, "write-slices-in-place")
        # overlapping slices would compute columns 50..99 twice: the whole op stays
        assert (full_product_loops(linalg, "tensor<16x128xf32>") == 0) == split, linalg


class FeedForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def in_place_loops(bufferized: str) -> int:
    """Loop nests whose output buffer is also one of their inputs."""
    return len(re.findall(r"linalg\.generic[^\n]*ins\((%\w+)[^\n]*outs\(\1 ", bufferized))


def test_the_bias_and_activation_overwrite_the_matmul_output(tmp_path):
    torch.manual_seed(0)
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    run_compiled(FeedForward(), (torch.randn(8, 16, 64),), config)
    assert in_place_loops(ir_before(tmp_path, "mark-out-params")) >= 1


def reads_product_twice(x, w):
    y = x @ w
    return torch.relu(y) @ w + y     # y is read again after the relu's loop


def test_inputs_and_values_read_again_are_never_overwritten(tmp_path):
    torch.manual_seed(0)
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    kept = x.clone()
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    optimized, _ = run_compiled(Lambda(reads_product_twice), (x, w), config)
    optimized(x, w)
    assert torch.equal(x, kept)     # the caller's input is never a loop's output
    bufferized = ir_before(tmp_path, "mark-out-params")
    first = re.search(r"call @blade_library_call_\d+\(%\w+, %\w+, (%\w+)\)", bufferized)
    assert first is not None, bufferized
    assert f"outs({first.group(1)} " not in bufferized, bufferized
