// Depthwise 3x3 and 5x5 convolutions of NHWC float32 data (depthwise_conv.h).
#include "ral/depthwise_conv.h"

#include "ral/conv_activation.h"
#include "ral/cpu_features.h"
#include "ral/int8_epilogue.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

namespace blade::ral {
namespace {

struct Geometry {
  int64_t h, w, c, sh, sw, ph, pw, dh, dw, oh, ow;
};

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// their _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// How a row's sums end: bias, the post-op, and for uint8 data the ranges (the sums are
// of raw bytes; the result is rounded to uint8 where ranges.out_u8 is set).
struct Finish {
  const float* bias;
  DepthwisePostOp post_op;
  DepthwiseRanges ranges;
};

// 16 channels of a pixel under `mask` (all of them: kFull), as float32.
template <bool kFull>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline __m512 load16(
    const float* p, __mmask16 mask) {
  return kFull ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mask, p);
}
template <bool kFull>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline __m512 load16(
    const uint8_t* p, __mmask16 mask) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
      kFull ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
            : _mm_maskz_loadu_epi8(mask, p)));
}

// The vectors a row's pixels end with: the bias, uint8 data's scales and zero points.
struct Ends {
  __m512 bias, start, scale, in_zero_point, out_inverse, out_zero_point, zero;
};

// A pixel's sum finished as e says and stored at pixel `ox` of the output row. uint8 data's
// sums are of raw bytes, a tap outside the image reading the zero point's byte: every tap's
// filter (`taps`) times the zero point is taken off before scaling.
template <typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void finish(
    __m512 sum, __m512 taps, const Finish& e, const Ends& v, float* y, int64_t out_row,
    int64_t ox, const Geometry& g, int64_t ch, __mmask16 mask) {
  const DepthwiseRanges& r = e.ranges;
  if constexpr (std::is_same_v<In, uint8_t>) {
    sum = _mm512_fmadd_ps(_mm512_fnmadd_ps(v.in_zero_point, taps, sum), v.scale, v.bias);
  }
  if (e.post_op == DepthwisePostOp::kRelu) {
    // vmaxps returns its second operand for a NaN: NaN stays, as torch.relu
    sum = _mm512_max_ps(v.zero, sum);
  } else if (e.post_op == DepthwisePostOp::kHardswish) {
    sum = hardswish_units(sum, _mm512_set1_ps(1.0f), v.zero);
  }
  // A whole vector's store unmasked, its bytes narrowed in a register (masked stores cost
  // float_conv.cpp's tiles much on an AMD EPYC; here no change was measurable).
  if (r.out_u8 != nullptr) {  // to nearest, ties to even (NaN: 0), one multiply-add
    const __m512 u = _mm512_fmadd_ps(sum, v.out_inverse, v.out_zero_point);
    const __m128i bytes = _mm512_cvtepi32_epi8(uint8_steps(u, v.zero));
    uint8_t* to = r.out_u8 + out_row + ox * g.c + ch;
    if (mask == 0xFFFF) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to), bytes);
    } else {
      _mm_mask_storeu_epi8(to, mask, bytes);
    }
  } else if (mask == 0xFFFF) {
    _mm512_storeu_ps(y + out_row + ox * g.c + ch, sum);
  } else {
    _mm512_mask_storeu_ps(y + out_row + ox * g.c + ch, mask, sum);
  }
}

// A pixel's sum from one partial sum per filter row: KH chains of KW multiply-adds, where
// one chain of all the taps would make a lone pixel wait on each multiply-add's latency.
template <int KH>
__attribute__((target("avx512f"), always_inline)) inline __m512 sum_rows(const __m512* part) {
  if constexpr (KH == 3) {
    return _mm512_add_ps(_mm512_add_ps(part[0], part[1]), part[2]);
  } else {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(part[0], part[1]),
                                       _mm512_add_ps(part[2], part[3])),
                         part[4]);
  }
}

// Pixels a block of one output row sums at once (eight sums in flight cover the
// multiply-adds' latency on two ports), and the fewer a row's end takes.
constexpr int kBlock = 8;
constexpr int kShortBlock = 4;

// What a float32 tap outside the image reads: 16 zeros.
alignas(64) constexpr uint8_t kZeroBytes[64] = {};

// The output row a task makes: its image's input rows under each filter row, and what a
// tap outside the image reads (zeros; uint8 data: the zero point's byte, a real zero).
template <int KH, typename In>
struct RowTask {
  const In* line[KH];  // filter row i's input row at the channel block (when row_in[i])
  bool row_in[KH];
  bool all_rows;
  const In* pad;
  int64_t out_row;
  int64_t ch;
  __mmask16 mask;
};

// U neighbouring pixels at stride SW (filter columns one pixel apart) from the input column
// ix0 on: each input column of their window is loaded once and multiplied by every filter
// tap that reads it, the column's address one pixel on from the last. (Sums of four pixels
// tap by tap needed a row's taps' addresses, more than the registers hold: each
// multiply-add waited on an address reloaded from the stack.) kGuard: some columns or (for
// uint8 data) rows lie outside the image and read the pad; float32 data skips rows outside.
template <int KH, int KW, int SW, int U, bool kGuard, bool kFull, typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void slide(
    const RowTask<KH, In>& t, const Geometry& g, int64_t ix0, const __m512* f, __m512 start,
    __m512* sums) {
  constexpr int kColumns = (U - 1) * SW + KW;
#pragma GCC unroll 16
  for (int p = 0; p < U; ++p) {
    sums[p] = start;
  }
#pragma GCC unroll 5
  for (int i = 0; i < KH; ++i) {
    if (std::is_same_v<In, float> && !t.row_in[i]) {
      continue;  // its taps all read zeros
    }
    // The column's offset stepped in a register: left to itself, the compiler keeps each
    // column's offset (k times the row's pixel size) apart, on the stack.
    int64_t offset = ix0 * g.c;
#pragma GCC unroll 40
    for (int k = 0; k < kColumns; ++k) {
      const In* at = t.line[i] + offset;
      if constexpr (kGuard) {
        const bool inside = t.row_in[i] && static_cast<uint64_t>(ix0 + k) <
                                               static_cast<uint64_t>(g.w);
        at = inside ? at : t.pad;
      }
      offset += g.c;
      asm("" : "+r"(offset));
      const __m512 column = load16<kFull>(at, t.mask);
#pragma GCC unroll 16
      for (int p = 0; p < U; ++p) {
        const int j = k - p * SW;  // the filter column that reads this input column
        if (j >= 0 && j < KW) {
          sums[p] = _mm512_fmadd_ps(column, f[i * KW + j], sums[p]);
        }
      }
    }
  }
}

// The pixels [ox, ox + blocks * U) of a task's row, U at a time, summed by slide and
// finished, the last block's first `last` alone (the others, past the row's end, are
// summed from the pad and dropped). A function of its own: inlined into the row's, its
// loop's registers were shared with the whole row's and its addresses kept on the stack.
template <int KH, int KW, int U, bool kFull, typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"), noinline)) void blocks(
    const RowTask<KH, In>& task, const Finish& finish_as, const Ends& ends,
    const __m512* filters, __m512 all_taps, float* y, const Geometry& geometry, int64_t ox,
    int64_t count, int last) {
  // Copies in locals, as row_block's: the stores would reload fields read by reference.
  const RowTask<KH, In> t = task;
  const Geometry g = geometry;
  const Finish e = finish_as;
  const Ends v = ends;
  __m512 f[KH * KW];
#pragma GCC unroll 25
  for (int k = 0; k < KH * KW; ++k) {
    f[k] = filters[k];
  }
  for (int64_t n = 0; n < count; ++n, ox += U) {
    const int64_t ix0 = ox * g.sw - g.pw;
    const bool guard = ix0 < 0 || ix0 + (U - 1) * g.sw + KW > g.w ||
                       (std::is_same_v<In, uint8_t> && !t.all_rows);
    __m512 sums[U];
    if (g.sw == 1) {
      if (guard) {
        slide<KH, KW, 1, U, true, kFull>(t, g, ix0, f, v.start, sums);
      } else {
        slide<KH, KW, 1, U, false, kFull>(t, g, ix0, f, v.start, sums);
      }
    } else if (guard) {
      slide<KH, KW, 2, U, true, kFull>(t, g, ix0, f, v.start, sums);
    } else {
      slide<KH, KW, 2, U, false, kFull>(t, g, ix0, f, v.start, sums);
    }
    const int keep = n + 1 < count ? U : last;
#pragma GCC unroll 16
    for (int p = 0; p < U; ++p) {
      if (p < keep) {
        finish<In>(sums[p], all_taps, e, v, y, t.out_row, ox + p, g, t.ch, t.mask);
      }
    }
  }
}

// Output row `oy` of image `b` (row_block's).
template <int KH, int KW, bool kFull, typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline void row(
    RowTask<KH, In>& t, const In* image, const Finish& e, const Ends& v, const __m512* f,
    __m512 all_taps, float* y, const Geometry& g, int64_t b, int64_t oy) {
  t.out_row = (b * g.oh + oy) * g.ow * g.c;
  t.all_rows = true;
  for (int i = 0; i < KH; ++i) {
    const int64_t iy = oy * g.sh - g.ph + i * g.dh;
    t.row_in[i] = iy >= 0 && iy < g.h;
    t.line[i] = image + (t.row_in[i] ? iy : 0) * g.w * g.c + t.ch;
    t.all_rows = t.all_rows && t.row_in[i];
  }
  int64_t ox = 0;
  if (g.dw == 1 && (g.sw == 1 || g.sw == 2)) {
    // Whole blocks, then the row's end in a block of kShortBlock or kBlock whose pixels
    // past it are dropped: one pixel at a time, a 7-pixel row of a 5x5 layer took 5 times
    // its multiply-adds' time (each tap's bounds tested, each pixel's chains waited on).
    const int64_t count = g.ow / kBlock;
    const int rest = static_cast<int>(g.ow - count * kBlock);
    if (rest > kShortBlock) {
      blocks<KH, KW, kBlock, kFull>(t, e, v, f, all_taps, y, g, ox, count + 1, rest);
    } else {
      if (count > 0) {
        blocks<KH, KW, kBlock, kFull>(t, e, v, f, all_taps, y, g, ox, count, kBlock);
      }
      if (rest > 0) {
        blocks<KH, KW, kShortBlock, kFull>(t, e, v, f, all_taps, y, g, ox + count * kBlock,
                                           1, rest);
      }
    }
    ox = g.ow;
  }
  // Other strides and dilations one pixel at a time.
  for (; ox < g.ow; ++ox) {
    __m512 part[KH];
#pragma GCC unroll 5
    for (int i = 0; i < KH; ++i) {
      part[i] = i == 0 ? v.start : v.zero;
#pragma GCC unroll 5
      for (int j = 0; j < KW; ++j) {
        const int64_t ix = ox * g.sw - g.pw + j * g.dw;
        const bool inside = t.row_in[i] && ix >= 0 && ix < g.w;
        part[i] = _mm512_fmadd_ps(
            load16<kFull>(inside ? t.line[i] + ix * g.c : t.pad, t.mask), f[i * KW + j],
            part[i]);
      }
    }
    finish<In>(sum_rows<KH>(part), all_taps, e, v, y, t.out_row, ox, g, t.ch, t.mask);
  }
}

// Output rows [oy_begin, oy_end) of image `b` for the channels [ch, ch + 16) under `mask`:
// the KH x KW filter vectors loaded once, then in each row at stride 1 or 2 without
// dilation the pixels kBlock at a time and the row's end in one block (slide), at other
// strides or dilations one at a time, each tap outside the image reading the pad; SiLU
// over each row made, in cache (in `finish`, its constants would take the registers that
// hold the filters). Float32 data sums from the bias; uint8 data sums its bytes.
template <int KH, int KW, bool kFull, typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void row_block(
    const In* x, const float* filters, const Finish& finish_as, float* y,
    const Geometry& geometry, int64_t b, int64_t oy_begin, int64_t oy_end, int64_t ch,
    __mmask16 mask) {
  // Copies in locals: a vector store may alias anything, so fields read through the
  // references were loaded again after each one.
  const Geometry g = geometry;
  const Finish e = finish_as;
  __m512 f[KH * KW];
  __m512 all_taps = _mm512_setzero_ps();
  // Unrolled, as every loop over the taps: with constant indices the filters stay in
  // registers (an indexed array lives on the stack, each multiply-add loading from it).
#pragma GCC unroll 25
  for (int t = 0; t < KH * KW; ++t) {
    f[t] = _mm512_maskz_loadu_ps(mask, filters + t * g.c + ch);
    all_taps = _mm512_add_ps(all_taps, f[t]);
  }
  Ends v;
  v.bias = e.bias != nullptr ? _mm512_maskz_loadu_ps(mask, e.bias + ch) : _mm512_setzero_ps();
  v.start = std::is_same_v<In, uint8_t> ? _mm512_setzero_ps() : v.bias;
  // uint8 data: the input's scale times the filters' (whose int8 values the filters are).
  const DepthwiseRanges& r = e.ranges;
  v.scale = _mm512_mul_ps(_mm512_set1_ps(r.scale),
                          r.channel_scale != nullptr
                              ? _mm512_maskz_loadu_ps(mask, r.channel_scale + ch)
                              : _mm512_set1_ps(1.0f));
  v.in_zero_point = _mm512_set1_ps(static_cast<float>(r.zero_point));
  v.out_inverse = _mm512_set1_ps(1.0f / r.out_scale);
  v.out_zero_point = _mm512_set1_ps(static_cast<float>(r.out_zero_point));
  v.zero = _mm512_setzero_ps();
  alignas(64) uint8_t zero_point_bytes[16];
  std::fill(zero_point_bytes, zero_point_bytes + 16, static_cast<uint8_t>(r.zero_point));
  RowTask<KH, In> t;
  t.pad = reinterpret_cast<const In*>(std::is_same_v<In, uint8_t> ? zero_point_bytes
                                                                   : kZeroBytes);
  t.ch = ch;
  t.mask = mask;
  const In* image = x + b * g.h * g.w * g.c;
  for (int64_t oy = oy_begin; oy < oy_end; ++oy) {
    row<KH, KW, kFull>(t, image, e, v, f, all_taps, y, g, b, oy);
    if (e.post_op == DepthwisePostOp::kSilu) {
      activation_rows(ConvActivation::kSilu, y + t.out_row + ch, g.ow,
                      std::min<int64_t>(16, g.c - ch), g.c);
    }
  }
}

#pragma GCC diagnostic pop

// The AVX2 form of float32 data's kernel (no AVX-512): 8 channels a vector, the filters in
// a local array (their multiply-adds read them from L1: 3x3's nine vectors and eight sums
// would not fit the 16 registers with the columns), 8 pixels of a row at a time at stride
// 1 or 2 without dilation, each input column of their window loaded once for every tap
// that reads it, a tap outside the image reading zeros (a row's last block sums pixels
// past its end so and drops them); other strides and dilations one pixel at a time.
namespace avx2 {

constexpr int kBlock = 8;

// The channels [ch, ch + 8) of a pixel, those past `left` as zeros.
template <bool kFull>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 load8(const float* p,
                                                                      __m256i mask) {
  return kFull ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

// An output row's task: its input rows under each filter row (row_in: inside the image).
template <int KH>
struct Row {
  const float* line[KH];
  bool row_in[KH];
};

// kBlock pixels from input column ix0 on at stride SW: their KH x KW taps' sums from
// `start`, rows outside the image skipped; kGuard: some columns lie outside and read the
// zeros at `pad`.
template <int KH, int KW, int SW, bool kGuard, bool kFull>
__attribute__((target("avx2,fma"), always_inline)) inline void slide(
    const Row<KH>& t, const Geometry& g, int64_t ix0, const __m256* f, __m256 start,
    const float* pad, __m256i mask, __m256* sums) {
  constexpr int kColumns = (kBlock - 1) * SW + KW;
#pragma GCC unroll 8
  for (int p = 0; p < kBlock; ++p) {
    sums[p] = start;
  }
#pragma GCC unroll 5
  for (int i = 0; i < KH; ++i) {
    if (!t.row_in[i]) {
      continue;
    }
    int64_t offset = ix0 * g.c;
#pragma GCC unroll 40
    for (int k = 0; k < kColumns; ++k) {
      const float* at = t.line[i] + offset;
      if constexpr (kGuard) {
        at = static_cast<uint64_t>(ix0 + k) < static_cast<uint64_t>(g.w) ? at : pad;
      }
      offset += g.c;
      const __m256 column = load8<kFull>(at, mask);
#pragma GCC unroll 8
      for (int p = 0; p < kBlock; ++p) {
        const int j = k - p * SW;
        if (j >= 0 && j < KW) {
          sums[p] = _mm256_fmadd_ps(column, f[i * KW + j], sums[p]);
        }
      }
    }
  }
}

// A pixel's sum finished: the post-op (ReLU keeps NaN), stored at pixel ox of the row.
template <bool kFull>
__attribute__((target("avx2,fma"), always_inline)) inline void finish(__m256 sum,
                                                                      DepthwisePostOp post_op,
                                                                      float* at, __m256i mask) {
  const __m256 zero = _mm256_setzero_ps();
  if (post_op == DepthwisePostOp::kRelu) {
    sum = _mm256_max_ps(zero, sum);
  } else if (post_op == DepthwisePostOp::kHardswish) {
    sum = hardswish8(sum);
  }
  if constexpr (kFull) {
    _mm256_storeu_ps(at, sum);
  } else {
    _mm256_maskstore_ps(at, mask, sum);
  }
}

// Output rows [oy_begin, oy_end) of image b for the channels [ch, ch + 8).
template <int KH, int KW, bool kFull>
__attribute__((target("avx2,fma"))) void row_block(const float* x, const float* filters,
                                                   const Finish& e, float* y,
                                                   const Geometry& geometry, int64_t b,
                                                   int64_t oy_begin, int64_t oy_end,
                                                   int64_t ch) {
  const Geometry g = geometry;
  const __m256i mask = lanes8(g.c - ch);
  __m256 f[KH * KW];
#pragma GCC unroll 25
  for (int k = 0; k < KH * KW; ++k) {
    f[k] = load8<kFull>(filters + k * g.c + ch, mask);
  }
  const __m256 bias = e.bias != nullptr ? load8<kFull>(e.bias + ch, mask) : _mm256_setzero_ps();
  alignas(32) static constexpr float kZeros[8] = {};
  const float* image = x + b * g.h * g.w * g.c + ch;
  const bool slides = g.dw == 1 && (g.sw == 1 || g.sw == 2);
  for (int64_t oy = oy_begin; oy < oy_end; ++oy) {
    Row<KH> t;
    for (int i = 0; i < KH; ++i) {
      const int64_t iy = oy * g.sh - g.ph + i * g.dh;
      t.row_in[i] = iy >= 0 && iy < g.h;
      t.line[i] = image + (t.row_in[i] ? iy : 0) * g.w * g.c;
    }
    float* out = y + (b * g.oh + oy) * g.ow * g.c + ch;
    // Blocks of kBlock pixels, the last one's pixels past the row summed from the zeros
    // and dropped.
    for (int64_t ox = 0; slides && ox < g.ow; ox += kBlock) {
      const int64_t ix0 = ox * g.sw - g.pw;
      const bool guard = ix0 < 0 || ix0 + (kBlock - 1) * g.sw + KW > g.w;
      __m256 sums[kBlock];
      if (g.sw == 1 && guard) {
        slide<KH, KW, 1, true, kFull>(t, g, ix0, f, bias, kZeros, mask, sums);
      } else if (g.sw == 1) {
        slide<KH, KW, 1, false, kFull>(t, g, ix0, f, bias, kZeros, mask, sums);
      } else if (guard) {
        slide<KH, KW, 2, true, kFull>(t, g, ix0, f, bias, kZeros, mask, sums);
      } else {
        slide<KH, KW, 2, false, kFull>(t, g, ix0, f, bias, kZeros, mask, sums);
      }
      const int64_t keep = std::min<int64_t>(kBlock, g.ow - ox);
#pragma GCC unroll 8
      for (int p = 0; p < kBlock; ++p) {
        if (p < keep) {
          finish<kFull>(sums[p], e.post_op, out + (ox + p) * g.c, mask);
        }
      }
    }
    // Other strides and dilations one pixel at a time, a chain of multiply-adds per
    // filter row.
    for (int64_t ox = 0; !slides && ox < g.ow; ++ox) {
      __m256 part[KH];
#pragma GCC unroll 5
      for (int i = 0; i < KH; ++i) {
        part[i] = i == 0 ? bias : _mm256_setzero_ps();
#pragma GCC unroll 5
        for (int j = 0; j < KW; ++j) {
          const int64_t ix = ox * g.sw - g.pw + j * g.dw;
          const bool inside = t.row_in[i] && ix >= 0 && ix < g.w;
          part[i] = _mm256_fmadd_ps(load8<kFull>(inside ? t.line[i] + ix * g.c : kZeros, mask),
                                    f[i * KW + j], part[i]);
        }
      }
      __m256 sum = part[0];
#pragma GCC unroll 5
      for (int i = 1; i < KH; ++i) {
        sum = _mm256_add_ps(sum, part[i]);
      }
      finish<kFull>(sum, e.post_op, out + ox * g.c, mask);
    }
    if (e.post_op == DepthwisePostOp::kSilu) {
      activation_rows(ConvActivation::kSilu, out, g.ow, std::min<int64_t>(8, g.c - ch), g.c);
    }
  }
}

}  // namespace avx2

// Whether the float32 kernel runs its AVX-512 form (else AVX2's).
bool depthwise_in_avx512() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl");
  return available;
}

template <int KH, int KW, typename In>
void convolve(const In* x, int64_t n, const float* filters, const Finish& e, float* y,
              const Geometry& g) {
  // Tasks of a band of output rows and one block of 16 channels, in bands of about
  // kTaskPixels pixels (a small image's filters and constants set up once, not per row).
  // Each thread's share is whole bands, a multiple of the threads' count: the image's rows
  // split among the threads as the layer before mostly wrote them (reading the half of each
  // row another core wrote cost more than the sums).
  constexpr int64_t kTaskPixels = 256;
  const bool avx512 = depthwise_in_avx512();
  const int64_t lanes = avx512 ? 16 : 8;
  const int64_t blocks = (g.c + lanes - 1) / lanes;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t most = std::clamp<int64_t>((kTaskPixels + g.ow - 1) / g.ow, 1, g.oh);
  const int64_t bands = std::min(
      g.oh, threads * std::max<int64_t>(1, (g.oh + threads * most - 1) / (threads * most)));
  const int64_t row_tasks = n * bands;
  at::parallel_for(0, row_tasks * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t band = task / blocks;
      const int64_t block = task % blocks;
      const int64_t b = band / bands;
      const int64_t oy = band % bands * g.oh / bands;  // bands as even as they go
      const int64_t oy_end = (band % bands + 1) * g.oh / bands;
      const int64_t ch = block * lanes;
      if constexpr (std::is_same_v<In, float>) {
        if (!avx512) {
          (ch + 8 <= g.c ? avx2::row_block<KH, KW, true> : avx2::row_block<KH, KW, false>)(
              x, filters, e, y, g, b, oy, oy_end, ch);
          continue;
        }
      }
      const __mmask16 mask = lanes_left(g.c - ch);
      if (mask == 0xffff) {
        row_block<KH, KW, true>(x, filters, e, y, g, b, oy, oy_end, ch, mask);
      } else {
        row_block<KH, KW, false>(x, filters, e, y, g, b, oy, oy_end, ch, mask);
      }
    }
  });
}

template <typename In>
bool run(const In* x, int64_t n, int64_t kh, int64_t kw, const float* filters,
         const Finish& e, float* y, const Geometry& g) {
  const bool available =
      std::is_same_v<In, float> ? depthwise_conv_available() : depthwise_uint8_available();
  if (!available || !depthwise_conv_takes(kh, kw) || n <= 0 || g.h <= 0 ||
      g.w <= 0 || g.c <= 0 || g.oh <= 0 || g.ow <= 0 || g.sh <= 0 || g.sw <= 0 ||
      g.dh <= 0 || g.dw <= 0 || g.ph < 0 || g.pw < 0) {
    return false;
  }
  if (kh == 3) {
    convolve<3, 3>(x, n, filters, e, y, g);
  } else {
    convolve<5, 5>(x, n, filters, e, y, g);
  }
  return true;
}

}  // namespace

bool depthwise_conv_available() {
  static const bool available =
      depthwise_in_avx512() || (has_cpu_feature("avx2") && has_cpu_feature("fma"));
  return available;
}

bool depthwise_uint8_available() { return depthwise_in_avx512(); }

bool depthwise_conv_takes(int64_t kh, int64_t kw) {
  return (kh == 3 && kw == 3) || (kh == 5 && kw == 5);
}

bool depthwise_conv2d(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* filters, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw, const float* bias,
                      DepthwisePostOp post_op, float* y, int64_t oh, int64_t ow) {
  return run(x, n, kh, kw, filters, Finish{bias, post_op, {}}, y,
             Geometry{h, w, c, sh, sw, ph, pw, dh, dw, oh, ow});
}

bool depthwise_conv2d_uint8(const uint8_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                            const float* filters, int64_t kh, int64_t kw, int64_t sh,
                            int64_t sw, int64_t ph, int64_t pw, const float* bias,
                            DepthwisePostOp post_op, const DepthwiseRanges& ranges, float* y,
                            int64_t oh, int64_t ow) {
  TORCH_CHECK(post_op != DepthwisePostOp::kSilu,
              "depthwise_conv2d_uint8: SiLU is a post-op of float32 data only");
  TORCH_CHECK(ranges.zero_point >= 0 && ranges.zero_point <= 255,
              "depthwise_conv2d_uint8: a uint8 zero point is in [0, 255], got ",
              ranges.zero_point);
  return run(x, n, kh, kw, filters, Finish{bias, post_op, ranges}, y,
             Geometry{h, w, c, sh, sw, ph, pw, 1, 1, oh, ow});
}

}  // namespace blade::ral
