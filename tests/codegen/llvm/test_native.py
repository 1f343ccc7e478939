"""LLVM's part of code generation runs on worker processes too (python/blade/codegen/llvm/native.py): a
module compiled in partitions, by workers, gives what it gives compiled in one piece; no
worker outlives optimize; a worker that dies fails its cluster with the reason in the
report, and one that cannot start leaves the work to optimize's process."""
import os

import pytest
import torch

import blade
from blade.codegen.llvm import native
from helpers import assert_ran_compiled, assert_same


class ConvHead(torch.nn.Module):
    """Convolutions (library calls), large elementwise loops (parallel tasks) and a linear
    layer: a module of several function groups, so that it splits into partitions."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.norm = torch.nn.LayerNorm(32)
        self.fc = torch.nn.Linear(32, 8)

    def forward(self, x):
        y = torch.relu(self.conv(x)) * 0.5 + 1.0
        return self.fc(torch.tanh(self.norm(y)))


def model_and_input():
    torch.manual_seed(0)
    return ConvHead().eval(), torch.randn(2, 3, 32, 32)


def optimize(model, x, **config):
    # erfinv stays TorchScript between clusters (as a kernel call it would join them).
    return blade.optimize(model, (x,), blade.Config(cache_dir="off", kernel_calls=False,
                                                    **config))


@pytest.fixture
def workers(monkeypatch):
    """Every cluster starts the pool, however small; records the worker processes started
    and how many partitions each module was split into."""
    monkeypatch.setattr(native, "MIN_PARALLEL_IR_CHARS", 0)
    seen = {"processes": [], "partitions": []}
    real_popen, real_partition = native.subprocess.Popen, native.partition

    def popen(command, *args, **kwargs):
        process = real_popen(command, *args, **kwargs)
        if kwargs.get("stdin") is native.subprocess.PIPE:  # a worker, not the linker
            seen["processes"].append(process)
        return process

    def partition(module, count):
        parts = real_partition(module, count)
        seen["partitions"].append(len(parts))
        return parts

    monkeypatch.setattr(native.subprocess, "Popen", popen)
    monkeypatch.setattr(native, "partition", partition)
    return seen


@pytest.fixture
def workers_only(monkeypatch):
    """optimize's own process compiles no partition while a worker is alive: they all go
    to the workers."""
    real_take = native.CompilerPool._take
    monkeypatch.setattr(native.CompilerPool, "_take",
                        lambda self: real_take(self) if self.failures else None)


def test_partitions_compiled_by_a_worker_give_what_one_piece_gives(workers, workers_only):
    model, x = model_and_input()
    serial = optimize(model, x, compile_workers=0)
    assert workers["processes"] == [] and workers["partitions"] == []
    parallel = optimize(model, x, compile_workers=1)
    assert len(workers["processes"]) == 1 and max(workers["partitions"]) > 1, workers
    with torch.no_grad():
        expected, from_serial, from_parallel = model(x), serial(x), parallel(x)
    assert_same(from_parallel, expected)
    assert torch.equal(from_parallel, from_serial)
    assert_ran_compiled(serial)
    assert_ran_compiled(parallel)


class ThreeDistinctClusters(torch.nn.Module):
    """Three clusters of other sizes (so other code), between ops with no converter."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 48)
        self.fc3 = torch.nn.Linear(48, 16)

    def forward(self, x):
        a = torch.erfinv(torch.tanh(self.fc1(x)) * 0.5)
        b = torch.erfinv(torch.tanh(torch.relu(self.fc2(a))) * 0.5)
        return torch.sigmoid(self.fc3(b))


def test_distinct_clusters_compile_side_by_side(monkeypatch, workers, workers_only):
    """MLIR's stages of every cluster run before optimize waits for the first cluster's
    objects: the workers compile one cluster while the next is lowered."""
    from blade.codegen import driver as codegen

    events = []
    real_start, real_wait = codegen.start_compiling, native.CompilerPool.wait
    monkeypatch.setattr(codegen, "start_compiling",
                        lambda *a, **k: events.append("lowered") or real_start(*a, **k))
    monkeypatch.setattr(native.CompilerPool, "wait",
                        lambda self, jobs: events.append("waited") or real_wait(self, jobs))
    torch.manual_seed(0)
    model, x = ThreeDistinctClusters().eval(), torch.randn(8, 32)
    optimized = optimize(model, x, compile_workers=1)
    assert events == ["lowered"] * 3 + ["waited"] * 3, events
    with torch.no_grad():
        assert_same(optimized(x), model(x))
    report = assert_ran_compiled(optimized)
    assert [c.code for c in report.clusters] == ["compiled"] * 3, str(report)


def test_no_worker_outlives_optimize(workers):
    model, x = model_and_input()
    optimized = optimize(model, x, compile_workers=2)
    assert len(workers["processes"]) == 2
    assert all(process.poll() is not None for process in workers["processes"])
    with torch.no_grad():
        assert_same(optimized(x), model(x))
    assert_ran_compiled(optimized)


def test_an_interrupted_optimize_leaves_no_worker(monkeypatch, workers):
    from blade.codegen import driver as codegen

    real_start = codegen.start_compiling
    begun = []

    def interrupted_at_the_second(*args, **kwargs):
        begun.append(1)
        if len(begun) == 2:
            raise KeyboardInterrupt  # not a compile failure: it leaves optimize
        return real_start(*args, **kwargs)

    monkeypatch.setattr(codegen, "start_compiling", interrupted_at_the_second)
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        optimize(ThreeDistinctClusters().eval(), torch.randn(8, 32), compile_workers=1)
    assert len(workers["processes"]) == 1
    assert all(process.poll() is not None for process in workers["processes"])


def test_a_worker_that_dies_fails_its_cluster_with_the_reason(monkeypatch, workers,
                                                               workers_only):
    # A worker that says it is ready, then exits on its first job.
    monkeypatch.setattr(native, "_WORKER", """
import pickle, struct, sys
ready = pickle.dumps(("ready", 0))
sys.stdout.buffer.write(struct.pack("<Q", len(ready)) + ready)
sys.stdout.buffer.flush()
sys.stdin.buffer.read(8)
sys.exit(3)
""")
    model, x = model_and_input()
    optimized = optimize(model, x, compile_workers=1)
    report = blade.report(optimized)
    assert len(report.compile_errors) == 1, str(report)
    assert "compile worker" in report.compile_errors[0] and "died with status 3" in \
        report.compile_errors[0], report.compile_errors[0]
    reasons = [r for entry in report.unsupported.values() for r in entry.reasons]
    assert any("compile worker" in r for r in reasons), str(report)
    with torch.no_grad():
        assert_same(optimized(x), model(x))  # the cluster runs as TorchScript
    assert all(process.poll() is not None for process in workers["processes"])


def test_a_worker_that_cannot_start_leaves_the_work_to_optimize(monkeypatch, workers):
    monkeypatch.setattr(native, "_WORKER", "import sys; sys.exit(1)")
    model, x = model_and_input()
    optimized = optimize(model, x, compile_workers=1)
    assert len(workers["processes"]) == 1 and max(workers["partitions"]) > 1, workers
    with torch.no_grad():
        assert_same(optimized(x), model(x))
    assert_ran_compiled(optimized)


def test_workers_follow_the_cores_and_pytorch_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert native.default_workers() == 1
        torch.set_num_threads(8)
        assert native.default_workers() == 3
        torch.set_num_threads(1)
        assert native.default_workers() == 0
    finally:
        torch.set_num_threads(threads)
    assert native.default_workers(5) == 5 and native.default_workers(0) == 0


def test_config_checks_compile_workers():
    for wrong in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="compile_workers"):
            blade.Config(compile_workers=wrong)
    assert blade.Config(compile_workers=0).compile_workers == 0
