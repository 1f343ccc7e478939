// Blade's float32 and bfloat16 convolutions: the input copied (or rounded) into planes,
// register tiles of FMAs or AVX512-BF16 dot products (float_conv.h).
#include "ral/float_conv.h"

#include "ral/conv_activation.h"
#include "ral/conv_planes.h"
#include "ral/cpu_features.h"
#include "ral/lane_masks.h"
#include "ral/task_runs.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace blade::ral {
namespace {

// Output channels per block (four 16-lane vectors), output pixels per tile of a whole
// block, and the most output pixels a task's block of rows covers: a multiple of
// kTileRows, or of kStepRows where a narrower block's tiles (8 or 12 rows) run too, so that
// its tiles are whole but the last.
constexpr int64_t kColumnBlock = 64;
constexpr int64_t kTileRows = 6;
constexpr int64_t kStepRows = 24;
constexpr int64_t kMaxRowBlock = 120;
// The most bytes of planes a thread keeps between calls (larger ones are made per call).
constexpr int64_t kKeptPlaneBytes = int64_t{8} << 20;
// When the threads split a convolution by column blocks (each reading its share of the
// weight and every input row) rather than by rows (each reading all of the weight and its
// share of the rows): where the weight is more than kColumnsOuterRatio times the input, or
// larger than kSharedWeightBytes. Split by columns, each thread reads the half of its input
// the other core wrote and leaves half its output to the other core's next layer (a
// MobileNetV3 depthwise layer after such a 1x1 layer took twice its time alone); a small
// weight read by both threads costs less, a large one read twice from memory more
// (BERT-base's [768, 768], 2.4 MB). int8_conv.cpp splits by the same ratio alone.
constexpr int64_t kColumnsOuterRatio = 16;
constexpr int64_t kSharedWeightBytes = int64_t{1} << 20;

// The two kinds of element the kernel multiplies: bfloat16 pairs (storage uint16_t, a
// pixel's depth padded with a zero channel to an even count) summed by `vdpbf16ps`, or
// float32 values summed by `vfmadd231ps`. Either way one step of the depth is 4 bytes of a
// pixel broadcast against 4-byte weight words, 64 output channels in 256 bytes.
enum class Kind { kBf16, kF32 };

template <Kind K>
struct Element;
template <>
struct Element<Kind::kBf16> {
  using Type = uint16_t;
  static constexpr int64_t kStep = 2;
};
template <>
struct Element<Kind::kF32> {
  using Type = float;
  static constexpr int64_t kStep = 1;
};
template <Kind K>
using ElementType = typename Element<K>::Type;

// Whether the tiles run on AVX-512 (F, BW and VL), else on AVX2 and FMA (float32 only).
bool avx512_tiles() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl");
  return available;
}

std::atomic<bool> f32_enabled{true};
std::atomic<int64_t> bf16_calls{0};
std::atomic<int64_t> f32_calls{0};
std::atomic<int64_t> sliced_calls{0};

// A pixel's depth: the channels, padded to whole steps.
template <Kind K>
int64_t padded_depth(int64_t channels) {
  return (channels + Element<K>::kStep - 1) / Element<K>::kStep * Element<K>::kStep;
}

// The planes the kernels read an input through: the padded image, walked with the stride
// by a filter of fewer than 5 columns, else stride-phase planes (conv_planes.h).
ConvPlanes planes_of(int64_t height, int64_t width, int64_t kh, int64_t kw,
                     at::IntArrayRef stride, at::IntArrayRef padding) {
  return ConvPlanes(height, width, kh, kw, stride[0], stride[1], padding[0], padding[1],
                    /*strided_walk=*/kw < 5);
}

// Whether the kind's kernel reads the input as its own plane: no padding, and a pixel's
// channels a whole number of depth steps.
template <Kind K>
bool input_is_plane(const ConvPlanes& planes, int64_t channels) {
  return planes.input_is_plane() && padded_depth<K>(channels) == channels;
}

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// n float32 values rounded to bfloat16 (to nearest, ties to even; NaN stays NaN) at `dst`,
// then `pad` zeros.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_values(
    const float* src, uint16_t* dst, int64_t n, int64_t pad) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i>(rounded));
  }
  if (i < n) {
    const __mmask16 mask = lanes_left(n - i);
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + i));
    _mm256_mask_storeu_epi16(dst + i, mask, reinterpret_cast<__m256i>(rounded));
  }
  std::fill(dst + n, dst + n + pad, uint16_t{0});
}

// n float32 values stored as the kind's elements at `dst` (bfloat16: rounded), then `pad`
// zeros.
void store_values(const float* src, uint16_t* dst, int64_t n, int64_t pad) {
  round_values(src, dst, n, pad);
}
void store_values(const float* src, float* dst, int64_t n, int64_t pad) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  std::fill(dst + n, dst + n + pad, 0.0f);
}

// `channels` float32 values from `src` on, each times its channel's `scale`, at `dst`
// (scale_values: by AVX-512 or AVX2).
__attribute__((target("avx2"))) void scale_values_avx2(const float* src, float* dst,
                                                       int64_t channels, const float* scale) {
  for (int64_t c = 0; c < channels; ++c) {  // vectorised by the compiler
    dst[c] = src[c] * scale[c];
  }
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) void scale_values_avx512(
    const float* src, float* dst, int64_t channels, const float* scale) {
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 mask = lanes_left(channels - c);
    _mm512_mask_storeu_ps(dst + c, mask,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, src + c),
                                        _mm512_maskz_loadu_ps(mask, scale + c)));
  }
}
void scale_values(const float* src, float* dst, int64_t channels, const float* scale) {
  if (avx512_tiles()) {
    scale_values_avx512(src, dst, channels, scale);
  } else {
    scale_values_avx2(src, dst, channels, scale);
  }
}

// `rows` rows of `channels` float32 values from `src` on, each times its channel's
// `scale` (null: as they are), stored as the kind's elements at `dst` (bfloat16: rounded).
template <typename T>
void store_rows(const float* src, T* dst, int64_t rows, int64_t channels, const float* scale) {
  if (scale == nullptr) {
    store_values(src, dst, rows * channels, 0);
    return;
  }
  thread_local std::vector<float> scaled;  // a bfloat16 row's float32 values, scaled
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (std::is_same_v<T, float>) {
      scale_values(src + r * channels, dst + r * channels, channels, scale);
    } else {
      scaled.resize(static_cast<size_t>(channels));
      scale_values(src + r * channels, scaled.data(), channels, scale);
      store_values(scaled.data(), dst + r * channels, channels, 0);
    }
  }
}

// acc + the products of one depth step: 16 float32 sums, `x` the pixel's step broadcast,
// `w` 16 output channels' weight words. The bfloat16 dot product is written as an
// instruction so that the tiles need no AVX512-BF16 target, and their float32 instances
// none of its code.
template <Kind K>
__attribute__((target("avx512f"), always_inline)) inline __m512 multiply_add(__m512 acc,
                                                                              __m512i x,
                                                                              __m512i w) {
  if constexpr (K == Kind::kF32) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(w), acc);
  } else {
    asm("vdpbf16ps {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
  }
}

// How many depth steps ahead a block's first tile fetches its weight rows.
constexpr int64_t kFetchSteps = 32;

// How a tile starts and ends: its sums from zero, or from the values `out` holds (a
// deep 1x1 convolution's later slices of depth add to its earlier ones); then the bias
// (null: none), a tensor of the result's layout added (null: none) and ReLU before the
// store.
struct TileEnd {
  const float* bias = nullptr;
  bool relu = false;
  bool accumulate = false;
  const float* added = nullptr;
};

// A tile's sums stored as float32: plus the bias (`offset`) and, where kAdds, the tensor
// added at the same place, then ReLU where `relu`. An instance of its own without a tensor
// added: tested per vector, a 1x1 layer of 72 channels over 56 x 56 pixels took 10% longer
// in its tiles.
template <bool kAdds, int kRows, int kVecs>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void store_tile(
    const __m512 (&acc)[kRows][kVecs], const __m512 (&offset)[kVecs],
    const __mmask16 (&masks)[kVecs], const int64_t (&pixels)[kRows], const float* added,
    bool relu, float* out, int64_t out_channels, int64_t column) {
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    float* at = out + pixels[r] * out_channels + column;
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      __m512 value = _mm512_add_ps(acc[r][v], offset[v]);
      if constexpr (kAdds) {  // (conv + bias) + added, as eager rounds it
        value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(
                                         masks[v], added + pixels[r] * out_channels + column +
                                                       16 * v));
      }
      if (relu) {
        value = _mm512_max_ps(zero, value);  // the second operand where either is NaN
      }
      // A whole vector's store unmasked: on an AMD EPYC a 16-channel 1x1 layer at 112 x 112
      // took 145 us with masked stores, about 85 without.
      if (masks[v] == 0xFFFF) {
        _mm512_storeu_ps(at + 16 * v, value);
      } else {
        _mm512_mask_storeu_ps(at + 16 * v, masks[v], value);
      }
    }
  }
}

// A tile of kRows output pixels (as `walk` steps over them; plane pixel p at `image` + (p -
// `base`) x depth) by kVecs x 16 output channels of a block (`width` of them real; the
// block's weight rows of words `ldb` apart, a row per depth step, read whole: a pack's
// padding, or with kMaskB masked to the width: a GEMM's b, which may end there; masked
// loads took 15% longer in a ResNet-50): the products of every tap group summed in kVecs x
// kRows registers (from `end`'s start), then the bias, the tensor added and ReLU, stored
// as float32 (`out_channels` apart).
template <Kind K, int kRows, int kVecs, bool kMaskB, bool kFetch = false>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void conv_tile(
    const ElementType<K>* image, int64_t base, int64_t depth, const std::vector<TapGroup>& taps,
    const uint32_t* b, int64_t ldb, RowWalk& walk, int64_t width, int64_t out_channels,
    int64_t column, const TileEnd& end, float* out, NextBlock& next) {
  constexpr int64_t kStep = Element<K>::kStep;
  int64_t pixels[kRows];
  const ElementType<K>* x[kRows];
  RowWalk rows = walk;  // stepped in a local copy, as int8_conv.cpp's tiles
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    pixels[r] = rows.next();
    x[r] = image + (rows.plane_row - base) * depth;
  }
  walk = rows;
  __mmask16 masks[kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    masks[v] = lanes_left(width - 16 * v);
  }
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = end.accumulate ? _mm512_maskz_loadu_ps(
                                       masks[v], out + pixels[r] * out_channels + column + 16 * v)
                                 : _mm512_setzero_ps();
    }
  }
  // The next block's lines (conv_planes.h) in locals: the stores below may alias `next`.
  const char* next_line = next.line;
  const char* const next_end = next.end;
  const int64_t next_every = next.every;
  int64_t next_wait = next.wait;
  for (const TapGroup& group : taps) {
    const uint32_t* b_group = b + group.weight_row / kStep * ldb;
    for (int64_t k = 0; k < group.depth; k += kStep) {
      const uint32_t* row = b_group + k / kStep * ldb;
      if constexpr (!kFetch) {
        if (next_line < next_end && --next_wait <= 0) {
          _mm_prefetch(next_line, _MM_HINT_T1);
          next_line += 64;
          next_wait = next_every;
        }
      }
      __m512i w[kVecs];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) {
        if constexpr (kFetch) {  // (a prefetch past the weight's end asks for nothing read)
          _mm_prefetch(reinterpret_cast<const char*>(row + kFetchSteps * ldb + 16 * v),
                       _MM_HINT_T1);
        }
        w[v] = kMaskB ? _mm512_maskz_loadu_epi32(masks[v], row + 16 * v)
                      : _mm512_loadu_si512(row + 16 * v);
      }
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) {
        uint32_t bits;
        std::memcpy(&bits, x[r] + group.offset + k, sizeof bits);
        const __m512i step = _mm512_set1_epi32(static_cast<int>(bits));
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) {
          acc[r][v] = multiply_add<K>(acc[r][v], step, w[v]);
        }
      }
    }
  }
  next.line = next_line;
  next.wait = next_wait;
  __m512 offset[kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    offset[v] = end.bias != nullptr ? _mm512_maskz_loadu_ps(masks[v], end.bias + column + 16 * v)
                                    : _mm512_setzero_ps();
  }
  // In locals: the stores may alias `end`, whose fields would be read again.
  const float* const added = end.added;
  const bool relu = end.relu;
  if (added != nullptr) {
    store_tile<true>(acc, offset, masks, pixels, added, relu, out, out_channels, column);
  } else {
    store_tile<false>(acc, offset, masks, pixels, added, relu, out, out_channels, column);
  }
}

// The products of a 16-channel slice of a block's weight rows (`weights`, `ldb` apart)
// added to kRows x 2 sums, over every tap group: kFetch fetches the rows kFetchSteps
// ahead.
template <int kRows, bool kFetch>
__attribute__((target("avx2,fma"), always_inline)) inline void slice_sums(
    __m256 (&acc)[kRows][2], const float* const (&x)[kRows], const std::vector<TapGroup>& taps,
    const float* weights, int64_t ldb) {
  for (const TapGroup& group : taps) {
    const float* row = weights + group.weight_row * ldb;
    const float* at[kRows];
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      at[r] = x[r] + group.offset;
    }
#pragma GCC unroll 2
    for (int64_t k = 0; k < group.depth; ++k, row += ldb) {
      if constexpr (kFetch) {
        _mm_prefetch(reinterpret_cast<const char*>(row + kFetchSteps * ldb), _MM_HINT_T1);
      }
      const __m256 w0 = _mm256_loadu_ps(row);
      const __m256 w1 = _mm256_loadu_ps(row + 8);
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) {
        const __m256 step = _mm256_broadcast_ss(at[r] + k);
        acc[r][0] = _mm256_fmadd_ps(step, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(step, w1, acc[r][1]);
      }
    }
  }
}

// conv_tile on a CPU with AVX2 and FMA but no AVX-512 (float32, the weight rows read
// whole): kRows output pixels by the block's `width` channels, 16 at a time (12 sums, two
// weight vectors and the broadcast step fill the 16 registers), each slice of 16 channels
// over every tap group while the tile's input rows stay in L1; then the same end.
template <int kRows, bool kFetch = false>
__attribute__((target("avx2,fma"))) void conv_tile_avx2(
    const float* image, int64_t base, int64_t depth, const std::vector<TapGroup>& taps,
    const uint32_t* b, int64_t ldb, RowWalk& walk, int64_t width, int64_t out_channels,
    int64_t column, const TileEnd& end, float* out, NextBlock& next) {
  int64_t pixels[kRows];
  const float* x[kRows];
  RowWalk rows = walk;
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    pixels[r] = rows.next();
    x[r] = image + (rows.plane_row - base) * depth;
  }
  walk = rows;
  // In locals: the stores below may alias `end` and `next`.
  const float* const bias = end.bias;
  const float* const added = end.added;
  const bool relu = end.relu;
  const bool accumulate = end.accumulate;
  NextBlock fetch = next;
  int64_t steps = 0;  // depth steps a pass
  for (const TapGroup& group : taps) {
    steps += group.depth;
  }
  const auto* weights = reinterpret_cast<const float*>(b);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t c = 0; c < width; c += 16) {
    const __m256i masks[2] = {lanes8(width - c), lanes8(width - c - 8)};
    const bool whole = width - c >= 16;
    __m256 acc[kRows][2];
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      for (int v = 0; v < 2; ++v) {
        acc[r][v] = accumulate ? _mm256_maskload_ps(
                                     out + pixels[r] * out_channels + column + c + 8 * v,
                                     masks[v])
                               : zero;
      }
    }
    if constexpr (!kFetch) {
      // The next block's (or streamed slice's) lines due over this pass's steps, asked for
      // at its start (asked for step by step, the test and count took issue slots from
      // the products).
      fetch.wait -= steps;
      while (fetch.wait <= 0 && fetch.line < fetch.end) {
        _mm_prefetch(fetch.line, _MM_HINT_T1);
        fetch.line += 64;
        fetch.wait += fetch.every;
      }
    }
    slice_sums<kRows, kFetch>(acc, x, taps, weights + c, ldb);
    __m256 offset[2];
    for (int v = 0; v < 2; ++v) {
      offset[v] = bias != nullptr ? _mm256_maskload_ps(bias + column + c + 8 * v, masks[v])
                                  : zero;
    }
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      float* at = out + pixels[r] * out_channels + column + c;
      for (int v = 0; v < 2; ++v) {
        __m256 value = _mm256_add_ps(acc[r][v], offset[v]);
        if (added != nullptr) {  // (conv + bias) + added, as eager rounds it
          value = _mm256_add_ps(
              value, _mm256_maskload_ps(added + pixels[r] * out_channels + column + c + 8 * v,
                                        masks[v]));
        }
        if (relu) {
          value = _mm256_max_ps(zero, value);  // the second operand where either is NaN
        }
        if (whole) {
          _mm256_storeu_ps(at + 8 * v, value);
        } else {
          _mm256_maskstore_ps(at + 8 * v, masks[v], value);
        }
      }
    }
  }
  next.line = fetch.line;
  next.wait = fetch.wait;
}
#pragma GCC diagnostic pop

// One tile: conv_tile, or with kAvx2 its AVX2 form (float32; kVecs unused).
template <Kind K, int kRows, int kVecs, bool kMaskB, bool kAvx2, bool kFetch = false>
inline void one_tile(const ElementType<K>* image, int64_t base, int64_t depth,
                     const std::vector<TapGroup>& taps, const uint32_t* b, int64_t ldb,
                     RowWalk& walk, int64_t width, int64_t out_channels, int64_t column,
                     const TileEnd& end, float* out, NextBlock& next) {
  if constexpr (kAvx2) {
    conv_tile_avx2<kRows, kFetch>(image, base, depth, taps, b, ldb, walk, width, out_channels,
                                  column, end, out, next);
  } else {
    conv_tile<K, kRows, kVecs, kMaskB, kFetch>(image, base, depth, taps, b, ldb, walk, width,
                                               out_channels, column, end, out, next);
  }
}

// The tile of `left` < kRows rows (the last of a block), by kVecs vectors.
template <Kind K, int kVecs, int kRows, bool kMaskB, bool kAvx2>
void tail_tile(int64_t left, const ElementType<K>* image, int64_t base, int64_t depth,
               const std::vector<TapGroup>& taps, const uint32_t* b, int64_t ldb, RowWalk& walk,
               int64_t width, int64_t out_channels, int64_t column, const TileEnd& end,
               float* out, NextBlock& next) {
  if constexpr (kRows > 0) {
    if (left == kRows) {
      one_tile<K, kRows, kVecs, kMaskB, kAvx2>(image, base, depth, taps, b, ldb, walk, width,
                                               out_channels, column, end, out, next);
      return;
    }
    tail_tile<K, kVecs, kRows - 1, kMaskB, kAvx2>(left, image, base, depth, taps, b, ldb,
                                                  walk, width, out_channels, column, end, out,
                                                  next);
  }
}

// `rows` output pixels from `walk`'s on by kVecs vectors of one block of output channels,
// in tiles of kRows (about 24 sums in registers, which the products' latency needs; AVX2's
// 12) and a shorter last one.
template <Kind K, int kVecs, int kRows, bool kMaskB, bool kAvx2 = false>
void tiles_of(const ElementType<K>* image, int64_t base, int64_t rows, int64_t depth,
              const std::vector<TapGroup>& taps, const uint32_t* b, int64_t ldb, RowWalk& walk,
              int64_t width, int64_t out_channels, int64_t column, const TileEnd& end,
              float* out, NextBlock next) {
  // (An AVX2 tile asks for the next lines in each of its passes over 16 channels.)
  next.spread_over((rows / kRows - 1) * (kAvx2 ? (width + 15) / 16 : 1), taps,
                   Element<K>::kStep);
  int64_t r = 0;
  if (kRows <= rows) {  // the first tile reads the block's weight from memory: fetched ahead
    one_tile<K, kRows, kVecs, kMaskB, kAvx2, true>(image, base, depth, taps, b, ldb, walk,
                                                   width, out_channels, column, end, out,
                                                   next);
    r = kRows;
  }
  for (; r + kRows <= rows; r += kRows) {
    one_tile<K, kRows, kVecs, kMaskB, kAvx2>(image, base, depth, taps, b, ldb, walk, width,
                                             out_channels, column, end, out, next);
  }
  tail_tile<K, kVecs, kRows - 1, kMaskB, kAvx2>(rows - r, image, base, depth, taps, b, ldb,
                                                walk, width, out_channels, column, end, out,
                                                next);
}

// `rows` output pixels from `walk`'s on by one block of output channels, its `width` real
// ones in as few vectors as cover them (a narrow layer's block is mostly padding).
template <Kind K, bool kMaskB>
void tile_rows(const ElementType<K>* image, int64_t base, int64_t rows, int64_t depth,
               const std::vector<TapGroup>& taps, const uint32_t* b, int64_t ldb, RowWalk walk,
               int64_t width, int64_t out_channels, int64_t column, const TileEnd& end,
               float* out, NextBlock next = {}) {
  if constexpr (K == Kind::kF32 && !kMaskB) {
    if (!avx512_tiles()) {
      tiles_of<K, 2, kTileRows, false, true>(image, base, rows, depth, taps, b, ldb, walk,
                                             width, out_channels, column, end, out, next);
      return;
    }
  }
  switch ((width + 15) / 16) {
    case 1:
      tiles_of<K, 1, 12, kMaskB>(image, base, rows, depth, taps, b, ldb, walk, width,
                                 out_channels, column, end, out, next);
      break;
    case 2:
      tiles_of<K, 2, 12, kMaskB>(image, base, rows, depth, taps, b, ldb, walk, width,
                                 out_channels, column, end, out, next);
      break;
    case 3:
      tiles_of<K, 3, 8, kMaskB>(image, base, rows, depth, taps, b, ldb, walk, width,
                                out_channels, column, end, out, next);
      break;
    default:
      tiles_of<K, 4, kTileRows, kMaskB>(image, base, rows, depth, taps, b, ldb, walk, width,
                                        out_channels, column, end, out, next);
      break;
  }
}

// The planes of `batch` NHWC float32 images as the kind's elements, `depth` a pixel (zeros
// past the channels and in the padding), at `dst`, plane row by plane row.
template <Kind K>
void fill_planes(const float* input, int64_t batch, int64_t height, int64_t width,
                 int64_t channels, int64_t depth, const ConvPlanes& planes,
                 ElementType<K>* dst) {
  using T = ElementType<K>;
  const int64_t plane_w = planes.plane_w;
  const int64_t row_elements = plane_w * depth;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / row_elements);
  at::parallel_for(0, planes.plane_rows(batch), grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<T> rounded;  // a bfloat16 input row, for a few channels a pixel
    for (int64_t row = begin; row < end; ++row) {
      const auto [n, h, first_w] = planes.row(row);
      T* line_out = dst + row * row_elements;
      if (h < 0 || h >= height) {
        std::fill(line_out, line_out + row_elements, T{0});
        continue;
      }
      const float* line = input + (n * height + h) * width * channels;
      if (planes.step_w == 1 && depth == channels) {  // whole runs of pixels at once
        const int64_t lo = std::clamp<int64_t>(-first_w, 0, plane_w);
        const int64_t hi = std::clamp<int64_t>(width - first_w, lo, plane_w);
        std::fill(line_out, line_out + lo * depth, T{0});
        store_values(line + (lo + first_w) * channels, line_out + lo * depth,
                     (hi - lo) * channels, (plane_w - hi) * depth);
        continue;
      }
      // A few channels a pixel (a stem's): a bfloat16 row rounded in one call, then its
      // pixels picked, with no call per pixel.
      const bool whole_row = channels < 16;
      const T* source = nullptr;
      if constexpr (K == Kind::kBf16) {
        if (whole_row) {
          // One element of slack: an image's pixel is moved as 8 bytes below.
          rounded.resize(static_cast<size_t>(width * channels + 1));
          round_values(line, rounded.data(), width * channels, 1);
          source = rounded.data();
        }
      } else {
        source = line;
      }
      // Plane columns [lo, hi) lie inside the image; the rest is padding.
      const int64_t step = planes.step_w;
      const int64_t lo = std::min(plane_w, first_w >= 0 ? 0 : (-first_w + step - 1) / step);
      const int64_t hi = first_w >= width
                             ? lo
                             : std::max(lo, std::min(plane_w, (width - 1 - first_w) / step + 1));
      std::fill(line_out, line_out + lo * depth, T{0});
      std::fill(line_out + hi * depth, line_out + plane_w * depth, T{0});
      for (int64_t x = lo; x < hi; ++x) {
        const int64_t w = x * step + first_w;
        T* pixel = line_out + x * depth;
        if (!whole_row) {
          store_values(line + w * channels, pixel, channels, depth - channels);
        } else if (K == Kind::kBf16 && channels == 3 && depth == 4) {
          // An image's: one 8-byte move, the 4th 0.
          uint64_t bits;
          std::memcpy(&bits, source + w * channels, sizeof bits);
          bits &= 0x0000FFFFFFFFFFFFull;
          std::memcpy(pixel, &bits, sizeof bits);
        } else {
          const T* from = source + w * channels;
          for (int64_t c = 0; c < depth; ++c) {  // no call per pixel
            pixel[c] = c < channels ? from[c] : T{0};
          }
        }
      }
    }
  });
}

// The kind's pack of a float32 weight [O, C, kh, kw] (float_conv.h), as `Packed` elements
// (bfloat16 bits, or float32).
template <Kind K, typename Packed, at::ScalarType kDtype>
at::Tensor pack_weight(const at::Tensor& weight, const char* what) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 4, what,
              ": a float32 [O, C, kh, kw] weight is needed, got ", weight.scalar_type(),
              weight.sizes());
  constexpr int64_t kStep = Element<K>::kStep;
  const int64_t out_channels = weight.size(0), channels = weight.size(1);
  const int64_t kh = weight.size(2), kw = weight.size(3);
  const int64_t depth = padded_depth<K>(channels);
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  // bfloat16: rounded as the input is (ATen's rounding: to nearest, ties to even).
  const at::Tensor values = K == Kind::kBf16 ? weight.contiguous().to(at::kBFloat16)
                                             : weight.contiguous();
  const auto* w = static_cast<const Packed*>(values.const_data_ptr());
  at::Tensor packed = at::zeros({blocks * kh * kw * depth * kColumnBlock}, kDtype);
  auto* data = static_cast<Packed*>(packed.data_ptr());
  const auto order = tap_order(kh, kw);
  for (int64_t o = 0; o < out_channels; ++o) {
    Packed* block = data + (o / kColumnBlock) * kh * kw * depth * kColumnBlock;
    for (int64_t t = 0; t < kh * kw; ++t) {
      const auto [i, j] = order[t];
      for (int64_t c = 0; c < channels; ++c) {
        block[(t * depth + c / kStep * kStep) * kColumnBlock + (o % kColumnBlock) * kStep +
              c % kStep] = w[((o * channels + c) * kh + i) * kw + j];
      }
    }
  }
  return packed;
}

template <Kind K>
int64_t pack_bytes(int64_t out_channels, int64_t channels, int64_t kh, int64_t kw) {
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  return blocks * kh * kw * padded_depth<K>(channels) * kColumnBlock *
         static_cast<int64_t>(sizeof(ElementType<K>));
}

// The depth a slice of a deep 1x1 convolution takes (convolve): its weight rows of a
// column block and its columns of `rows` input rows at most kSliceBytes together, in equal
// slices of whole 256-unit steps; `depth` itself where one slice holds it all.
constexpr int64_t kSliceBytes = int64_t{1} << 20;
// The depth steps of a streamed layer's slices (convolve): 32 KB of a block's float32
// weight rows, within L1.
constexpr int64_t kStreamSlice = 128;
int64_t depth_slice(int64_t depth, int64_t rows, size_t element_bytes) {
  constexpr int64_t kUnit = 256;
  const int64_t unit_bytes = (kColumnBlock + rows) * static_cast<int64_t>(element_bytes);
  const int64_t fits = std::max<int64_t>(kUnit, kSliceBytes / unit_bytes / kUnit * kUnit);
  if (fits >= depth) {
    return depth;
  }
  const int64_t slices = (depth + fits - 1) / fits;
  return (depth + slices * kUnit - 1) / (slices * kUnit) * kUnit;
}

// The depth [0, depth) in parts of `step` units (the last one shorter), each part as the
// one tap group a 1x1 layer's tiles run over it.
std::vector<std::vector<TapGroup>> depth_parts(int64_t depth, int64_t step) {
  std::vector<std::vector<TapGroup>> parts;
  for (int64_t from = 0; from < depth; from += step) {
    parts.push_back({{from, from, std::min(step, depth - from)}});
  }
  return parts;
}

// The convolution by the kind's tiles (float_conv.h's bf16_conv and f32_conv).
template <Kind K>
void convolve(const char* what, const float* input, int64_t batch, int64_t height,
              int64_t width, int64_t channels, const at::Tensor& packed, int64_t out_channels,
              int64_t kh, int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding,
              const float* bias, ConvActivation activation, float* out, const float* added,
              const float* input_scale) {
  using T = ElementType<K>;
  const bool relu = activation == ConvActivation::kRelu;
  const bool pass = activation_pass(activation);  // SiLU or hardswish after the sums
  TORCH_CHECK(K == Kind::kBf16 ? bf16_conv_available() : f32_conv_available(), what,
              ": this CPU lacks ", K == Kind::kBf16 ? "AVX512-BF16" : "AVX2 and FMA");
  TORCH_CHECK(packed.scalar_type() == (K == Kind::kBf16 ? at::kShort : at::kFloat), what,
              ": the packed weight is ", packed.scalar_type(), ", not ",
              K == Kind::kBf16 ? "bfloat16 bits" : "float32");
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && stride[0] > 0 && stride[1] > 0 &&
                  padding[0] >= 0 && padding[1] >= 0,
              what, ": two positive strides and two paddings not negative are needed, got ",
              stride, " and ", padding);
  // The tiles read each row at its own position: a strided filter of fewer than 5 columns
  // reads the padded image stepping by the stride (ConvPlanes' strided walk), its copy the
  // padding only, row by row, or none.
  const ConvPlanes planes = planes_of(height, width, kh, kw, stride, padding);
  TORCH_CHECK(planes.filter_fits(), what, ": a ", kh, " x ", kw, " filter does not fit the ",
              height, " x ", width, " input padded by ", padding);
  const int64_t depth = padded_depth<K>(channels);
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  const int64_t block_elements = kh * kw * depth * kColumnBlock;
  TORCH_CHECK(packed.nbytes() == static_cast<size_t>(pack_bytes<K>(out_channels, channels, kh,
                                                                    kw)) &&
                  packed.is_contiguous(),
              what, ": the packed weight does not fit ", out_channels, " x ", channels, " x ",
              kh, " x ", kw);
  const int64_t out_h = planes.out_h, out_w = planes.out_w;
  (K == Kind::kBf16 ? bf16_calls : f32_calls).fetch_add(1, std::memory_order_relaxed);
  if (batch <= 0 || out_h <= 0 || out_w <= 0 || out_channels <= 0) {
    return;
  }
  if (channels == 0) {  // no products: the bias (and ReLU) alone
    for (int64_t p = 0; p < batch * out_h * out_w; ++p) {
      for (int64_t o = 0; o < out_channels; ++o) {
        const int64_t at = p * out_channels + o;
        const float value =
            (bias != nullptr ? bias[o] : 0.0f) + (added != nullptr ? added[at] : 0.0f);
        out[at] = relu && value < 0.0f ? 0.0f : value;
      }
    }
    activation_dense(activation, out, batch * out_h * out_w * out_channels);
    return;
  }

  const std::vector<TapGroup> taps = planes.tap_groups(depth);
  const auto* weights = static_cast<const uint32_t*>(packed.const_data_ptr());
  const int64_t block_words = block_elements / Element<K>::kStep;
  const int64_t block_bytes = block_words * static_cast<int64_t>(sizeof(uint32_t));
  // Tasks: blocks of output pixels (whole tiles but the last) by column blocks.
  const int64_t rows = out_h * out_w;
  const int64_t weight_bytes = blocks * block_elements * static_cast<int64_t>(sizeof(T));
  const int64_t input_bytes = batch * rows * depth * static_cast<int64_t>(sizeof(T));
  const bool columns_outer =
      weight_bytes > input_bytes && (weight_bytes > kColumnsOuterRatio * input_bytes ||
                                     weight_bytes > kSharedWeightBytes);
  const ConvTasks work(batch, rows, blocks, kMaxRowBlock,
                       out_channels % kColumnBlock == 0 ? kTileRows : kStepRows, columns_outer,
                       at::get_num_threads());
  // Without padding the input is the plane (a strided 1x1's read stepping by the stride):
  // a float32 one is read as it is; a bfloat16 1x1 convolution of stride 1 taking its rows
  // in turn rounds each block of them just before its products, in the thread's cache (a
  // large image's planes went through memory twice more). Otherwise the planes are made
  // first.
  // An input scaled per image and channel (a squeeze-excitation's) is scaled where it is
  // rounded: in the rows taken in turn (float32 ones too), or into the planes.
  const bool input_is_plane = ral::input_is_plane<K>(planes, channels);
  TORCH_CHECK(input_scale == nullptr || input_is_plane, what,
              ": an input scale needs an input read as its plane (no padding)");
  const bool as_it_is = K == Kind::kF32 && input_is_plane && input_scale == nullptr;
  const bool rows_in_turn = (K == Kind::kBf16 || input_scale != nullptr) && !columns_outer &&
                            kh == 1 && kw == 1 && input_is_plane && planes.walk_h == 1 &&
                            planes.walk_w == 1;
  const int64_t image_elements = planes.image_elements(depth);
  const T* planes_data = nullptr;
  at::Tensor large;
  if (as_it_is) {
    planes_data = reinterpret_cast<const T*>(input);
  } else if (!rows_in_turn) {
    const int64_t elements = batch * image_elements;
    T* dst = planes_buffer<T>(elements, kKeptPlaneBytes, large);
    if (input_is_plane && input_scale != nullptr) {  // scaled a run of one image at a time
      const int64_t pixels = height * width;
      at::parallel_for(0, batch * pixels, (int64_t{1} << 14) / std::max<int64_t>(1, channels),
                       [&](int64_t begin, int64_t end) {
                         for (int64_t p = begin; p < end;) {
                           const int64_t image = p / pixels;
                           const int64_t run = std::min(end, (image + 1) * pixels) - p;
                           store_rows(input + p * channels, dst + p * channels, run, channels,
                                      input_scale + image * channels);
                           p += run;
                         }
                       });
    } else if (input_is_plane) {
      // The input is the plane: rounded in even shares.
      at::parallel_for(0, elements, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
        store_values(input + begin, dst + begin, end - begin, 0);
      });
    } else {
      fill_planes<K>(input, batch, height, width, channels, depth, planes, dst);
    }
    planes_data = dst;
  }
  // A deep 1x1 convolution whose threads each walk every row for their column blocks (a
  // transformer's second FFN matmul: [128, 3072] by [3072, 768], a 786 KB block of weight
  // rows and 1.5 MB of rows, more than a core's L2 together) runs in slices of its depth:
  // for each slice every task adds the slice's products to what the slices before it
  // stored (bit for bit the sums of one pass: float32 stored and loaded exactly), the
  // slice's weight rows and input columns staying in L2 across the tasks.
  const int64_t slice = columns_outer && !rows_in_turn && kh == 1 && kw == 1
                            ? depth_slice(depth, batch * rows, sizeof(T))
                            : depth;
  // A block's bytes of weight rows for `units` of the depth.
  const auto rows_bytes = [](int64_t units) {
    return units / Element<K>::kStep * kColumnBlock * static_cast<int64_t>(sizeof(uint32_t));
  };
  // Each slice's one tap group (none: the taps themselves serve).
  const std::vector<std::vector<TapGroup>> slices =
      slice < depth ? depth_parts(depth, slice) : std::vector<std::vector<TapGroup>>{};
  // A 1x1 layer of one full tile of rows and a shorter one an image (a linear layer over 7
  // to 11 tokens; a task's rows are of one image), its weight outweighing them, streams
  // the weight from memory while the short tile, a second pass over each block, left the
  // memory idle (BERT-base at 8 tokens: a tenth of its time). Each task runs in slices of
  // kStreamSlice depth steps instead, both tiles over a slice while its weight rows are in
  // L1, the first tile's fetches running on into the next slice. More rows lost: their
  // slices' partial sums stored and loaded cost more than the idle memory; so did
  // bfloat16's tiles, whose dot products run at half the FMA rate on AVX512-BF16 without
  // AMX, more bound by their products than by memory.
  const bool streamed = K == Kind::kF32 && slice == depth && columns_outer && !rows_in_turn &&
                        kh == 1 && kw == 1 && rows > kTileRows && rows < 2 * kTileRows &&
                        depth > kStreamSlice;
  const std::vector<std::vector<TapGroup>> task_slices =
      streamed ? depth_parts(depth, kStreamSlice) : std::vector<std::vector<TapGroup>>{};
  if (!slices.empty() || streamed) {
    sliced_calls.fetch_add(1, std::memory_order_relaxed);
  }
  // A task's depth slices run in order on one thread, one after another for all its
  // tasks (the partial sums of one slice added by the next): with slices, the threads keep
  // at::parallel_for's runs; else they take each other's last tasks (task_runs.h), as the
  // int8 kernel's do.
  const auto body = [&](const auto& take) {
    thread_local std::vector<T> block_rows;  // rows_in_turn's rounded rows
    int64_t rounded = -1;                    // the image row they are
    // Task `task`'s products over the depth [from, to) (its tap groups `part`), added to
    // what earlier parts stored; `next`: the lines its later tiles ask for.
    const auto run = [&](int64_t task, int64_t from, int64_t to,
                         const std::vector<TapGroup>& part, const NextBlock& next) {
      const bool last = to == depth;
      const TileEnd tile_end{last ? bias : nullptr, last && relu, from > 0,
                             last ? added : nullptr};
      const auto [block, image_row, n, first, count] = work.at(task);
      const T* image = nullptr;
      int64_t base = 0;
      if (!rows_in_turn) {
        image = planes_data + n * image_elements;
      } else {
        if (rounded != image_row) {  // the row block's other column blocks reuse it
          block_rows.resize(std::max<size_t>(block_rows.size(),
                                             static_cast<size_t>(count * depth)));
          store_rows(input + (n * rows + first) * channels, block_rows.data(), count,
                     channels, input_scale != nullptr ? input_scale + n * channels : nullptr);
          rounded = image_row;
        }
        image = block_rows.data();
        base = first;
      }
      const int64_t column = block * kColumnBlock;
      const int64_t width = std::min(kColumnBlock, out_channels - column);
      tile_rows<K, false>(image, base, count, depth, part, weights + block * block_words,
                          kColumnBlock,
                          RowWalk(n, first, planes.plane_w, batch, out_h, out_w,
                                  /*pixels=*/true, planes.walk_h, planes.walk_w),
                          width, out_channels, column, tile_end, out, next);
      // SiLU or hardswish over the task's block while it is in cache (in the tiles,
      // their constants and temporaries would take registers from the sums).
      if (last && pass) {
        activation_rows(activation, out + (n * rows + first) * out_channels + column, count,
                        width, out_channels);
      }
    };
    int64_t task = 0, end = 0;
    if (streamed) {
      while (take(task, end)) {
        const char* block_weights =
            reinterpret_cast<const char*>(weights + work.at(task).block * block_words);
        for (size_t i = 0; i < task_slices.size(); ++i) {
          const TapGroup& group = task_slices[i].front();
          // On AVX2 the tiles after the first ask for the next slice's weight rows: the
          // first tile's passes over 16 channels each read from memory otherwise.
          NextBlock next;
          if (!avx512_tiles() && i + 1 < task_slices.size()) {
            const TapGroup& following = task_slices[i + 1].front();
            next.line = block_weights + rows_bytes(following.weight_row);
            next.end = next.line + rows_bytes(following.depth);
          }
          run(task, group.weight_row, group.weight_row + group.depth, task_slices[i], next);
        }
      }
      return;
    }
    if (slice == depth) {
      while (take(task, end)) {
        run(task, 0, depth, taps, work.next_block(task, end, weights, block_bytes));
      }
      return;
    }
    // Slices: the thread's whole run, from the first task `take` gives.
    if (!take(task, end)) {
      return;
    }
    const int64_t begin = task;
    for (int64_t from = 0; from < depth; from += slice) {
      const int64_t to = std::min(depth, from + slice);
      const std::vector<TapGroup>& slice_taps = slices.empty() ? taps : slices[from / slice];
      for (task = begin; task < end; ++task) {
        // The next task's weight rows ahead (of this slice: its first block's at a
        // slice's end were read from memory by the slice's first tile anyway).
        const NextBlock next = work.next_block(
            task, end, reinterpret_cast<const char*>(weights) + rows_bytes(from), block_bytes,
            rows_bytes(slice));
        run(task, from, to, slice_taps, next);
      }
    }
  };
  if (slice == depth) {
    run_task_runs(work.count(), body);
  } else {
    at::parallel_for(0, work.count(), 1, [&](int64_t begin, int64_t end) {
      bool given = false;  // the run [begin, end) as one take
      body([&](int64_t& task, int64_t& run_end) {
        task = begin;
        run_end = end;
        return !std::exchange(given, true);
      });
    });
  }
}

}  // namespace

void set_f32_conv_enabled(bool enabled) { f32_enabled.store(enabled, std::memory_order_relaxed); }

bool f32_conv_enabled() { return f32_enabled.load(std::memory_order_relaxed); }

int64_t bf16_conv_calls() { return bf16_calls.load(std::memory_order_relaxed); }

int64_t f32_conv_calls() { return f32_calls.load(std::memory_order_relaxed); }

int64_t depth_sliced_conv_calls() { return sliced_calls.load(std::memory_order_relaxed); }

bool bf16_conv_available() {
  static const bool available = avx512_tiles() && has_cpu_feature("avx512_bf16") &&
                                !has_cpu_feature("amx_bf16");
  return available;
}

bool f32_conv_available() {
  static const bool available =
      avx512_tiles() || (has_cpu_feature("avx2") && has_cpu_feature("fma"));
  return available;
}

int64_t bf16_conv_pack_bytes(int64_t out_channels, int64_t channels, int64_t kh, int64_t kw) {
  return pack_bytes<Kind::kBf16>(out_channels, channels, kh, kw);
}

int64_t f32_conv_pack_bytes(int64_t out_channels, int64_t channels, int64_t kh, int64_t kw) {
  return pack_bytes<Kind::kF32>(out_channels, channels, kh, kw);
}

at::Tensor pack_bf16_conv_weight(const at::Tensor& weight) {
  return pack_weight<Kind::kBf16, uint16_t, at::kShort>(weight, "pack_bf16_conv_weight");
}

at::Tensor pack_f32_conv_weight(const at::Tensor& weight) {
  return pack_weight<Kind::kF32, float, at::kFloat>(weight, "pack_f32_conv_weight");
}

void bf16_conv(const float* input, int64_t batch, int64_t height, int64_t width,
               int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
               int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding, const float* bias,
               ConvActivation activation, float* out, const float* added,
               const float* input_scale) {
  convolve<Kind::kBf16>("bf16_conv", input, batch, height, width, channels, packed,
                        out_channels, kh, kw, stride, padding, bias, activation, out, added,
                        input_scale);
}

void f32_conv(const float* input, int64_t batch, int64_t height, int64_t width,
              int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
              int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding, const float* bias,
              ConvActivation activation, float* out, const float* added,
              const float* input_scale) {
  convolve<Kind::kF32>("f32_conv", input, batch, height, width, channels, packed,
                       out_channels, kh, kw, stride, padding, bias, activation, out, added,
                       input_scale);
}

bool float_conv_scales_input(bool bf16, int64_t height, int64_t width, int64_t channels,
                             int64_t kh, int64_t kw, at::IntArrayRef stride,
                             at::IntArrayRef padding) {
  if (stride.size() != 2 || padding.size() != 2 || stride[0] <= 0 || stride[1] <= 0 ||
      padding[0] < 0 || padding[1] < 0) {
    return false;
  }
  const ConvPlanes planes = planes_of(height, width, kh, kw, stride, padding);
  return planes.filter_fits() && (bf16 ? input_is_plane<Kind::kBf16>(planes, channels)
                                       : input_is_plane<Kind::kF32>(planes, channels));
}

void bf16_pairs_gemm(int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda,
                     const uint32_t* b, int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) {
    return;
  }
  // The rows of a are the pixels of one image row, one tap of depth k over them.
  const std::vector<TapGroup> taps{{0, 0, k}};
  const auto* rows = reinterpret_cast<const uint16_t*>(a);
  for (int64_t column = 0; column < n; column += kColumnBlock) {
    tile_rows<Kind::kBf16, true>(rows, 0, m, lda, taps, b + column, ldb,
                                 RowWalk(0, 0, m, 1, 1, m, true),
                                 std::min(kColumnBlock, n - column), ldc, column, TileEnd{},
                                 c);
  }
}

}  // namespace blade::ral
