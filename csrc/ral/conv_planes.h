// What Blade's own implicit-GEMM convolutions (int8_conv.h, float_conv.h) share: the
// padded input split into stride-phase planes, so that every convolution is a stride-1
// one over a plane's flat pixel index, or (for the register tiles, which read each row at
// its own position) the padded image walked with the stride; the order of a filter's taps
// in a packed weight;
// runs of taps that read adjacent pixels, multiplied as one; and the walk of a block's rows
// over output pixels.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <unistd.h>

namespace blade::ral {

// The order of a filter's taps in a packed weight (which does not know the stride), as
// (row, column) pairs: row by row; within a row of 5 or more columns (a stem's filter,
// run with stride 2) the even columns before the odd ones, so that a stride-2 row's taps
// of one phase are adjacent pixels of one plane, as a stride-1 row's are in the natural
// order. A stride-1 filter of 5 columns or more then merges no taps: right, a little
// slower.
inline std::vector<std::pair<int64_t, int64_t>> tap_order(int64_t kh, int64_t kw) {
  std::vector<std::pair<int64_t, int64_t>> order;
  order.reserve(kh * kw);
  for (int64_t i = 0; i < kh; ++i) {
    for (int64_t parity = 0; parity < (kw >= 5 ? 2 : 1); ++parity) {
      for (int64_t j = kw >= 5 ? parity : 0; j < kw; j += kw >= 5 ? 2 : 1) {
        order.emplace_back(i, j);
      }
    }
  }
  return order;
}

// Taps in packing order whose inputs are adjacent pixels, multiplied as one: the input
// at `offset` elements from a row's (`depth` elements a pixel), the weight's rows from its
// `weight_row` (in depth units of the packed block).
struct TapGroup {
  int64_t offset;
  int64_t weight_row;
  int64_t depth;
};

// The planes a convolution's taps read: the padded image (padding: a value that counts as
// 0) split by position modulo the stride, so plane (a, b) holds padded pixels
// (y * sh + a, x * sw + b) and tap (i, j) of output pixel (oh, ow) reads plane
// (i % sh, j % sw) at (oh + i / sh, ow + j / sw): a stride-1 convolution in every plane.
// With a column step of 1 (and padding narrower than the filter) a row holds its left
// padding only: a tap past the right edge reads on into the next row's left padding (or a
// last row of padding), so fewer GEMM rows are dropped.
// A walk that reads each row at its own position (the register tiles') needs no phases:
// with `strided_walk` the one plane is the padded image, sampled every pixel (step 1), and
// output pixel (oh, ow) reads it from (oh * sh, ow * sw) on (walk_h, walk_w: the stride),
// so a strided convolution copies its padding only, or nothing. Taps then lie in the
// natural order, so it suits filters of fewer than 5 columns (tap_order).
struct ConvPlanes {
  int64_t height, width, kh, kw, sh, sw, ph, pw;
  int64_t out_h, out_w;
  int64_t step_h, step_w;  // the plane's pixels are every step-th padded pixel
  int64_t walk_h, walk_w;  // plane pixels from one output pixel to the next
  int64_t phases_h, phases_w;
  bool shared_padding;
  int64_t plane_h, plane_w;

  ConvPlanes(int64_t height, int64_t width, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
             int64_t ph, int64_t pw, bool strided_walk = false)
      : height(height), width(width), kh(kh), kw(kw), sh(sh), sw(sw), ph(ph), pw(pw),
        out_h((height + 2 * ph - kh) / sh + 1), out_w((width + 2 * pw - kw) / sw + 1),
        step_h(strided_walk ? 1 : sh), step_w(strided_walk ? 1 : sw),
        walk_h(strided_walk ? sh : 1), walk_w(strided_walk ? sw : 1),
        phases_h(std::min(step_h, kh)), phases_w(std::min(step_w, kw)),
        shared_padding(step_w == 1 && pw < kw),
        plane_h((height + 2 * ph + step_h - 1) / step_h + (shared_padding && pw > 0 ? 1 : 0)),
        plane_w(shared_padding ? width + pw : (width + 2 * pw + step_w - 1) / step_w) {}

  // Whether the filter fits the padded input (else the sizes above mean nothing).
  bool filter_fits() const { return height + 2 * ph >= kh && width + 2 * pw >= kw; }
  // Whether the input, as it is, is the one plane (no padding, a step of 1).
  bool input_is_plane() const { return ph == 0 && pw == 0 && step_h == 1 && step_w == 1; }
  int64_t phases() const { return phases_h * phases_w; }
  // Elements of a plane and of an image's planes, `depth` elements a pixel.
  int64_t plane_elements(int64_t depth) const { return plane_h * plane_w * depth; }
  int64_t image_elements(int64_t depth) const { return phases() * plane_elements(depth); }
  // Plane rows of `batch` images, in the order (image, phase, row).
  int64_t plane_rows(int64_t batch) const { return batch * phases() * plane_h; }

  // Plane row `row`: its image, the input row it copies (outside [0, height): padding),
  // and the input column of its pixel x = 0 (x steps step_w columns).
  struct Row {
    int64_t image, input_row, first_column;
  };
  Row row(int64_t row) const {
    const int64_t y = row % plane_h;
    const int64_t phase = row / plane_h % phases();
    return {row / plane_h / phases(), y * step_h + phase / phases_w - ph,
            phase % phases_w - pw};
  }

  // Each tap's input offset from a row's, in tap_order.
  std::vector<int64_t> tap_offsets(int64_t depth) const {
    std::vector<int64_t> offsets;
    for (const auto& [i, j] : tap_order(kh, kw)) {
      offsets.push_back(((i % step_h) * phases_w + j % step_w) * plane_elements(depth) +
                        ((i / step_h) * plane_w + j / step_w) * depth);
    }
    return offsets;
  }
  // The same taps, runs of them reading adjacent pixels grouped.
  std::vector<TapGroup> tap_groups(int64_t depth) const {
    std::vector<TapGroup> groups;
    int64_t t = 0;
    for (const int64_t offset : tap_offsets(depth)) {
      if (!groups.empty() && offset == groups.back().offset + groups.back().depth) {
        groups.back().depth += depth;
      } else {
        groups.push_back({offset, t * depth, depth});
      }
      ++t;
    }
    return groups;
  }
};

// The largest weight block the register tiles fetch ahead (NextBlock, below): it and the
// block being read both stay in the core's L2 with room for the rows streaming through
// (2/5 of it: 410 KB of AMD Zen 4/5's 1 MB, 820 KB of the 2 MB of Intel's Xeons since
// Sapphire Rapids, where BERT-base's 786 KB blocks of [768, 3072] then came in time), as
// sysconf reports it (1 MB where it does not).
inline int64_t next_block_limit() {
  static const int64_t limit = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return (l2 > 0 ? int64_t{l2} : int64_t{1} << 20) * 2 / 5;
  }();
  return limit;
}

// The weight block of a thread's next task, where it is another block than this task's:
// the register tiles after a block's first ask for one of its lines into L2 every `every`
// depth steps, so that the next block's first tile finds it there instead of waiting on
// memory (an engine's weights come from memory on every call). Empty when there is none.
// spread_over() sets `every` so that the lines come over all the tiles left, not in the
// first few: a block fetched early was pushed out of L2 by the rows streaming through it
// before the next task read it. `wait` counts down the steps to the next line.
struct NextBlock {
  const char* line = nullptr;
  const char* end = nullptr;
  int64_t every = 1;
  int64_t wait = 0;

  // Spreads the block's lines over `tiles` tiles, each a depth step of `step` units at a
  // time over every tap group.
  void spread_over(int64_t tiles, const std::vector<TapGroup>& taps, int64_t step) {
    int64_t steps = 0;
    for (const TapGroup& group : taps) {
      steps += (group.depth + step - 1) / step;
    }
    const int64_t lines = (end - line) / 64;
    every = lines > 0 ? std::max<int64_t>(1, std::max<int64_t>(1, tiles) * steps / lines) : 1;
  }
};

// The convolution's work in tasks: blocks of an image's GEMM rows by column blocks. The
// threads take contiguous runs of tasks; with `columns_outer` (a deep layer's, whose weight
// outweighs its input: each kernel has its rule) column blocks are the outer order, so each
// thread reads its share of the weight, not all of it; else rows are, so each reads its
// share of the input and writes its share of the output, on the core that reads it next.
// An image's rows split into `steps` blocks of about equal size, about `max_rows` at most
// (within a tile of `whole` rows), each starting on a whole tile (a short tile once per
// image, not per block). Given the `threads` that share them, the rows split further until
// the tasks share evenly among the threads: equal runs of tasks then hold equal rows within
// a tile (a 56 x 56 image's 25 blocks of 126 rows and one of 112 gave one thread 9% more
// rows than the other; a 7 x 7 image's 3 column blocks left one thread idle a third of the
// call).
struct ConvTasks {
  int64_t batch, rows, blocks;
  bool columns_outer;
  int64_t whole;
  int64_t steps;     // blocks of rows an image
  int64_t step = 0;  // the most rows a block holds

  ConvTasks(int64_t batch, int64_t rows, int64_t blocks, int64_t max_rows, int64_t whole,
            bool columns_outer, int64_t threads = 1)
      : batch(batch), rows(rows), blocks(blocks), columns_outer(columns_outer),
        whole(std::max<int64_t>(1, whole)) {
    // No more blocks than whole tiles: each holds one at least.
    const int64_t most = std::max<int64_t>(1, rows / this->whole);
    steps = std::min(most, std::max<int64_t>(1, (rows + max_rows - 1) / max_rows));
    for (int64_t split = steps; threads > 1 && split <= most; ++split) {
      if (batch * split * blocks % threads == 0) {
        steps = split;
        break;
      }
    }
    for (int64_t i = 0; i < steps; ++i) {
      step = std::max(step, bound(i + 1) - bound(i));
    }
  }
  // The first row of an image's block i (rows at i == steps): its share of the rows,
  // rounded down to whole tiles.
  int64_t bound(int64_t i) const {
    return i >= steps ? rows : i * rows / steps / whole * whole;
  }
  int64_t count() const { return batch * steps * blocks; }

  struct Task {
    int64_t block;      // the column block
    int64_t image_row;  // the block of rows, over every image
    int64_t image;
    int64_t first, rows;  // its rows in the image
  };
  Task at(int64_t task) const {
    const int64_t block = columns_outer ? task / (batch * steps) : task % blocks;
    const int64_t image_row = columns_outer ? task % (batch * steps) : task / blocks;
    const int64_t i = image_row % steps;
    const int64_t first = bound(i);
    return {block, image_row, image_row / steps, first, bound(i + 1) - first};
  }
  // What task `task` of a thread's run [.., end) fetches ahead: the next task's block of
  // `block_bytes` at `weights`, when it is another block and at most next_block_limit (it
  // and the block being read both stay in L2).
  // With `bytes` (0: the block's), that many of the next block's bytes from `weights` on
  // (a slice of its rows, `weights` past the slice's start).
  NextBlock next_block(int64_t task, int64_t end, const void* weights, int64_t block_bytes,
                       int64_t bytes = 0) const {
    const int64_t fetched = bytes > 0 ? bytes : block_bytes;
    if (task + 1 >= end || fetched > next_block_limit()) {
      return {};
    }
    const int64_t block = at(task).block, next = at(task + 1).block;
    if (next == block) {
      return {};
    }
    const char* start = static_cast<const char*>(weights) + next * block_bytes;
    return {start, start + fetched};
  }
};

// A buffer of `elements` T for one call's planes: the calling thread's own, grown to the
// largest it has needed up to `kept_bytes` (a fresh large allocation per call cost more
// than the copy for a small image: malloc's large blocks are returned and faulted in
// again), else `large`, made for this call.
template <typename T>
T* planes_buffer(int64_t elements, int64_t kept_bytes, at::Tensor& large) {
  thread_local std::vector<T> kept;
  if (elements * static_cast<int64_t>(sizeof(T)) <= kept_bytes) {
    kept.resize(std::max<size_t>(kept.size(), static_cast<size_t>(elements)));
    return kept.data();
  }
  large = at::empty({elements * static_cast<int64_t>(sizeof(T))}, at::kByte);
  return reinterpret_cast<T*>(large.data_ptr<uint8_t>());
}

// Where GEMM rows go: row p of image n (a plane's flat pixel index) is output pixel
// (oh, ow) = (p / plane_w, p % plane_w), dropped if ow >= out_w. Stepped row by row, without
// a division per row. The register tiles walk output pixels instead (`pixels`: rows are
// output pixels, each reading its plane row `plane_row`, (oh * walk_h, ow * walk_w) in the
// plane: ConvPlanes' strided walk): no row is dropped.
struct RowWalk {
  int64_t image_base;  // the image's first output pixel
  int64_t row_w;       // a walked row's length: plane_w, or out_w walking output pixels
  int64_t oh, ow;
  int64_t plane_w, out_w;
  int64_t last;  // the last pixel of the result (of every image)
  int64_t walk_h = 1, walk_w = 1;
  int64_t plane_row = 0;  // next()'s row's

  RowWalk(int64_t n, int64_t first_row, int64_t plane_w, int64_t batch, int64_t out_h,
          int64_t out_w, bool pixels = false, int64_t walk_h = 1, int64_t walk_w = 1)
      : image_base(n * out_h * out_w), row_w(pixels ? out_w : plane_w),
        oh(first_row / row_w), ow(first_row % row_w), plane_w(plane_w), out_w(out_w),
        last(batch * out_h * out_w - 1), walk_h(walk_h), walk_w(walk_w) {}
  // The row's output pixel (negative: dropped), then on to the next row.
  int64_t next() {
    const int64_t pixel = ow < out_w ? image_base + oh * out_w + ow : -1;
    plane_row = oh * walk_h * plane_w + ow * walk_w;
    if (++ow == row_w) {
      ow = 0;
      ++oh;
    }
    return pixel;
  }
};

}  // namespace blade::ral
