"""How Blade's float32, bfloat16 and int8 convolution kernels split their work among threads
(csrc/ral/conv_planes.h's ConvTasks): every output row of every column block exactly once,
blocks of rows starting on whole tiles, and equal runs of tasks holding equal rows within a
tile per column block, so that no thread waits on another at the call's end."""
import pytest

from blade import _C

# (batch, rows, column blocks, most rows a block, rows a tile, columns outer, threads)
CASES = [
    (1, 3136, 1, 128, 6, False, 2),  # 56 x 56, one block: 25 blocks of rows would not share
    (1, 196, 4, 128, 6, False, 2),   # 14 x 14, 4 column blocks
    (1, 784, 2, 128, 6, False, 2),   # 28 x 28
    (1, 49, 3, 128, 12, False, 2),   # 7 x 7, 3 column blocks: the rows split for the threads
    (1, 49, 8, 128, 6, True, 2),     # a deep layer's: column blocks outer
    (1, 49, 3, 128, 6, True, 2),     # columns outer, 3 blocks: rows split too
    (8, 3136, 4, 128, 6, False, 2),  # a batch
    (1, 10, 1, 128, 6, False, 2),    # fewer than two tiles: one task, nothing to share
    (1, 784, 3, 128, 1, False, 3),   # the microkernel's blocks (any rows), three threads
    (1, 784, 5, 128, 6, False, 1),   # one thread
]


@pytest.mark.parametrize("batch,rows,blocks,max_rows,whole,columns_outer,threads", CASES)
def test_tasks_cover_the_rows_once_and_share_evenly(batch, rows, blocks, max_rows, whole,
                                                    columns_outer, threads):
    tasks, step = _C.conv_tasks(batch, rows, blocks, max_rows, whole, columns_outer, threads)
    covered = {}
    for image, block, first, count in tasks:
        assert count > 0 and first % whole == 0, (first, count)
        assert count <= step <= max_rows + whole
        for row in range(first, first + count):
            key = (image, block, row)
            assert key not in covered, f"row {row} of block {block} taken twice"
            covered[key] = True
    assert len(covered) == batch * blocks * rows
    # The threads' contiguous runs (as at::parallel_for hands them out) hold equal rows
    # within a tile per column block, wherever the tasks can share evenly.
    if rows >= 2 * whole or threads == 1:
        assert len(tasks) % threads == 0
    if len(tasks) % threads == 0:
        run = len(tasks) // threads
        held = [sum(t[3] for t in tasks[i * run:(i + 1) * run]) for i in range(threads)]
        ideal = batch * rows * blocks / threads
        assert all(abs(h - ideal) <= whole * blocks for h in held), held


def test_one_image_one_block_splits_its_rows_in_halves():
    # The case that motivated the even split: 56 x 56 rows of one column block, whose 25
    # blocks of 126 rows and one of 112 gave the first thread 140 rows more.
    tasks, _ = _C.conv_tasks(1, 3136, 1, 128, 6, False, 2)
    run = (len(tasks) + 1) // 2  # at::parallel_for's share: the first thread's is larger
    first, second = (sum(t[3] for t in tasks[i * run:(i + 1) * run]) for i in (0, 1))
    assert abs(first - second) <= 6, (first, second)


def test_bad_counts_are_refused():
    with pytest.raises(RuntimeError, match="every count must be positive"):
        _C.conv_tasks(1, 0, 1, 128, 6, False, 2)
