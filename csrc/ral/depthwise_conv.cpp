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

// A pixel's sum (`taps`: the filters of its taps inside the image, for uint8 data's zero
// point) finished as e says and stored at pixel `ox` of the output row.
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

// Pixels a stride-1 row sums at once from one window of input columns.
constexpr int kSlide = 8;

// What a tap outside the image reads: zeros (16 lanes of any input type).
alignas(64) constexpr uint8_t kZeroBytes[64] = {};

// One output row (image row `oy` of image `b`) for the channels [ch, ch + 16) under
// `mask`: the KH x KW filter vectors loaded once, then the pixels whose taps all lie
// inside the image four at a time (four sums in flight: one pixel's taps are a chain of
// dependent multiply-adds), and the others one at a time, each tap outside reading zeros
// instead (no branch). Float32 data sums from the bias; uint8 data sums its bytes, and the
// zero point times the taps' filters inside the image is taken off before scaling (a tap
// outside is a real zero).
template <int KH, int KW, bool kFull, typename In>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void row_block(
    const In* x, const float* filters, const Finish& finish_as, float* y,
    const Geometry& geometry, int64_t b, int64_t oy, int64_t ch, __mmask16 mask) {
  constexpr bool kUint8 = std::is_same_v<In, uint8_t>;
  // Copies in locals: a vector store may alias anything, so fields read through the
  // references were loaded again after each one (and the taps' offsets computed again).
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
  v.start = kUint8 ? _mm512_setzero_ps() : v.bias;
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
  const In* image = x + b * g.h * g.w * g.c;
  const int64_t out_row = (b * g.oh + oy) * g.ow * g.c;
  // The columns [first, end) whose taps all lie inside the image, on rows that all do: no
  // bounds to check there.
  int64_t iy[KH];
  bool row_in[KH];
  bool all_rows = true;
  for (int i = 0; i < KH; ++i) {
    iy[i] = oy * g.sh - g.ph + i * g.dh;
    row_in[i] = iy[i] >= 0 && iy[i] < g.h;
    all_rows = all_rows && row_in[i];
  }
  const int64_t first = std::min((g.pw + g.sw - 1) / g.sw, g.ow);
  const int64_t reach = g.w - 1 + g.pw - (KW - 1) * g.dw;
  const int64_t end = all_rows && reach >= 0 ? std::max(first, std::min(reach / g.sw + 1, g.ow))
                                             : first;
  const In* zeros = reinterpret_cast<const In*>(kZeroBytes);
  for (int64_t ox = 0; ox < g.ow; ++ox) {
    if (ox == first && end > first) {
      // The inside pixels: uint8 data at stride 1 kSlide at a time, each input column of
      // their window widened to float32 once for the KW sums that read it (float32 data
      // lost so: its loads cost nothing to redo); then four at a time, then one at a time.
      if (kUint8 && g.sw == 1 && g.dw == 1) {
        for (; ox + kSlide <= end; ox += kSlide) {
          const In* tap = image + (iy[0] * g.w + ox - g.pw) * g.c + ch;
          __m512 sums[kSlide];
#pragma GCC unroll 8
          for (int p = 0; p < kSlide; ++p) {
            sums[p] = v.start;
          }
#pragma GCC unroll 5
          for (int i = 0; i < KH; ++i) {
            const In* line = tap + i * g.dh * g.w * g.c;
            __m512 column[kSlide + KW - 1];
#pragma GCC unroll 12
            for (int c = 0; c < kSlide + KW - 1; ++c) {
              column[c] = load16<kFull>(line + c * g.c, mask);
            }
#pragma GCC unroll 5
            for (int j = 0; j < KW; ++j) {
#pragma GCC unroll 8
              for (int p = 0; p < kSlide; ++p) {
                sums[p] = _mm512_fmadd_ps(column[p + j], f[i * KW + j], sums[p]);
              }
            }
          }
#pragma GCC unroll 8
          for (int p = 0; p < kSlide; ++p) {
            finish<In>(sums[p], all_taps, e, v, y, out_row, ox + p, g, ch, mask);
          }
        }
      }
      const int64_t step = g.sw * g.c;
      for (; ox + 4 <= end; ox += 4) {
        const In* tap = image + (iy[0] * g.w + ox * g.sw - g.pw) * g.c + ch;
        __m512 s0 = v.start;
        __m512 s1 = v.start;
        __m512 s2 = v.start;
        __m512 s3 = v.start;
#pragma GCC unroll 5
        for (int i = 0; i < KH; ++i) {
#pragma GCC unroll 5
          for (int j = 0; j < KW; ++j) {
            const In* p = tap + (i * g.dh * g.w + j * g.dw) * g.c;
            const __m512 w = f[i * KW + j];
            s0 = _mm512_fmadd_ps(load16<kFull>(p, mask), w, s0);
            s1 = _mm512_fmadd_ps(load16<kFull>(p + step, mask), w, s1);
            s2 = _mm512_fmadd_ps(load16<kFull>(p + 2 * step, mask), w, s2);
            s3 = _mm512_fmadd_ps(load16<kFull>(p + 3 * step, mask), w, s3);
          }
        }
        finish<In>(s0, all_taps, e, v, y, out_row, ox, g, ch, mask);
        finish<In>(s1, all_taps, e, v, y, out_row, ox + 1, g, ch, mask);
        finish<In>(s2, all_taps, e, v, y, out_row, ox + 2, g, ch, mask);
        finish<In>(s3, all_taps, e, v, y, out_row, ox + 3, g, ch, mask);
      }
      for (; ox < end; ++ox) {
        const In* tap = image + (iy[0] * g.w + ox * g.sw - g.pw) * g.c + ch;
        __m512 part[KH];
#pragma GCC unroll 5
        for (int i = 0; i < KH; ++i) {
          part[i] = i == 0 ? v.start : v.zero;
#pragma GCC unroll 5
          for (int j = 0; j < KW; ++j) {
            const In* p = tap + (i * g.dh * g.w + j * g.dw) * g.c;
            part[i] = _mm512_fmadd_ps(load16<kFull>(p, mask), f[i * KW + j], part[i]);
          }
        }
        finish<In>(sum_rows<KH>(part), all_taps, e, v, y, out_row, ox, g, ch, mask);
      }
      if (ox >= g.ow) {
        break;
      }
    }
    // A pixel at the image's edge: each tap outside reads zeros.
    __m512 part[KH];
    __m512 taps = v.zero;  // the filters of the taps inside the image
#pragma GCC unroll 5
    for (int i = 0; i < KH; ++i) {
      const In* line = row_in[i] ? image + iy[i] * g.w * g.c + ch : zeros;
      part[i] = i == 0 ? v.start : v.zero;
#pragma GCC unroll 5
      for (int j = 0; j < KW; ++j) {
        const int64_t ix = ox * g.sw - g.pw + j * g.dw;
        const bool inside = row_in[i] && ix >= 0 && ix < g.w;
        part[i] = _mm512_fmadd_ps(load16<kFull>(inside ? line + ix * g.c : zeros, mask),
                                  f[i * KW + j], part[i]);
        if constexpr (kUint8) {
          taps = _mm512_mask_add_ps(taps, inside ? mask : 0, taps, f[i * KW + j]);
        }
      }
    }
    finish<In>(sum_rows<KH>(part), kUint8 ? taps : all_taps, e, v, y, out_row, ox, g, ch,
               mask);
  }
}

#pragma GCC diagnostic pop

template <int KH, int KW, typename In>
void convolve(const In* x, int64_t n, const float* filters, const Finish& e, float* y,
              const Geometry& g) {
  // Tasks of one output row and one block of 16 channels: a 7 x 7 image has too few rows
  // to share evenly among the threads on its own.
  const int64_t blocks = (g.c + 15) / 16;
  at::parallel_for(0, n * g.oh * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / blocks;
      const int64_t ch = task % blocks * 16;
      const __mmask16 mask = lanes_left(g.c - ch);
      if (mask == 0xffff) {
        row_block<KH, KW, true>(x, filters, e, y, g, row / g.oh, row % g.oh, ch, mask);
      } else {
        row_block<KH, KW, false>(x, filters, e, y, g, row / g.oh, row % g.oh, ch, mask);
      }
      // SiLU over the row just made, in cache (in `finish`, its constants would take the
      // registers that hold the filters).
      if (e.post_op == DepthwisePostOp::kSilu) {
        silu_rows(y + row * g.ow * g.c + ch, g.ow, std::min<int64_t>(16, g.c - ch), g.c);
      }
    }
  });
}

template <typename In>
bool run(const In* x, int64_t n, int64_t kh, int64_t kw, const float* filters,
         const Finish& e, float* y, const Geometry& g) {
  if (!depthwise_conv_available() || !depthwise_conv_takes(kh, kw) || n <= 0 || g.h <= 0 ||
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
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl");
  return available;
}

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
  return run(x, n, kh, kw, filters, Finish{bias, post_op, ranges}, y,
             Geometry{h, w, c, sh, sw, ph, pw, 1, 1, oh, ow});
}

}  // namespace blade::ral
