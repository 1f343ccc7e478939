"""Parallel loops: large loop nests run on PyTorch's intra-op threads (report's
parallel_loops), with eager's results whatever the thread count, from several threads."""
import threading

import torch

import blade
from helpers import ir_before, Lambda, assert_same, run_compiled

TRACE = blade.Config(allow_tracing=True)


def chain(x, b):
    return torch.nn.functional.gelu(x * 1.5 + b) * torch.sigmoid(x) + x


def norm_softmax(x, b):
    y = torch.nn.functional.layer_norm(x + b, (x.shape[-1],))
    return torch.softmax(y, dim=-1) + y.sum(dim=0, keepdim=True)   # the sum over rows: serial


def check(fn, threads):
    torch.manual_seed(0)
    x, b = torch.randn(512, 1024), torch.randn(1024)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        optimized, report = run_compiled(Lambda(fn), (x, b), TRACE, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(previous)
    return report


def test_elementwise_chain_runs_in_parallel_with_any_thread_count():
    for threads in (1, 2, 3):
        report = check(chain, threads)
        assert report.clusters[0].parallel_loops >= 1, str(report.clusters[0])


def test_reductions_split_by_rows_and_a_reduction_over_rows_stays_serial():
    report = check(norm_softmax, 2)
    assert report.clusters[0].parallel_loops >= 2, str(report.clusters[0])


def lower_triangle(x, b):
    return torch.tril(x) * 2.0 + b


def masked_rows_softmax(x, b):
    return torch.softmax(torch.tril(x + b), dim=-1)


def test_loops_reading_their_row_position_see_the_whole_buffers_rows():
    # tril compares each element's row with its column: a task on rows [begin, end) must
    # compare the row of the whole tensor, not of its block (it was wrong by up to 9.7).
    for fn in (lower_triangle, masked_rows_softmax):    # one split loop; a group of rows
        for threads in (2, 3):
            report = check(fn, threads)
            assert report.clusters[0].parallel_loops >= 1, str(report.clusters[0])


def test_a_gather_reading_its_table_inside_the_loop_runs_in_parallel():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 64)).eval()
    tokens = torch.randint(0, 1000, (32, 128))
    optimized, report = run_compiled(model, (tokens,), blade.Config(dynamic=True))
    assert report.clusters[0].parallel_loops == 1, str(report.clusters[0])
    with torch.no_grad():
        other = torch.randint(0, 1000, (8, 300))
        assert_same(optimized(other), model(other))


def test_small_loops_stay_serial():
    optimized, report = run_compiled(Lambda(chain), (torch.randn(8, 64), torch.randn(64)),
                                     TRACE)
    assert report.clusters[0].parallel_loops == 0


def test_parallel_engine_called_from_four_threads():
    torch.manual_seed(0)
    x, b = torch.randn(256, 1024), torch.randn(1024)
    optimized = blade.optimize(Lambda(norm_softmax), (x, b), TRACE)
    assert blade.report(optimized).clusters[0].parallel_loops >= 1
    inputs = [torch.randn(256, 1024) for _ in range(4)]
    expected = [norm_softmax(t, b) for t in inputs]
    wrong = []

    def worker(i):
        for _ in range(20):
            try:
                assert_same(optimized(inputs[i], b), expected[i], 1e-5, 1e-5)
            except AssertionError as e:
                wrong.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[0]
    assert blade.report(optimized).runtime_fallbacks == 0


def test_config_parallel_false_keeps_every_loop_serial():
    torch.manual_seed(0)
    x, b = torch.randn(512, 1024), torch.randn(1024)
    config = blade.Config(allow_tracing=True, parallel=False)
    optimized, report = run_compiled(Lambda(chain), (x, b), config, rtol=1e-5, atol=1e-5)
    assert report.clusters[0].parallel_loops == 0


def test_task_and_main_data_pointers_reach_llvm_as_noalias(tmp_path):
    """The noalias marks on memref arguments survive the LLVM lowering (on the data
    pointers): without them LLVM keeps a row's mean inside the loop over its elements."""
    import re
    torch.manual_seed(0)
    x, b = torch.randn(512, 1024), torch.randn(1024)
    config = blade.Config(allow_tracing=True, dump_dir=str(tmp_path))
    run_compiled(Lambda(norm_softmax), (x, b), config)
    llvm = next(tmp_path.glob("*/2_llvm.ll")).read_text()
    for name in ("blade_task_0", "main"):
        header = re.search(rf"define void @{name}\((.*)\)", llvm).group(1)
        # every memref descriptor starts with its allocated and aligned pointers
        assert header.count("ptr noalias") == header.count("ptr") > 0, header


def heads_of_a_column_slice(x, b):
    # The transpose into heads reads a column slice of x: a strided view, not a buffer of
    # its own. It used to stay serial (views of identity layout only).
    s = x.reshape(8, 64, 1024)[:, :, 256:512] + b[256:512]
    return s.reshape(8, 64, 4, 64).transpose(1, 2) * 2.0


def test_a_loop_reading_a_strided_view_runs_in_parallel():
    for threads in (2, 3):
        report = check(heads_of_a_column_slice, threads)
        assert report.clusters[0].parallel_loops >= 1, str(report.clusters[0])


def test_a_layer_norm_after_a_linear_is_one_task_and_copies_nothing(tmp_path):
    """The bias add and all of LayerNorm's passes run as one group of rows: the constants
    of the mean and the epsilon fold (folding.fold_splat_constants) and each reduction has
    its own zero fill (folding.fill_per_use) instead of a copy of a shared one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256))
    config = blade.Config(dump_dir=str(tmp_path))
    _, report = run_compiled(model, (torch.randn(4, 128, 256),), config)
    assert report.clusters[0].parallel_loops == 1, str(report.clusters[0])
    bufferized = ir_before(tmp_path, "mark-out-params")
    assert "memref.copy" not in bufferized


def test_a_layer_norm_of_dynamic_length_is_one_task():
    """With a dynamic number of rows, the bias add and the LayerNorm's passes still run as
    one group of rows (buffers sized by one value run over the same rows; the linear
    layer's result, which a dynamic engine's library call returns, by main's query of its
    rows), with eager's results at lengths that make one block of rows, several, and a
    partial last one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)).eval()
    previous = torch.get_num_threads()
    try:
        for threads in (2, 3):
            torch.set_num_threads(threads)
            optimized, report = run_compiled(model, (torch.randn(1, 128, 256),),
                                             blade.Config(dynamic=True))
            assert report.clusters[0].parallel_loops == 1, str(report.clusters[0])
            assert report.clusters[0].inputs == "float32[1,s0,256]", str(report.clusters[0])
            with torch.no_grad():
                for length in (3, 700, 1234):
                    x = torch.randn(1, length, 256)
                    assert_same(optimized(x), model(x), rtol=1e-5, atol=1e-5)
            assert blade.report(optimized).runtime_fallbacks == 0
    finally:
        torch.set_num_threads(previous)


def test_a_batch_of_one_runs_on_every_thread():
    """A model served one input at a time: the batch dim of 1 is dropped from the loop nests
    (unit_loops.py), so they split along the rows after it: the LayerNorm's passes as one
    group of rows, tril (which reads its row position) on whole-buffer rows."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256))
    tril = Lambda(lambda x: torch.tril(x) * 2.0 + x.sum(-1, keepdim=True))
    previous = torch.get_num_threads()
    try:
        for threads in (2, 3):
            torch.set_num_threads(threads)
            _, report = run_compiled(model, (torch.randn(1, 128, 256),))
            assert report.clusters[0].parallel_loops == 1, str(report.clusters[0])
            _, report = run_compiled(tril, (torch.randn(1, 256, 300),), TRACE)
            assert report.clusters[0].parallel_loops >= 1, str(report.clusters[0])
    finally:
        torch.set_num_threads(previous)


class ResidualConvolutions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 32, 3, padding=1)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def test_a_batch_of_one_transposes_on_every_thread():
    """Channels-last convolutions of one image: the NCHW -> NHWC transpose of the input
    splits along H, which it reads as the second dim of each C plane, and the residual add
    written back as NCHW splits along H of its output."""
    torch.manual_seed(0)
    model = ResidualConvolutions().eval()
    previous = torch.get_num_threads()
    try:
        for threads in (2, 3):
            torch.set_num_threads(threads)
            _, report = run_compiled(model, (torch.randn(1, 32, 40, 40),), rtol=1e-4,
                                     atol=1e-5)
            assert report.clusters[0].parallel_loops == 2, str(report.clusters[0])
    finally:
        torch.set_num_threads(previous)
