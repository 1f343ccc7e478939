// Blade's int8 convolution: an implicit GEMM in register tiles, in AMX tiles (int8_amx.h)
// or by oneDNN's u8 x s8 brgemm microkernel (int8_conv.h).
#include "ral/int8_conv.h"

#include "ral/conv_planes.h"
#include "ral/cpu_features.h"
#include "ral/int8_amx.h"
#include "ral/int8_epilogue.h"
#include "ral/int8_kernels.h"
#include "ral/lane_masks.h"
#include "ral/task_runs.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

namespace blade::ral {
namespace {

// Output channels per block (four 16-lane vectors of the epilogue), and GEMM rows per
// block (a microkernel call) at most, the register tiles' rounded up to whole tiles (a
// convolution's blocks split its rows evenly).
constexpr int64_t kColumnBlock = 64;
constexpr int64_t kMaxRowBlock = 128;
// The most bytes of padded planes a thread keeps between calls (larger ones are made per
// call), so a large image's planes are not held for the thread's life.
constexpr int64_t kKeptPlaneBytes = int64_t{4} << 20;
// The input of a 1x1 convolution past which its tiles fetch rows ahead (more than the two
// cores' L2 caches of the machine it was measured on, 1 MB each, hold), and how many
// tiles ahead.
constexpr int64_t kStreamedBytes = int64_t{2} << 20;
constexpr int64_t kFetchAheadTiles = 2;
// How much larger than the input a weight must be for the threads to split it (each
// reading all of the input) rather than the image's rows (each reading all of the weight).
// A row split keeps the rows on the core that wrote them in the layer before (which split
// its rows alike); split by columns, each thread reads the half of its input the other
// core wrote, from that core's L2, several times slower a byte here than the weight from
// L3 (ResNet-50 int8: 3% faster than splitting by columns wherever the weight is larger).
constexpr int64_t kColumnsOuterRatio = 16;
// The products (multiply-adds) below which a convolution runs on one thread: with two,
// a 1x1 over one pixel of 960 -> 240 channels took 7.5 us against 6.9 on one, a
// 1024 -> 512 one took the same, 1024 -> 1024 twice as long on one (an AMD EPYC, Zen 5).
constexpr int64_t kSerialProducts = int64_t{1} << 18;
std::atomic<int64_t> serial_products{kSerialProducts};  // set_int8_conv_serial_products
// How many depth steps (256 bytes each) ahead a block's first tile fetches its weight rows.
constexpr int64_t kWeightAheadSteps = 32;
// The deepest unfolded filter (unfolds): a block of rows unfolded takes at most 132 x 256
// bytes, about an L1 cache.
constexpr int64_t kMaxUnfoldedDepth = 256;
constexpr int64_t kUnfoldSlack = 64;

std::atomic<bool> enabled{true};
std::atomic<bool> tiles_enabled{true};
std::atomic<int64_t> calls{0};

// x86's u8 x s8 dot products come in groups of 4 along the depth: the weight's layout.
constexpr int64_t kDepthGroup = 4;

// The epilogue's terms, folded per call (Int8ConvEpilogue's steps in the result's units:
// a uint8 result's are divided by its scale, its zero point in the offset). Per output
// channel: the input zero point's share of the sum (exact, in int32), the multiplier of the
// rest and the offset (bias, and the zero point of a uint8 tensor added). Then the factor
// of the tensor added, and a uint8 result's lower bound (its zero point with ReLU: ReLU
// before an increasing map is a bound after it). The activation, and the result's scale
// and zero point (1 and 0 for float32), to apply it in the result's units; GELU's gate
// table.
struct Terms {
  std::vector<int32_t> correction;
  std::vector<float> multiplier;
  std::vector<float> offset;
  float add_factor = 1.0f;
  float low = 0.0f;
  uint8_t low_byte = 0;  // `low` for the register tiles' byte clamp
  Int8Activation activation = Int8Activation::kNone;
  const GateTable* gelu_gate = nullptr;
  float out_scale = 1.0f;
  float out_zero = 0.0f;
};

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// 16 results of the epilogue before rounding or storing: the int32 sums less the input
// zero point's share, scaled and offset, then the tensor added (its values as float32, in
// its own units) times its factor. Both ways of multiplying finish with it, so they agree
// bit for bit.
template <bool kAdds>
__attribute__((target("avx512f"), always_inline)) inline __m512 epilogue_value(
    __m512i sums, __m512i correction, __m512 multiplier, __m512 offset, __m512 added,
    __m512 add_factor) {
  const __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sums, correction)),
                                   multiplier, offset);
  if constexpr (kAdds) {
    return _mm512_fmadd_ps(added, add_factor, v);
  }
  return v;
}

// The activation of 16 values in the result's units. GELU's forms are compiled into
// their own instances of the kernels (kGelu), so that the others carry no code for them.
template <bool kGelu>
__attribute__((target("avx512f"), always_inline)) inline __m512 activate(
    __m512 v, const Terms& terms, __m512 out_scale, __m512 out_zero) {
  if constexpr (kGelu) {
    return gelu_units(v, out_scale, out_zero, *terms.gelu_gate);
  }
  return terms.activation == Int8Activation::kHardswish
             ? hardswish_units(v, out_scale, out_zero)
             : v;
}

// finish_block's epilogue of a whole block of 64 channels: row by row, as the register
// tiles finish theirs, a uint8 result's 4 vectors packed into one 64-byte store
// (uint8_pack64: the same bytes as uint8_steps'), a float32 one's 4 stored side by side,
// rather than a vector's 16 channels a pass down the rows (a batch-8 ResNet-50's 1x1
// layers spent more in the epilogue than in the AMX tiles).
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void finish_rows64(
    const int32_t* acc, int64_t rows, const int64_t* pixels, int64_t out_channels,
    int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  const __m512 add_factor = _mm512_set1_ps(terms.add_factor);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 out_scale = _mm512_set1_ps(terms.out_scale);
  const __m512 out_zero = _mm512_set1_ps(terms.out_zero);
  const __m512i low_bytes = _mm512_set1_epi8(static_cast<char>(terms.low_byte));
  __m512i correction[4];
  __m512 multiplier[4], offset[4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    correction[v] = _mm512_loadu_si512(terms.correction.data() + column + 16 * v);
    multiplier[v] = _mm512_loadu_ps(terms.multiplier.data() + column + 16 * v);
    offset[v] = _mm512_loadu_ps(terms.offset.data() + column + 16 * v);
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (pixels[r] < 0) {
      continue;
    }
    const int64_t at = pixels[r] * out_channels + column;
    __m512 x[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      __m512 added = zero;
      if constexpr (kAddU8) {
        added = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(e.add_u8 + at + 16 * v))));
      }
      if constexpr (kAddF32) {
        added = _mm512_loadu_ps(e.add_f32 + at + 16 * v);
      }
      x[v] = epilogue_value<kAddU8 || kAddF32>(_mm512_loadu_si512(acc + r * 64 + 16 * v),
                                               correction[v], multiplier[v], offset[v],
                                               added, add_factor);
      x[v] = activate<kGelu>(x[v], terms, out_scale, out_zero);
      if constexpr (!kOutU8) {
        _mm512_storeu_ps(e.out_f32 + at + 16 * v, e.relu ? _mm512_max_ps(x[v], zero) : x[v]);
      }
    }
    if constexpr (kOutU8) {
      _mm512_storeu_si512(e.out_u8 + at, uint8_pack64(x, low_bytes));
    }
  }
}

// The epilogue of a block's rows, 16 output channels at a time (their terms held in
// registers across the rows), masked past `width`. Row r of `acc` (64 int32 apart) goes
// to output pixel `pixels[r]` (negative: dropped).
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void finish_block(
    const int32_t* acc, int64_t rows, const int64_t* pixels, int64_t width,
    int64_t out_channels, int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  if (width == 64) {
    finish_rows64<kAddU8, kAddF32, kOutU8, kGelu>(acc, rows, pixels, out_channels, column,
                                                  terms, e);
    return;
  }
  const __m512 add_factor = _mm512_set1_ps(terms.add_factor);
  const __m512 low = _mm512_set1_ps(terms.low);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 out_scale = _mm512_set1_ps(terms.out_scale);
  const __m512 out_zero = _mm512_set1_ps(terms.out_zero);
  for (int64_t j = 0; j < width; j += 16) {
    const __mmask16 mask = lanes_left(width - j);
    const __m512i correction =
        _mm512_maskz_loadu_epi32(mask, terms.correction.data() + column + j);
    const __m512 multiplier = _mm512_maskz_loadu_ps(mask, terms.multiplier.data() + column + j);
    const __m512 offset = _mm512_maskz_loadu_ps(mask, terms.offset.data() + column + j);
    for (int64_t r = 0; r < rows; ++r) {
      if (pixels[r] < 0) {
        continue;
      }
      const int64_t at = pixels[r] * out_channels + column + j;
      __m512 added = zero;
      if constexpr (kAddU8) {
        added =
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, e.add_u8 + at)));
      }
      if constexpr (kAddF32) {
        added = _mm512_maskz_loadu_ps(mask, e.add_f32 + at);
      }
      __m512 v = epilogue_value<kAddU8 || kAddF32>(_mm512_loadu_si512(acc + r * 64 + j),
                                                   correction, multiplier, offset, added,
                                                   add_factor);
      v = activate<kGelu>(v, terms, out_scale, out_zero);
      if constexpr (kOutU8) {
        _mm_mask_storeu_epi8(e.out_u8 + at, mask, _mm512_cvtepi32_epi8(uint8_steps(v, low)));
      } else {
        if (e.relu) {
          v = _mm512_max_ps(v, zero);
        }
        _mm512_mask_storeu_ps(e.out_f32 + at, mask, v);
      }
    }
  }
}

// A tile of kRows GEMM rows by kVecs x 16 output channels of a block with the epilogue
// done in registers: VNNI dot products over every tap's depth into kVecs x kRows
// accumulators, then finished as finish_block finishes a row. The microkernel's int32
// block, stored and read back by the epilogue, costs as much as the products for a shallow
// depth; here it never leaves the registers. A block of 64 channels takes 6 rows a tile; a
// narrower one (a layer of 16, 24 or 40 channels, or a layer's last block) takes as few
// vectors as cover it, 12 rows a tile for one (enough chains of products to hide their
// latency): computed at 64 channels, MobileNetV3's 16-channel stem did four times its work.
constexpr int64_t kTileRows = 6;
constexpr int64_t kNarrowTileRows = 12;
// AMD's Zen 4 (family 25 with AVX-512) runs each 512-bit instruction as two 256-bit halves.
// There the VNNI tiles of 4 vectors run 5 rows (20 accumulators) rather than 6: with 24
// GCC moved accumulators between registers in the loop, which cost more there than the
// fifth fewer loads per product saved (measured: docs/architecture.md).
constexpr int64_t kZen4TileRows = 5;

std::atomic<int64_t> wide_tile_rows_set{0};  // set_int8_wide_tile_rows; 0: this CPU's

// One step of 4 depth units for every row of a tile: kVecs x kRows dot products of the
// row's 4 input bytes at `offset` from its input `x[r]` by the weight's kVecs vectors at
// `w` (64 bytes apart).
template <int kRows, int kVecs>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), always_inline)) inline void
dot_step(__m512i (&acc)[kRows][kVecs], const uint8_t* const (&x)[kRows], int64_t offset,
         const int8_t* w) {
  __m512i b[kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    b[v] = _mm512_loadu_si512(w + 64 * v);
  }
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    int32_t quad;
    std::memcpy(&quad, x[r] + offset, sizeof quad);
    const __m512i x = _mm512_set1_epi32(quad);
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], x, b[v]);
    }
  }
}

// A tile's rows, both kinds of tile: their output pixels (walked as output pixels: none
// dropped) and inputs (their plane rows in `image`); the lines the next tile adds and
// writes, asked for early (they lie in memory by now, the tensor added written long
// before). The walk is stepped in a local copy: through the reference, each step's fields
// went to memory and back, a chain of stores and loads through every row. A streamed
// input's rows `fetch_ahead` bytes on go into L2: with the hardware's prefetchers alone, a
// 1x1 layer over a batch's 56 x 56 x 256 bytes stalled on its input on an AMD EPYC
// (fetched ahead, its time fell by a fifth there; layers whose input stays in cache lost).
template <int kRows, bool kAddU8, bool kOutU8>
__attribute__((always_inline)) inline void start_tile(
    const uint8_t* image, int64_t depth, int64_t fetch_ahead, RowWalk& walk,
    int64_t out_channels, int64_t column, const Int8ConvEpilogue& e, int64_t (&pixels)[kRows],
    const uint8_t* (&x)[kRows]) {
  RowWalk rows = walk;
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    pixels[r] = rows.next();
    x[r] = image + rows.plane_row * depth;
    const int64_t ahead = std::min(pixels[r] + kRows, rows.last) * out_channels + column;
    if constexpr (kAddU8) {
      _mm_prefetch(reinterpret_cast<const char*>(e.add_u8 + ahead), _MM_HINT_T0);
    }
    if constexpr (kOutU8) {
      _mm_prefetch(reinterpret_cast<const char*>(e.out_u8 + ahead), _MM_HINT_T0);
    }
  }
  walk = rows;
  if (fetch_ahead > 0) {
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      for (int64_t line = 0; line < depth; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(x[r] + fetch_ahead + line), _MM_HINT_T1);
      }
    }
  }
}

template <int kRows, int kVecs, bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void register_tile(
    const uint8_t* image, int64_t depth, const std::vector<TapGroup>& taps, const int8_t* b,
    int64_t fetch_ahead, bool fetch_weights, NextBlock& next, RowWalk& walk, int64_t width,
    int64_t out_channels, int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  int64_t pixels[kRows];
  const uint8_t* x[kRows];
  start_tile<kRows, kAddU8, kOutU8>(image, depth, fetch_ahead, walk, out_channels, column, e,
                                    pixels, x);
  __m512i acc[kRows][kVecs];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = _mm512_setzero_si512();
    }
  }
  // One loop per group (a flat table of every step's offset, tried for a stem's short
  // groups, made GCC spill the accumulators on every step). A block's first tile reads its
  // weight from memory (an engine's weights do not stay in the caches between calls) and
  // asks for the rows kWeightAheadSteps on; the tiles after it find them in cache.
  // The next block's lines (conv_planes.h) in locals: the stores below may alias `next`.
  // A late layer's 64 x 9 x 512 bytes of a block, read from memory by its first tile, made
  // a 3x3 layer over 7 x 7 pixels a third slower than with its weight in cache.
  const char* next_line = next.line;
  const char* const next_end = next.end;
  const int64_t next_every = next.every;
  int64_t next_wait = next.wait;
  // Two depth steps an iteration where the group has them (the loop's own instructions,
  // and the prefetches' tests, once per 48 dot products rather than 24: the scalar work
  // shares the ports of the dot products).
  const auto fetch = [&](int64_t k, const int8_t* b_group) {
    if (fetch_weights) {
      const int8_t* ahead = b_group + (k + kWeightAheadSteps * kDepthGroup) * kColumnBlock;
#pragma GCC unroll 4
      for (int line = 0; line < kVecs; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * line), _MM_HINT_T0);
      }
    } else if (next_line < next_end && --next_wait <= 0) {
      _mm_prefetch(reinterpret_cast<const char*>(next_line), _MM_HINT_T1);
      next_line += 64;
      next_wait = next_every;
    }
  };
  for (const TapGroup& group : taps) {
    const int8_t* b_group = b + group.weight_row * kColumnBlock;
    int64_t k = 0;
    for (; k + 2 * kDepthGroup <= group.depth; k += 2 * kDepthGroup) {
      fetch(k, b_group);
      fetch(k + kDepthGroup, b_group);
      dot_step<kRows, kVecs>(acc, x, group.offset + k, b_group + k * kColumnBlock);
      dot_step<kRows, kVecs>(acc, x, group.offset + k + kDepthGroup,
                             b_group + (k + kDepthGroup) * kColumnBlock);
    }
    if (k < group.depth) {
      fetch(k, b_group);
      dot_step<kRows, kVecs>(acc, x, group.offset + k, b_group + k * kColumnBlock);
    }
  }
  next.line = next_line;
  next.wait = next_wait;
  // The terms of the block's columns, and the masks of its width (whole vectors first).
  const __mmask64 bytes_mask = bytes_left(width);
  __mmask16 masks[kVecs];
  __m512 multiplier[kVecs], offset[kVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kVecs; ++v) {
    masks[v] = static_cast<__mmask16>(bytes_mask >> (16 * v));
    multiplier[v] = _mm512_maskz_loadu_ps(masks[v], terms.multiplier.data() + column + 16 * v);
    offset[v] = _mm512_maskz_loadu_ps(masks[v], terms.offset.data() + column + 16 * v);
  }
  const __m512 add_factor = _mm512_set1_ps(terms.add_factor);
  const __m512i low_bytes = _mm512_set1_epi8(static_cast<char>(terms.low_byte));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 out_scale = _mm512_set1_ps(terms.out_scale);
  const __m512 out_zero = _mm512_set1_ps(terms.out_zero);
  const __m512 low = _mm512_set1_ps(terms.low);
  // The input zero point's share, subtracted here once where there is one (an input of a
  // zero point 0, as after a ReLU, has none: the epilogue below subtracts zeros, folded).
  if (e.input_zero_point != 0) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      const __m512i correction =
          _mm512_maskz_loadu_epi32(masks[v], terms.correction.data() + column + 16 * v);
#pragma GCC unroll 12
      for (int r = 0; r < kRows; ++r) {
        acc[r][v] = _mm512_sub_epi32(acc[r][v], correction);
      }
    }
  }
  const __m512i no_share = _mm512_setzero_si512();  // subtracted above where any
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    const int64_t at = pixels[r] * out_channels + column;
    __m512 x[4];
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      __m512 added = zero;
      if constexpr (kAddU8) {  // 16 bytes widened as they load (no lane extracted)
        const uint8_t* bytes = e.add_u8 + at + 16 * v;
        added = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
            masks[v] == 0xFFFF ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes))
                               : _mm_maskz_loadu_epi8(masks[v], bytes)));
      }
      if constexpr (kAddF32) {
        added = _mm512_maskz_loadu_ps(masks[v], e.add_f32 + at + 16 * v);
      }
      x[v] = epilogue_value<kAddU8 || kAddF32>(acc[r][v], no_share, multiplier[v], offset[v],
                                               added, add_factor);
      x[v] = activate<kGelu>(x[v], terms, out_scale, out_zero);
      if constexpr (!kOutU8) {
        if (e.relu) {
          x[v] = _mm512_max_ps(x[v], zero);
        }
        // Whole vectors unmasked, as in float_conv.cpp's tiles.
        if (masks[v] == 0xFFFF) {
          _mm512_storeu_ps(e.out_f32 + at + 16 * v, x[v]);
        } else {
          _mm512_mask_storeu_ps(e.out_f32 + at + 16 * v, masks[v], x[v]);
        }
      }
    }
    if constexpr (kOutU8 && kVecs == 4) {
      const __m512i bytes = uint8_pack64(x, low_bytes);
      if (width >= 64) {
        _mm512_storeu_si512(e.out_u8 + at, bytes);
      } else {
        _mm512_mask_storeu_epi8(e.out_u8 + at, bytes_mask, bytes);
      }
    } else if constexpr (kOutU8) {  // 16 bytes a vector, as finish_block rounds them
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) {
        _mm_mask_storeu_epi8(e.out_u8 + at + 16 * v, masks[v],
                             _mm512_cvtepi32_epi8(uint8_steps(x[v], low)));
      }
    }
  }
}

// Blade's tiles on a CPU with AVX2 but no VNNI (int8_weight_limit() 64): each group of 4
// depth units multiplied by vpmaddubsw (pairs of u8 x s8 products summed into int16, which
// a weight of magnitude 64 or less never saturates: 2 x 255 x 64 < 2^15), vpmaddwd by ones
// (pairs of those into int32) and an add. A tile is kRows rows by 16 channels (12 sums,
// the broadcast input, a product and the ones fill the registers; the weight is read as
// the products' memory operands), a block of 64 channels in four passes while the tile's
// input rows stay in L1; each pass finishes its 16 channels as register_tile does.
template <int kRows>
__attribute__((target("avx2"), always_inline)) inline void pair_step(
    __m256i (&acc)[kRows][2], const uint8_t* const (&x)[kRows], int64_t offset,
    const int8_t* w, __m256i ones) {
  const auto* b = reinterpret_cast<const __m256i*>(w);
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    int32_t quad;
    std::memcpy(&quad, x[r] + offset, sizeof quad);
    const __m256i step = _mm256_set1_epi32(quad);
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      // The weight as the instruction's memory operand: held in registers (GCC hoists the
      // intrinsic's load out of the rows), it left 17 live vectors and spilled a sum.
      __m256i pairs;
      asm("vpmaddubsw %1, %2, %0" : "=x"(pairs) : "m"(b[v]), "x"(step));
      acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(pairs, ones));
    }
  }
}

// 8 bytes of a tensor added (the first `count`, the rest 0), widened to float32: one load
// where all 8 are there (a memcpy of a variable size is a call).
__attribute__((target("avx2"), always_inline)) inline __m256 added_bytes8(const uint8_t* at,
                                                                        int64_t count) {
  __m128i bytes;
  if (count >= 8) {
    bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at));
  } else {
    uint64_t part = 0;
    for (int64_t i = 0; i < count; ++i) {
      part |= uint64_t{at[i]} << (8 * i);
    }
    bytes = _mm_cvtsi64_si128(static_cast<int64_t>(part));
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

template <int kRows, bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
__attribute__((target("avx2,fma"))) void pair_sum_tile(
    const uint8_t* image, int64_t depth, const std::vector<TapGroup>& taps, const int8_t* b,
    int64_t fetch_ahead, bool fetch_weights, NextBlock& next, RowWalk& walk, int64_t width,
    int64_t out_channels, int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  int64_t pixels[kRows];
  const uint8_t* x[kRows];
  start_tile<kRows, kAddU8, kOutU8>(image, depth, fetch_ahead, walk, out_channels, column, e,
                                    pixels, x);
  // In locals: the stores below may alias `next` and `terms`.
  const char* next_line = next.line;
  const char* const next_end = next.end;
  const int64_t next_every = next.every;
  int64_t next_wait = next.wait;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 add_factor = _mm256_set1_ps(terms.add_factor);
  const __m256 out_scale = _mm256_set1_ps(terms.out_scale);
  const __m256 out_zero = _mm256_set1_ps(terms.out_zero);
  const __m256 low = _mm256_set1_ps(terms.low);
  const bool shared_zero = e.input_zero_point != 0;
  const bool relu = e.relu;
  // The epilogue's operands in locals: the stores below may alias `e` and `terms`, whose
  // fields GCC otherwise loads again for every row.
  const uint8_t* const add_u8 = e.add_u8;
  const float* const add_f32 = e.add_f32;
  uint8_t* const out_u8 = e.out_u8;
  float* const out_f32 = e.out_f32;
  const bool hardswish = terms.activation == Int8Activation::kHardswish;
  const GateTable* const gelu_gate = terms.gelu_gate;
  const float* const all_multipliers = terms.multiplier.data();
  const float* const all_offsets = terms.offset.data();
  const int32_t* const all_corrections = terms.correction.data();
  int64_t steps = 0;  // depth steps a pass
  for (const TapGroup& group : taps) {
    steps += (group.depth + kDepthGroup - 1) / kDepthGroup;
  }
  for (int64_t c = 0; c < width; c += 16) {
    // Pass c / 16: its 64 bytes of each 256-byte depth group of the block's weight.
    const int8_t* slice = b + 4 * c;
    __m256i acc[kRows][2];
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    }
    if (fetch_weights) {
      // A block's first tile reads each pass's lines from memory, fetched ahead.
      for (const TapGroup& group : taps) {
        const int8_t* b_group = slice + group.weight_row * kColumnBlock;
#pragma GCC unroll 2
        for (int64_t k = 0; k < group.depth; k += kDepthGroup) {
          _mm_prefetch(reinterpret_cast<const char*>(
                           b_group + (k + kWeightAheadSteps * kDepthGroup) * kColumnBlock),
                       _MM_HINT_T0);
          pair_step<kRows>(acc, x, group.offset + k, b_group + k * kColumnBlock, ones);
        }
      }
    } else {
      // The tiles after it ask for the next block's lines, as many a pass as its steps
      // are due (NextBlock's spread), at its start: asked for step by step, the test and
      // count in the loop took issue slots from the products.
      next_wait -= steps;
      while (next_wait <= 0 && next_line < next_end) {
        _mm_prefetch(next_line, _MM_HINT_T1);
        next_line += 64;
        next_wait += next_every;
      }
      for (const TapGroup& group : taps) {
        const int8_t* b_group = slice + group.weight_row * kColumnBlock;
#pragma GCC unroll 4
        for (int64_t k = 0; k < group.depth; k += kDepthGroup) {
          pair_step<kRows>(acc, x, group.offset + k, b_group + k * kColumnBlock, ones);
        }
      }
    }
    // The pass's terms, masked to the block's width.
    const int64_t left = width - c;
    const __m256i masks[2] = {lanes8(left), lanes8(left - 8)};
    const float* multipliers = all_multipliers + column + c;
    const float* offsets = all_offsets + column + c;
    const __m256 multiplier[2] = {_mm256_maskload_ps(multipliers, masks[0]),
                                  _mm256_maskload_ps(multipliers + 8, masks[1])};
    const __m256 offset[2] = {_mm256_maskload_ps(offsets, masks[0]),
                              _mm256_maskload_ps(offsets + 8, masks[1])};
    if (shared_zero) {
      const int* corrections = all_corrections + column + c;
      for (int v = 0; v < 2; ++v) {
        const __m256i correction = _mm256_maskload_epi32(corrections + 8 * v, masks[v]);
#pragma GCC unroll 12
        for (int r = 0; r < kRows; ++r) {
          acc[r][v] = _mm256_sub_epi32(acc[r][v], correction);
        }
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      const int64_t at = pixels[r] * out_channels + column + c;
      __m256 y[2];
#pragma GCC unroll 2
      for (int v = 0; v < 2; ++v) {
        y[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][v]), multiplier[v], offset[v]);
        if constexpr (kAddU8) {
          y[v] = _mm256_fmadd_ps(added_bytes8(add_u8 + at + 8 * v, left - 8 * v),
                                 add_factor, y[v]);
        }
        if constexpr (kAddF32) {
          y[v] = _mm256_fmadd_ps(_mm256_maskload_ps(add_f32 + at + 8 * v, masks[v]),
                                 add_factor, y[v]);
        }
        if constexpr (kGelu) {
          y[v] = gelu_units8(y[v], out_scale, out_zero, *gelu_gate);
        } else if (hardswish) {
          y[v] = hardswish_units8(y[v], out_scale, out_zero);
        }
        if constexpr (!kOutU8) {
          if (relu) {
            y[v] = _mm256_max_ps(y[v], zero);
          }
          if (left >= 16) {
            _mm256_storeu_ps(out_f32 + at + 8 * v, y[v]);
          } else {
            _mm256_maskstore_ps(out_f32 + at + 8 * v, masks[v], y[v]);
          }
        }
      }
      if constexpr (kOutU8) {
        // Two vectors' int32 steps to 16 bytes in order: the pack interleaves their
        // 128-bit halves, the permutation puts them back.
        const __m256i words = _mm256_permute4x64_epi64(
            _mm256_packs_epi32(uint8_steps8(y[0], low), uint8_steps8(y[1], low)), 0xD8);
        const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words),
                                               _mm256_extracti128_si256(words, 1));
        if (left >= 16) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out_u8 + at), bytes);
        } else {
          alignas(16) uint8_t part[16];
          _mm_store_si128(reinterpret_cast<__m128i*>(part), bytes);
          std::memcpy(out_u8 + at, part, static_cast<size_t>(left));
        }
      }
    }
  }
  next.line = next_line;
  next.wait = next_wait;
}

// One tile: register_tile, or with kPairs pair_sum_tile (kVecs unused).
template <int kRows, int kVecs, bool kPairs, bool kAddU8, bool kAddF32, bool kOutU8,
          bool kGelu>
inline void one_tile(const uint8_t* image, int64_t depth, const std::vector<TapGroup>& taps,
                     const int8_t* b, int64_t fetch_ahead, bool first, NextBlock& next,
                     RowWalk& walk, int64_t width, int64_t out_channels, int64_t column,
                     const Terms& terms, const Int8ConvEpilogue& e) {
  if constexpr (kPairs) {
    pair_sum_tile<kRows, kAddU8, kAddF32, kOutU8, kGelu>(image, depth, taps, b, fetch_ahead,
                                                         first, next, walk, width,
                                                         out_channels, column, terms, e);
  } else {
    register_tile<kRows, kVecs, kAddU8, kAddF32, kOutU8, kGelu>(
        image, depth, taps, b, fetch_ahead, first, next, walk, width, out_channels, column,
        terms, e);
  }
}

// The tile of `left` < kRows rows (a block's last), by kVecs vectors.
template <int kVecs, int kRows, bool kPairs, bool kAddU8, bool kAddF32, bool kOutU8,
          bool kGelu>
void tail_tile(int64_t left, const uint8_t* image, int64_t depth,
               const std::vector<TapGroup>& taps, const int8_t* b, int64_t fetch_ahead,
               bool first, NextBlock& next, RowWalk& walk, int64_t width, int64_t out_channels,
               int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  if constexpr (kRows > 0) {
    if (left == kRows) {
      one_tile<kRows, kVecs, kPairs, kAddU8, kAddF32, kOutU8, kGelu>(
          image, depth, taps, b, fetch_ahead, first, next, walk, width, out_channels, column,
          terms, e);
      return;
    }
    tail_tile<kVecs, kRows - 1, kPairs, kAddU8, kAddF32, kOutU8, kGelu>(
        left, image, depth, taps, b, fetch_ahead, first, next, walk, width, out_channels,
        column, terms, e);
  }
}

// `rows` output pixels (as `walk` steps in pixels mode, their inputs in `image`'s planes)
// by kVecs vectors of one block of output channels, in tiles of kRows and a shorter last.
template <int kVecs, int kRows, bool kPairs, bool kAddU8, bool kAddF32, bool kOutU8,
          bool kGelu>
void tiles_of(const uint8_t* image, int64_t rows, int64_t depth,
              const std::vector<TapGroup>& taps, const int8_t* b, int64_t fetch_ahead,
              NextBlock next, RowWalk& walk, int64_t width, int64_t out_channels,
              int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  // (A pair-sum tile asks for the next lines in each of its passes over 16 channels.)
  next.spread_over((rows / kRows - 1) * (kPairs ? (width + 15) / 16 : 1), taps,
                   kDepthGroup);
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    one_tile<kRows, kVecs, kPairs, kAddU8, kAddF32, kOutU8, kGelu>(
        image, depth, taps, b, fetch_ahead, r == 0, next, walk, width, out_channels, column,
        terms, e);
  }
  tail_tile<kVecs, kRows - 1, kPairs, kAddU8, kAddF32, kOutU8, kGelu>(
      rows - r, image, depth, taps, b, fetch_ahead, r == 0, next, walk, width, out_channels,
      column, terms, e);
}

// `rows` output pixels by one block of output channels, its `width` real ones in as few
// vectors as cover them.
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
void tile_rows(const uint8_t* image, int64_t rows, int64_t depth,
               const std::vector<TapGroup>& taps, const int8_t* b,
               int64_t fetch_ahead, NextBlock next, RowWalk walk, int64_t width,
               int64_t out_channels, int64_t column, const Terms& terms,
               const Int8ConvEpilogue& e) {
  switch ((width + 15) / 16) {
    case 1:
      tiles_of<1, kNarrowTileRows, false, kAddU8, kAddF32, kOutU8, kGelu>(
          image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels, column,
          terms, e);
      break;
    case 2:
      tiles_of<2, kTileRows, false, kAddU8, kAddF32, kOutU8, kGelu>(
          image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels, column,
          terms, e);
      break;
    case 3:
      tiles_of<3, kTileRows, false, kAddU8, kAddF32, kOutU8, kGelu>(
          image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels, column,
          terms, e);
      break;
    default:
      if (int8_wide_tile_rows() == kZen4TileRows) {
        tiles_of<4, kZen4TileRows, false, kAddU8, kAddF32, kOutU8, kGelu>(
            image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels,
            column, terms, e);
      } else {
        tiles_of<4, kTileRows, false, kAddU8, kAddF32, kOutU8, kGelu>(
            image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels,
            column, terms, e);
      }
      break;
  }
}

// tile_rows by pair_sum_tile, whose passes cover any width.
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
void pair_tile_rows(const uint8_t* image, int64_t rows, int64_t depth,
                    const std::vector<TapGroup>& taps, const int8_t* b, int64_t fetch_ahead,
                    NextBlock next, RowWalk walk, int64_t width, int64_t out_channels,
                    int64_t column, const Terms& terms, const Int8ConvEpilogue& e) {
  tiles_of<2, kTileRows, true, kAddU8, kAddF32, kOutU8, kGelu>(
      image, rows, depth, taps, b, fetch_ahead, next, walk, width, out_channels, column, terms,
      e);
}
#pragma GCC diagnostic pop

// The two epilogue-kind templates as types, and the instance of either for an epilogue
// (GELU's without a tensor added: a linear layer's).
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
struct FinishBlock {
  static constexpr auto run = finish_block<kAddU8, kAddF32, kOutU8, kGelu>;
};
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
struct TileRows {
  static constexpr auto run = tile_rows<kAddU8, kAddF32, kOutU8, kGelu>;
};
template <bool kAddU8, bool kAddF32, bool kOutU8, bool kGelu>
struct PairTileRows {
  static constexpr auto run = pair_tile_rows<kAddU8, kAddF32, kOutU8, kGelu>;
};

template <template <bool, bool, bool, bool> class Kernel>
auto for_epilogue(const Int8ConvEpilogue& e) {
  const bool add_u8 = e.add_u8 != nullptr, add_f32 = e.add_f32 != nullptr;
  if (e.activation == Int8Activation::kGelu || e.activation == Int8Activation::kGeluTanh) {
    TORCH_CHECK(!add_u8 && !add_f32 && !e.relu,
                "int8_conv: GELU takes no tensor added and no ReLU");
    return e.out_u8 != nullptr ? Kernel<false, false, true, true>::run
                               : Kernel<false, false, false, true>::run;
  }
  if (e.out_u8 != nullptr) {
    return add_u8 ? Kernel<true, false, true, false>::run
           : add_f32 ? Kernel<false, true, true, false>::run
                     : Kernel<false, false, true, false>::run;
  }
  return add_u8 ? Kernel<true, false, false, false>::run
         : add_f32 ? Kernel<false, true, false, false>::run
                   : Kernel<false, false, false, false>::run;
}

// The epilogue's terms for this call (see Terms), for `columns` output channels padded to
// whole blocks with zeros; valid until the thread's next call.
const Terms& fold_terms(const Int8ConvEpilogue& e, const int32_t* sums, int64_t out_channels,
                        int64_t columns) {
  // The calling thread's, reused: int8_conv runs one call at a time on a thread.
  thread_local Terms terms;
  terms.correction.assign(columns, 0);
  terms.multiplier.assign(columns, 0.0f);
  terms.offset.assign(columns, 0.0f);
  // A uint8 result's units: steps of its scale, from its zero point.
  const bool to_uint8 = e.out_u8 != nullptr;
  const double unit = to_uint8 ? 1.0 / e.out_scale : 1.0;
  const double base = to_uint8 ? e.out_zero_point : 0.0;
  const double added_zero = e.add_u8 != nullptr ? e.add_zero_point * double{e.add_scale} : 0.0;
  for (int64_t o = 0; o < out_channels; ++o) {
    terms.correction[o] = e.input_zero_point * sums[o];
    terms.multiplier[o] = static_cast<float>(double{e.input_scale} * e.weight_scale[o] * unit);
    const double bias = e.bias != nullptr ? e.bias[o] : 0.0;
    terms.offset[o] = static_cast<float>((bias - added_zero) * unit + base);
  }
  terms.add_factor = static_cast<float>((e.add_u8 != nullptr ? e.add_scale : 1.0) * unit);
  terms.low = e.relu && to_uint8 ? static_cast<float>(e.out_zero_point) : 0.0f;
  terms.low_byte = static_cast<uint8_t>(std::clamp(terms.low, 0.0f, 255.0f));
  terms.activation = e.activation;
  const bool gelu =
      e.activation == Int8Activation::kGelu || e.activation == Int8Activation::kGeluTanh;
  terms.gelu_gate =
      gelu ? &gelu_gate_table(e.activation == Int8Activation::kGeluTanh) : nullptr;
  terms.out_scale = to_uint8 ? e.out_scale : 1.0f;
  terms.out_zero = static_cast<float>(base);
  return terms;
}

// `count` pixels of `channels` <= 4 bytes each, `stride` pixels apart from `src` on
// (stride * channels <= 8: 16 of them lie within 128 bytes), as 4-byte pixels at `out`
// (bytes past the channels: `zero_point`), 16 at a time: two masked loads (nothing read
// past the last pixel) and one byte permutation.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) void spread_pixels_avx512(
    const uint8_t* src, uint8_t* out, int64_t count, int64_t stride, int64_t channels,
    uint8_t zero_point) {
  alignas(64) uint8_t order[64];
  uint64_t padding = 0;  // the bytes past the channels
  for (int i = 0; i < 16; ++i) {
    for (int b = 0; b < 4; ++b) {
      order[i * 4 + b] = static_cast<uint8_t>(b < channels ? i * stride * channels + b : 0);
      padding |= b < channels ? 0 : uint64_t{1} << (i * 4 + b);
    }
  }
  const __m512i pick = _mm512_load_si512(order);
  const __m512i zero = _mm512_set1_epi8(static_cast<char>(zero_point));
  for (int64_t i = 0; i < count; i += 16) {
    const int64_t n = std::min<int64_t>(16, count - i);
    const uint8_t* from = src + i * stride * channels;
    const int64_t need = (n - 1) * stride * channels + channels;
    const __m512i low = _mm512_maskz_loadu_epi8(bytes_left(need), from);
    const __m512i high = _mm512_maskz_loadu_epi8(bytes_left(need - 64), from + 64);
    const __m512i pixels = _mm512_mask_blend_epi8(
        padding, _mm512_permutex2var_epi8(low, pick, high), zero);
    _mm512_mask_storeu_epi8(out + i * 4, bytes_left(n * 4), pixels);
  }
}

// `lines` 64-byte lines from `src` to `dst` (a deep pixel's channels), inline.
__attribute__((target("avx512f"))) inline void copy_lines_avx512(const uint8_t* src,
                                                                  uint8_t* dst, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l) {
    _mm512_storeu_si512(dst + 64 * l, _mm512_loadu_si512(src + 64 * l));
  }
}

// Whether copy_lines_avx512 runs here.
bool lines_avx512() {
  static const bool available = has_cpu_feature("avx512f");
  return available;
}

// Whether unfold_block runs here (else unfold_block_avx2).
bool unfold_avx512() {
  static const bool available =
      has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") && has_cpu_feature("avx512vl");
  return available;
}

// Whether spread_pixels_avx512 runs here.
bool few_channels_avx512() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl") && has_cpu_feature("avx512vbmi");
  return available;
}

// Packs weight [O, C, kh, kw] (contiguous int8) as the header says, its taps in
// tap_order, each tap's depth C padded with zeros to `depth` (a multiple of 4); for the
// AMX tiles (`amx`) each 64-column block as amx_weight_index lays it out.
void pack_weight(const int8_t* weight, int64_t out_channels, int64_t channels, int64_t depth,
                 int64_t kh, int64_t kw, bool amx, int8_t* packed, int32_t* sums) {
  const int64_t taps = kh * kw;
  const auto order = tap_order(kh, kw);
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  std::memset(packed, 0, blocks * taps * depth * kColumnBlock);
  for (int64_t o = 0; o < out_channels; ++o) {
    int32_t sum = 0;
    int8_t* block = packed + (o / kColumnBlock) * taps * depth * kColumnBlock;
    const int64_t lane = o % kColumnBlock;
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t t = 0; t < taps; ++t) {
        const auto [i, j] = order[t];
        const int8_t value = weight[((o * channels + c) * kh + i) * kw + j];
        sum += value;
        block[amx ? amx_weight_index(lane, t, c, taps, depth)
                  : t * depth * kColumnBlock + (c / kDepthGroup) * kColumnBlock * kDepthGroup +
                        lane * kDepthGroup + c % kDepthGroup] = value;
      }
    }
    sums[o] = sum;
  }
}

// The GEMM's depth per tap: the input channels, padded to whole groups of 4 (the planes'
// extra channels hold the zero point, the weight's zeros).
int64_t padded_depth(int64_t channels) {
  return (channels + kDepthGroup - 1) / kDepthGroup * kDepthGroup;
}

// Whether Blade's AMX tiles multiply (int8_amx.h): on AMX-INT8 CPUs where they answer.
// Their weight's taps are padded to whole tile rows (zeros, against the rows' bytes their
// last tile reads past the depth).
bool amx_tiles_multiply() { return amx_int8_runs() && !int8_conv_tiles_run(); }

// Whether a filter of few input channels (an image's 3) is unfolded: each output pixel's
// kh x kw x C inputs side by side in one row, multiplied as a 1x1 convolution of that
// depth. As planes, each tap pads its 3 channels to 4 and a strided row's taps split by
// phase (a 7 x 7 stem: 196 bytes of depth for 147); unfolded, 147 pad to 148. A filter row
// (kw * C bytes) moves as one vector.
bool unfolds(int64_t channels, int64_t kh, int64_t kw) {
  return kh * kw > 1 && kh <= 64 && channels > 0 && channels < kDepthGroup &&
         kw * channels <= 64 &&
         padded_depth(kh * kw * channels) <= kMaxUnfoldedDepth;
}

// An unfolded row's bytes past its filter rows, 0 to 3 (the depth is whole groups of 4),
// set to the zero point by one 4-byte store, spilling as a filter row does: the byte loop
// was a call to memset per pixel, 5% of an image stem's samples.
inline void put_depth_tail(uint8_t* to, int64_t tail, uint8_t zero_point) {
  if (tail > 0) {
    const uint32_t zeros = 0x01010101u * zero_point;
    std::memcpy(to, &zeros, sizeof zeros);
  }
}

// Rows [first, first + count) of image n's output pixels unfolded into `out`, `depth`
// bytes a row: filter row i's kw * C inputs at i * kw * C, the rest (padding, and depth
// past kh * kw * C) the input's zero point. A filter row is read as a 32- or 64-byte
// vector (masked to its bytes near the image's end) and written whole, its spill
// overwritten by the next filter row or pixel; `out` has kUnfoldSlack bytes past the last
// row for the last spill.
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void put_filter_row(
    uint8_t* to, const uint8_t* from, const uint8_t* end, __mmask64 mask, bool narrow,
    uint8_t zero_point) {
  if (narrow) {
    const __m256i v =
        from == nullptr ? _mm256_set1_epi8(static_cast<char>(zero_point))
        : from + 32 <= end ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from))
                           : _mm256_maskz_loadu_epi8(static_cast<__mmask32>(mask), from);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), v);
  } else {
    _mm512_storeu_si512(to, from == nullptr ? _mm512_set1_epi8(static_cast<char>(zero_point))
                            : from + 64 <= end ? _mm512_loadu_si512(from)
                                               : _mm512_maskz_loadu_epi8(mask, from));
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void unfold_block(
    const uint8_t* image, const ConvPlanes& g, int64_t channels, int64_t first, int64_t count,
    int64_t depth, uint8_t zero_point, uint8_t* out) {
  // The geometry in locals: the byte stores below may alias anything in memory.
  const int64_t kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  const int64_t height = g.height, width = g.width, out_w = g.out_w;
  const int64_t row_bytes = kw * channels, line_bytes = width * channels;
  const uint8_t* const image_end = image + height * line_bytes;
  const int64_t tail = depth - kh * row_bytes;
  const bool narrow = row_bytes <= 32;
  const __mmask64 row_mask = bytes_left(row_bytes);
  const __m512i zero_row = _mm512_set1_epi8(static_cast<char>(zero_point));
  const __m256i zero_row_256 = _mm256_set1_epi8(static_cast<char>(zero_point));
  int64_t oh = first / out_w, ow = first % out_w;
  for (int64_t r = 0; r < count;) {
    // The output row's input rows (null: padding), then its pixels in this block.
    const uint8_t* lines[64];
    for (int64_t i = 0; i < kh; ++i) {
      const int64_t h = oh * sh - ph + i;
      lines[i] = h >= 0 && h < height ? image + h * line_bytes : nullptr;
    }
    const int64_t end = std::min(count, r + out_w - ow);
    for (; r < end; ++r, ++ow) {
      uint8_t* row = out + r * depth;
      const int64_t left = ow * sw - pw;
      if (left >= 0 && left + kw <= width) {
        for (int64_t i = 0; i < kh; ++i) {
          put_filter_row(row + i * row_bytes,
                         lines[i] != nullptr ? lines[i] + left * channels : nullptr, image_end,
                         row_mask, narrow, zero_point);
        }
      } else {
        // A pixel by the left or right edge: each filter row's bytes inside the line
        // loaded under a mask, the rest the zero point (a masked load reads nothing
        // outside its mask, so the address may lie before the line).
        const int64_t first_byte = left * channels;
        const int64_t lo = std::max<int64_t>(0, -first_byte);
        const int64_t hi = std::min(row_bytes, line_bytes - first_byte);
        const __mmask64 inside =
            hi <= lo ? 0 : (bytes_left(hi) >> lo) << lo;
        for (int64_t i = 0; i < kh; ++i) {
          uint8_t* to = row + i * row_bytes;
          if (lines[i] == nullptr) {
            put_filter_row(to, nullptr, image_end, row_mask, narrow, zero_point);
            continue;
          }
          const void* from = reinterpret_cast<const void*>(
              reinterpret_cast<uintptr_t>(lines[i]) + first_byte);
          if (narrow) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(to),
                                _mm256_mask_loadu_epi8(zero_row_256, static_cast<__mmask32>(inside),
                                                       from));
          } else {
            _mm512_storeu_si512(to, _mm512_mask_loadu_epi8(zero_row, inside, from));
          }
        }
      }
      put_depth_tail(row + kh * row_bytes, tail, zero_point);
    }
    ow = 0;
    ++oh;
  }
}

// A filter row's 32 bytes (`narrow`) or 64 from `from` to `to` (unfold_block_avx2).
__attribute__((target("avx2"), always_inline)) inline void put_filter_row_avx2(
    uint8_t* to, const uint8_t* from, bool narrow) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(to),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
  if (!narrow) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32)));
  }
}

// unfold_block on AVX2: a filter row moves as one or two 32-byte vectors where they lie
// inside the image (else, near its end, and for pixels by an edge, through a 64-byte row
// of the zero point that its bytes inside the line are copied into).
__attribute__((target("avx2"))) void unfold_block_avx2(
    const uint8_t* image, const ConvPlanes& g, int64_t channels, int64_t first, int64_t count,
    int64_t depth, uint8_t zero_point, uint8_t* out) {
  const int64_t kh = g.kh, kw = g.kw, sh = g.sh, sw = g.sw, ph = g.ph, pw = g.pw;
  const int64_t height = g.height, width = g.width, out_w = g.out_w;
  const int64_t row_bytes = kw * channels, line_bytes = width * channels;
  const uint8_t* const image_end = image + height * line_bytes;
  const int64_t tail = depth - kh * row_bytes;
  const bool narrow = row_bytes <= 32;
  const int64_t reach = narrow ? 32 : 64;  // the bytes a filter row's move reads and writes
  const __m256i zero_row = _mm256_set1_epi8(static_cast<char>(zero_point));
  alignas(32) uint8_t staged[64];
  int64_t oh = first / out_w, ow = first % out_w;
  for (int64_t r = 0; r < count;) {
    const uint8_t* lines[64];
    for (int64_t i = 0; i < kh; ++i) {
      const int64_t h = oh * sh - ph + i;
      lines[i] = h >= 0 && h < height ? image + h * line_bytes : nullptr;
    }
    const int64_t end = std::min(count, r + out_w - ow);
    for (; r < end; ++r, ++ow) {
      uint8_t* row = out + r * depth;
      const int64_t left = ow * sw - pw;
      const int64_t first_byte = left * channels;
      // The filter row's bytes inside the line: [lo, hi).
      const int64_t lo = std::max<int64_t>(0, -first_byte);
      const int64_t hi = std::min(row_bytes, line_bytes - first_byte);
      const bool inside = lo == 0 && hi == row_bytes;
      for (int64_t i = 0; i < kh; ++i) {
        uint8_t* to = row + i * row_bytes;
        if (lines[i] == nullptr) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), zero_row);
          if (!narrow) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + 32), zero_row);
          }
          continue;
        }
        if (inside && lines[i] + first_byte + reach <= image_end) {
          put_filter_row_avx2(to, lines[i] + first_byte, narrow);
          continue;
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(staged), zero_row);
        _mm256_store_si256(reinterpret_cast<__m256i*>(staged + 32), zero_row);
        if (hi > lo) {
          std::memcpy(staged + lo, lines[i] + (first_byte + lo), static_cast<size_t>(hi - lo));
        }
        put_filter_row_avx2(to, staged, narrow);
      }
      put_depth_tail(row + kh * row_bytes, tail, zero_point);
    }
    ow = 0;
    ++oh;
  }
}

// Whether the microkernel computes products of the kinds int8_conv asks for right (it may
// refuse a CPU, be missing from this PyTorch's oneDNN, or take another path on another
// ISA, e.g. AMX tiles): tried once, on a few shapes (a row tail, a partial column block,
// a depth that is no multiple of 64, rows further apart than the depth) and with the
// second call adding into the first's result.
bool microkernel_works() {
  struct Shape {
    int64_t m, n, k;
  };
  try {
    for (const Shape& shape :
         {Shape{5, 16, 4}, Shape{3, 16, 8}, Shape{37, 48, 196}, Shape{128, 64, 516}}) {
      const int64_t m = shape.m, n = shape.n, k = shape.k, lda = k + 4;
      std::vector<uint8_t> a(m * lda);
      std::vector<int8_t> b(k * kColumnBlock, 0);
      std::vector<int32_t> c(m * kColumnBlock, 0);
      uint32_t state = 12345;
      const auto next = [&state] {
        state = state * 1103515245u + 12345u;
        return static_cast<int32_t>((state >> 16) & 0xFF);
      };
      for (auto& value : a) {
        value = static_cast<uint8_t>(next());
      }
      std::vector<int8_t> plain(k * n);
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t j = 0; j < n; ++j) {
          const auto value = static_cast<int8_t>(next() - 128);
          plain[kk * n + j] = value;
          b[(kk / kDepthGroup) * kColumnBlock * kDepthGroup + j * kDepthGroup +
            kk % kDepthGroup] = value;
        }
      }
      for (const bool add : {false, true}) {
        at::native::cpublas::brgemm(m, n, k, lda, kColumnBlock, kColumnBlock, add, a.data(),
                                    b.data(), c.data(), true);
      }
      at::native::cpublas::brgemm_release(true);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          int32_t want = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            want += static_cast<int32_t>(a[i * lda + kk]) * plain[kk * n + j];
          }
          if (c[i * kColumnBlock + j] != 2 * want) {
            return false;
          }
        }
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Blade's register tiles: AVX-512 with VNNI.
bool tiles_available() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl") && has_cpu_feature("avx512_vnni");
  return available;
}

// oneDNN's microkernel, on VNNI or AMX-INT8, where it answers right.
bool microkernel_available() {
  static const bool available =
      has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
      has_cpu_feature("avx512vl") &&
      (has_cpu_feature("avx512_vnni") || has_cpu_feature("amx_int8")) && microkernel_works();
  return available;
}

// Blade's pair-sum tiles (pair_sum_tile): AVX2 and FMA without the VNNI tiles, where
// int8_weight_limit() keeps weights within what their int16 sums hold (the int8 kernels
// take no other weight).
bool pair_tiles_available() {
  static const bool isa = has_cpu_feature("avx2") && has_cpu_feature("fma");
  return isa && !tiles_available() && int8_weight_limit() == 64;
}

}  // namespace

bool int8_conv_available() {
  return tiles_available() || amx_int8_runs() || microkernel_available() ||
         pair_tiles_available();
}

bool int8_conv_tiles_run() {
  if (!tiles_available()) {
    return pair_tiles_available();
  }
  // With AMX, Blade's AMX tiles (or else the microkernel's) multiply many times faster than
  // VNNI's vectors; the microkernel is probed only where it may be chosen.
  static const bool amx = has_cpu_feature("amx_int8");
  if (!amx && tiles_enabled.load(std::memory_order_relaxed)) {
    return true;
  }
  return !amx_int8_runs() && !microkernel_available();
}

void set_int8_conv_enabled(bool value) { enabled.store(value, std::memory_order_relaxed); }

bool int8_conv_enabled() { return enabled.load(std::memory_order_relaxed); }

void set_int8_conv_tiles(bool value) { tiles_enabled.store(value, std::memory_order_relaxed); }

void set_int8_conv_serial_products(int64_t products) {
  serial_products.store(products < 0 ? kSerialProducts : products, std::memory_order_relaxed);
}

int64_t int8_wide_tile_rows() {
  static const int64_t here = amd_cpu_family() == 25 ? kZen4TileRows : kTileRows;
  const int64_t set = wide_tile_rows_set.load(std::memory_order_relaxed);
  return set != 0 ? set : here;
}

void set_int8_wide_tile_rows(int64_t rows) {
  TORCH_CHECK(rows == 0 || rows == kTileRows || rows == kZen4TileRows,
              "set_int8_wide_tile_rows: rows must be 0 (this CPU's), ", kTileRows, " or ",
              kZen4TileRows, ", got ", rows);
  wide_tile_rows_set.store(rows, std::memory_order_relaxed);
}

int64_t int8_conv_calls() { return calls.load(std::memory_order_relaxed); }

void note_int8_conv_call() { calls.fetch_add(1, std::memory_order_relaxed); }

bool int8_conv_takes(int64_t channels, const at::Tensor& weight, at::IntArrayRef dilation,
                     int64_t groups) {
  return enabled.load(std::memory_order_relaxed) && groups == 1 && weight.dim() == 4 &&
         channels == weight.size(1) && channels > 0 &&
         std::all_of(dilation.begin(), dilation.end(), [](int64_t d) { return d == 1; }) &&
         int8_conv_available();
}

at::Tensor pack_int8_conv_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 4,
              "pack_int8_conv_weight: an int8 [O, C, kh, kw] weight is needed, got ",
              weight.scalar_type(), weight.sizes());
  // An unfolded filter is packed as a 1x1 one of its kh x kw x C inputs, C fastest.
  const bool unfolded = unfolds(weight.size(1), weight.size(2), weight.size(3));
  const at::Tensor w =
      unfolded ? weight.permute({0, 2, 3, 1}).reshape({weight.size(0), -1, 1, 1}).contiguous()
               : weight.contiguous();
  const int64_t out_channels = w.size(0);
  const int64_t channels = w.size(1);
  const bool amx = amx_tiles_multiply();
  const int64_t depth = amx ? amx_padded_depth(padded_depth(channels)) : padded_depth(channels);
  const int64_t taps = w.size(2) * w.size(3);
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  const int64_t packed_bytes = blocks * taps * depth * kColumnBlock;  // a multiple of 4
  at::Tensor packed = at::empty({packed_bytes + out_channels * 4}, w.options());
  int8_t* data = packed.data_ptr<int8_t>();
  pack_weight(w.const_data_ptr<int8_t>(), out_channels, channels, depth, w.size(2), w.size(3),
              amx, data, reinterpret_cast<int32_t*>(data + packed_bytes));
  return packed;
}

void int8_conv(const uint8_t* input, int64_t batch, int64_t height, int64_t width,
               int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
               int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding,
               const Int8ConvEpilogue& e) {
  const int64_t sh = stride[0], sw = stride[1], ph = padding[0], pw = padding[1];
  TORCH_CHECK(sh > 0 && sw > 0 && ph >= 0 && pw >= 0, "int8_conv: strides must be positive "
              "and padding not negative, got ", stride, " and ", padding);
  const bool unfolded = unfolds(channels, kh, kw);
  const bool tiled = int8_conv_tiles_run();
  const bool pairs = tiled && !tiles_available();
  TORCH_CHECK(tiled || amx_int8_runs() || microkernel_available(),
              "int8_conv: this CPU runs none of its ",
              "ways to multiply (AVX-512 VNNI, AMX-INT8, or AVX2 with weights within 64)");
  // The register tiles read each row at its own position: a strided filter of fewer than 5
  // columns reads the padded image stepping by the stride (ConvPlanes' strided walk), its
  // copy the padding only (row by row), or none; stride-phase planes were copied pixel by
  // pixel, and each thread's half read half the other core's rows.
  const ConvPlanes planes(height, width, kh, kw, sh, sw, ph, pw,
                          /*strided_walk=*/tiled && !unfolded && kw < 5);
  TORCH_CHECK(planes.filter_fits(), "int8_conv: a ", kh, " x ", kw, " filter does not fit the ",
              height, " x ", width, " input padded by ", padding);
  const int64_t out_h = planes.out_h, out_w = planes.out_w;
  const int64_t taps = unfolded ? 1 : kh * kw;
  const int64_t blocks = (out_channels + kColumnBlock - 1) / kColumnBlock;
  const int64_t depth = padded_depth(unfolded ? kh * kw * channels : channels);
  const bool amx = !tiled && amx_int8_runs();  // amx_tiles_multiply(), as the pack saw it
  const int64_t packed_depth = amx ? amx_padded_depth(depth) : depth;
  const int64_t block_bytes = taps * packed_depth * kColumnBlock;
  TORCH_CHECK(packed.numel() == blocks * block_bytes + out_channels * 4,
              "int8_conv: the packed weight does not fit ", out_channels, " x ", channels,
              " x ", kh, " x ", kw);
  calls.fetch_add(1, std::memory_order_relaxed);
  if (batch <= 0 || out_h <= 0 || out_w <= 0 || out_channels <= 0) {
    return;
  }
  const int8_t* weights = packed.const_data_ptr<int8_t>();
  const int32_t* sums = reinterpret_cast<const int32_t*>(weights + blocks * block_bytes);

  // The planes the taps read (conv_planes.h; padding: the input's zero point, a real 0).
  // Without padding or stride the input is the one plane; otherwise they are copied.
  const int64_t plane_w = planes.plane_w;
  const int64_t image_bytes = planes.image_elements(depth);
  const uint8_t* src = input;
  at::Tensor large_planes;  // planes past kKeptPlaneBytes, for this call only
  // The AMX tiles read whole 64-byte rows: a depth of no multiple of 64 reads past the
  // input's last row, so its planes are copied (with slack), as an unfolded filter's are.
  if (!unfolded &&
      (!planes.input_is_plane() || depth != channels || (amx && depth % kAmxDepthStep != 0))) {
    uint8_t* dst = planes_buffer<uint8_t>(batch * image_bytes + kAmxSlack, kKeptPlaneBytes,
                                          large_planes);
    // A thread a 64 KB at least: a small image is copied by the calling thread alone.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (plane_w * depth));
    at::parallel_for(0, planes.plane_rows(batch), grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const auto [n, h, first_w] = planes.row(row);
        uint8_t* out = dst + row * plane_w * depth;
        if (h < 0 || h >= height) {
          std::memset(out, e.input_zero_point, plane_w * depth);
          continue;
        }
        const uint8_t* line = input + (n * height + h) * width * channels;
        if (planes.shared_padding && depth == channels) {  // the left padding, then the row
          std::memset(out, e.input_zero_point, pw * channels);
          std::memcpy(out + pw * channels, line, width * channels);
          continue;
        }
        // An image's (16 pixels at a time; their bytes within two vectors' reach).
        const int64_t step = planes.step_w;
        if (depth == 4 && step * channels <= 8 && few_channels_avx512()) {
          // Plane columns [lo, hi) lie inside the image; the rest is padding.
          const int64_t lo =
              std::min(plane_w, first_w >= 0 ? 0 : (-first_w + step - 1) / step);
          const int64_t hi =
              first_w >= width
                  ? lo
                  : std::max(lo, std::min(plane_w, (width - 1 - first_w) / step + 1));
          std::memset(out, e.input_zero_point, lo * depth);
          spread_pixels_avx512(line + (lo * step + first_w) * channels, out + lo * depth,
                               hi - lo, step, channels,
                               static_cast<uint8_t>(e.input_zero_point));
          std::memset(out + hi * depth, e.input_zero_point, (plane_w - hi) * depth);
          continue;
        }
        for (int64_t x = 0; x < plane_w; ++x) {
          const int64_t w = x * step + first_w;
          uint8_t* pixel = out + x * depth;
          if (w < 0 || w >= width) {
            std::memset(pixel, e.input_zero_point, depth);
            continue;
          }
          const uint8_t* from = line + w * channels;
          if (channels == 3) {  // an image's: spelled out, no call per pixel
            pixel[0] = from[0];
            pixel[1] = from[1];
            pixel[2] = from[2];
            pixel[3] = static_cast<uint8_t>(e.input_zero_point);
            continue;
          }
          if (channels % 64 == 0 && lines_avx512()) {  // no call per pixel
            copy_lines_avx512(from, pixel, channels / 64);
            continue;
          }
          std::memcpy(pixel, from, channels);
          for (int64_t c = channels; c < depth; ++c) {
            pixel[c] = static_cast<uint8_t>(e.input_zero_point);
          }
        }
      }
    });
    src = dst;
  }

  const Terms& terms = fold_terms(e, sums, out_channels, blocks * kColumnBlock);

  // The microkernel's GEMM rows run over a plane's flat pixel index p = oh * plane_w + ow, up
  // to the last output; columns ow >= out_w (past the image, or its padding) are computed
  // and dropped. Each tap's rows then start at a fixed offset in its plane, one pixel apart,
  // and the last one read is the plane's last pixel at most. The register tiles read each
  // row's input at its own plane position, so their rows are the output pixels only.
  // Unfolded rows are the output pixels in both ways, one tap of the whole depth.
  const int64_t rows = tiled || unfolded ? out_h * out_w : (out_h - 1) * plane_w + out_w;
  // Each tap's input offset from a row's (the microkernel's calls), and runs of taps
  // reading adjacent pixels grouped (the register tiles').
  const std::vector<int64_t> tap_offsets =
      unfolded ? std::vector<int64_t>{0} : planes.tap_offsets(depth);
  const std::vector<TapGroup> groups =
      unfolded ? std::vector<TapGroup>{{0, 0, depth}} : planes.tap_groups(depth);
  const auto finish = for_epilogue<FinishBlock>(e);
  const auto tiles = pairs ? for_epilogue<PairTileRows>(e) : for_epilogue<TileRows>(e);
  // The tiles' blocks of rows are whole tiles but the last: a short tile (a 2-row one runs
  // 8 dot-product chains, too few to hide their latency) once per image, not per block.
  // Blocks of rows in whole tiles of the tiles most blocks run (4 vectors, 64 channels).
  // The AMX tiles' blocks are whole pairs of 16-row tiles (a tail configures the tiles
  // anew).
  const int64_t tile = amx      ? 2 * kAmxTileRows
                       : !tiled ? 1
                       : pairs || out_channels < 64 ? kTileRows
                                                    : int8_wide_tile_rows();
  // A convolution of few products (a squeeze-excitation's 1x1 over one pixel) runs on
  // the calling thread: waking the others cost more than they saved.
  const int64_t threads = batch * rows * out_channels * taps * depth <
                                  serial_products.load(std::memory_order_relaxed)
                              ? 1
                              : at::get_num_threads();
  const ConvTasks work(batch, rows, blocks, kMaxRowBlock, tile,
                       /*columns_outer=*/blocks * block_bytes >
                           kColumnsOuterRatio * batch * rows * depth,
                       threads);
  // A 1x1 convolution over more input than the cores' L2 caches hold streams it in; the
  // tiles ask for the rows two tiles ahead (see register_tile).
  const int64_t fetch_ahead = !unfolded && taps == 1 && batch * rows * depth >= kStreamedBytes
                                  ? kFetchAheadTiles * kTileRows * planes.walk_w * depth
                                  : 0;
  run_task_runs(work.count(), [&](const auto& take) {
    // The microkernel's int32 block and its rows' pixels.
    thread_local std::vector<int32_t> acc;
    thread_local std::vector<int64_t> pixels;
    if (!tiled) {
      acc.resize(work.step * kColumnBlock);
      pixels.resize(work.step);
    }
    // An unfolded filter's block of rows, and which block of rows it holds.
    thread_local std::vector<uint8_t> unfolded_rows;
    int64_t unfolded_block = -1;
    if (unfolded) {
      unfolded_rows.resize(work.step * depth + kUnfoldSlack);
    }
    int64_t task = 0, end = 0;
    while (take(task, end)) {
      const auto [block, image_row, n, first, count] = work.at(task);
      const int64_t column = block * kColumnBlock;
      const int64_t width_here = std::min(kColumnBlock, out_channels - column);
      const int8_t* b = weights + block * block_bytes;
      // The rows' input: the image's planes (tap offsets from each row's plane position),
      // or an unfolded filter's block of rows, row r unfolded row r (output pixel
      // `first` + r of the image).
      const uint8_t* image = src + n * image_bytes;
      RowWalk walk(n, first, plane_w, batch, out_h, out_w, /*pixels=*/tiled, planes.walk_h,
                   planes.walk_w);
      if (unfolded) {
        if (image_row != unfolded_block) {
          (unfold_avx512() ? unfold_block : unfold_block_avx2)(
              input + n * height * width * channels, planes, channels, first, count, depth,
              static_cast<uint8_t>(e.input_zero_point), unfolded_rows.data());
          unfolded_block = image_row;
        }
        image = unfolded_rows.data();
        walk = RowWalk(n, 0, out_w, batch, out_h, out_w, /*pixels=*/true);
        walk.image_base += first;
      }
      if (tiled) {
        // Rows taken in turn by every column block are fetched ahead by the first only.
        tiles(image, count, depth, groups, b,
              work.columns_outer || block == 0 ? fetch_ahead : 0,
              work.next_block(task, end, weights, block_bytes), walk,
              width_here, out_channels, column, terms, e);
        continue;
      }
      const uint8_t* a = unfolded ? image : image + first * depth;
      // The int32 block (the AMX tiles', or the microkernel's by one call per tap), then
      // the epilogue.
      const int64_t n_columns = (width_here + 15) / 16 * 16;  // whole vectors: zeros past O
      if (amx) {
        const NextBlock next = work.next_block(task, end, weights, block_bytes);
        amx_int8_block(a, count, depth, packed_depth, tap_offsets.data(), taps, b, n_columns,
                       acc.data(), next.line, next.end);
      } else {
        for (int64_t t = 0; t < taps; ++t) {
          at::native::cpublas::brgemm(count, n_columns, depth, depth, kColumnBlock,
                                      kColumnBlock, /*add_C=*/t > 0, a + tap_offsets[t],
                                      b + t * depth * kColumnBlock, acc.data(),
                                      /*is_vnni=*/true);
        }
      }
      for (int64_t r = 0; r < count; ++r) {
        pixels[r] = walk.next();
      }
      finish(acc.data(), count, pixels.data(), width_here, out_channels, column, terms, e);
    }
    if (amx) {
      amx_int8_release();
    } else if (!tiled) {
      at::native::cpublas::brgemm_release(true);
    }
  }, threads);
}

const GateTable& gelu_gate_table(bool tanh_form) {
  const auto make = [](bool tanh_gate) {
    GateTable table{};
    const double width = double{kGateEnd} / kGateSegments;
    for (int segment = 0; segment < kGateSegments; ++segment) {
      // The cubic through the gate at 4 Chebyshev nodes of the segment, in f = 0..1:
      // Lagrange's basis polynomials expanded into powers of f.
      double node[4], value[4];
      for (int j = 0; j < 4; ++j) {
        node[j] = 0.5 - 0.5 * std::cos((2 * j + 1) * M_PI / 8);
        const double x = (segment + node[j]) * width;
        value[j] = tanh_gate
                       ? 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)))
                       : 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
      }
      double power[4] = {0, 0, 0, 0};
      for (int j = 0; j < 4; ++j) {
        double basis[4] = {1, 0, 0, 0};  // prod over m != j of (f - node[m]) / (node[j] - node[m])
        int degree = 0;
        for (int m = 0; m < 4; ++m) {
          if (m == j) {
            continue;
          }
          const double denominator = node[j] - node[m];
          for (int k = ++degree; k >= 0; --k) {
            basis[k] = ((k > 0 ? basis[k - 1] : 0.0) - node[m] * basis[k]) / denominator;
          }
        }
        for (int k = 0; k < 4; ++k) {
          power[k] += value[j] * basis[k];
        }
      }
      for (int k = 0; k < 4; ++k) {
        table.c[k][segment] = static_cast<float>(power[k]);
      }
    }
    return table;
  };
  static const GateTable erf_table = make(false), tanh_table = make(true);
  return tanh_form ? tanh_table : erf_table;
}

}  // namespace blade::ral
