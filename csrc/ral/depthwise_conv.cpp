// Depthwise 3x3 and 5x5 convolutions of NHWC float32 data (depthwise_conv.h).
#include "ral/depthwise_conv.h"

#include "ral/cpu_features.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

namespace blade::ral {
namespace {

struct Geometry {
  int64_t h, w, c, sh, sw, ph, pw, dh, dw, oh, ow;
};

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// their _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One output row (image row `oy` of image `b`) for the channels [ch, ch + 16) under
// `mask`: the KH x KW filter vectors loaded once, then each output pixel's sum of the taps
// inside the image.
template <int KH, int KW>
__attribute__((target("avx512f"))) void row_block(const float* x, const float* filters,
                                                  const float* bias, bool relu, float* y,
                                                  const Geometry& g, int64_t b, int64_t oy,
                                                  int64_t ch, __mmask16 mask) {
  __m512 f[KH * KW];
  for (int t = 0; t < KH * KW; ++t) {
    f[t] = _mm512_maskz_loadu_ps(mask, filters + t * g.c + ch);
  }
  const __m512 start = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + ch)
                                       : _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
  const float* image = x + b * g.h * g.w * g.c;
  float* out = y + (b * g.oh + oy) * g.ow * g.c;
  // The columns whose taps all lie inside the image, on rows that all do: no bounds to
  // check there (reach is negative only when no column qualifies).
  const int64_t first = (g.pw + g.sw - 1) / g.sw;
  const int64_t reach = g.w - 1 + g.pw - (KW - 1) * g.dw;
  const int64_t last = reach < 0 ? -1 : reach / g.sw;  // inclusive
  int64_t iy[KH];
  bool all_rows = true;
  for (int i = 0; i < KH; ++i) {
    iy[i] = oy * g.sh - g.ph + i * g.dh;
    all_rows = all_rows && iy[i] >= 0 && iy[i] < g.h;
  }
  for (int64_t ox = 0; ox < g.ow; ++ox) {
    __m512 sum = start;
    if (all_rows && ox >= first && ox <= last) {
      const float* tap = image + (iy[0] * g.w + ox * g.sw - g.pw) * g.c + ch;
#pragma GCC unroll 5
      for (int i = 0; i < KH; ++i) {
#pragma GCC unroll 5
        for (int j = 0; j < KW; ++j) {
          sum = _mm512_fmadd_ps(
              _mm512_maskz_loadu_ps(mask, tap + (i * g.dh * g.w + j * g.dw) * g.c),
              f[i * KW + j], sum);
        }
      }
    } else {
      for (int i = 0; i < KH; ++i) {
        if (iy[i] < 0 || iy[i] >= g.h) {
          continue;
        }
        const float* line = image + iy[i] * g.w * g.c + ch;
        for (int j = 0; j < KW; ++j) {
          const int64_t ix = ox * g.sw - g.pw + j * g.dw;
          if (ix >= 0 && ix < g.w) {
            sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, line + ix * g.c), f[i * KW + j],
                                  sum);
          }
        }
      }
    }
    if (relu) {  // vmaxps returns its second operand for a NaN: NaN stays, as torch.relu
      sum = _mm512_max_ps(zero, sum);
    }
    _mm512_mask_storeu_ps(out + ox * g.c + ch, mask, sum);
  }
}

#pragma GCC diagnostic pop

template <int KH, int KW>
void convolve(const float* x, int64_t n, const float* filters, const float* bias, bool relu,
              float* y, const Geometry& g) {
  // Tasks of one output row and one block of 16 channels: a 7 x 7 image has too few rows
  // to share evenly among the threads on its own.
  const int64_t blocks = (g.c + 15) / 16;
  at::parallel_for(0, n * g.oh * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / blocks;
      const int64_t ch = task % blocks * 16;
      const __mmask16 mask = ch + 16 <= g.c ? static_cast<__mmask16>(0xffff)
                                            : static_cast<__mmask16>((1u << (g.c - ch)) - 1u);
      row_block<KH, KW>(x, filters, bias, relu, y, g, row / g.oh, row % g.oh, ch, mask);
    }
  });
}

}  // namespace

bool depthwise_conv_available() {
  static const bool available = has_cpu_feature("avx512f");
  return available;
}

bool depthwise_conv_takes(int64_t kh, int64_t kw) {
  return (kh == 3 && kw == 3) || (kh == 5 && kw == 5);
}

bool depthwise_conv2d(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* filters, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw, const float* bias,
                      bool relu, float* y, int64_t oh, int64_t ow) {
  if (!depthwise_conv_available() || !depthwise_conv_takes(kh, kw) || n <= 0 || h <= 0 ||
      w <= 0 || c <= 0 || oh <= 0 || ow <= 0 || sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 ||
      ph < 0 || pw < 0) {
    return false;
  }
  const Geometry g{h, w, c, sh, sw, ph, pw, dh, dw, oh, ow};
  if (kh == 3) {
    convolve<3, 3>(x, n, filters, bias, relu, y, g);
  } else {
    convolve<5, 5>(x, n, filters, bias, relu, y, g);
  }
  return true;
}

}  // namespace blade::ral
