// SiLU for the convolutions' epilogue (conv_activation.h).
#include "ral/conv_activation.h"

#include "ral/cpu_features.h"
#include "ral/lane_masks.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

namespace blade::ral {
namespace {

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The constants of both forms (silu16, silu8): the clamp, log2 e, ln 2's two parts, and
// P's coefficients from the highest degree's down.
constexpr float kSiluLow = -80.0f, kSiluHigh = 87.3f, kLog2e = 1.44269504f;
constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
constexpr float kExpPoly[] = {-1.9875691500e-4f, 1.3981999507e-3f, -8.3334519073e-3f,
                              4.1665795894e-2f,  -1.6666665459e-1f, 5.0000001201e-1f};

// x * sigmoid(x) of 16 values: exp(-x) = 2^n e^r, n = round(-x log2 e), computed as e^-u
// with u = x + n ln 2 (Cody-Waite: ln 2 in two parts), |u| <= ln2 / 2, e^-u = 1 - u + u^2
// P(-u) (P's odd coefficients negated). x is clamped to [-80, 87.3] so that 2^n e^r and
// the reciprocal of 1 + exp(-x) stay normal floats; below -80 the sigmoid is taken as 0
// (the result -0, NaN for -inf, as x * 0). About 22 vector operations.
__attribute__((target("avx512f"), always_inline)) inline __m512 silu16(__m512 x) {
  const __m512 c =
      _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(kSiluHigh)), _mm512_set1_ps(kSiluLow));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(-kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 u = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2High), c);
  u = _mm512_fmadd_ps(n, _mm512_set1_ps(kLn2Low), u);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
#pragma GCC unroll 5
  for (int i = 1; i < 6; ++i) {
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(kExpPoly[i]));
  }
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = _mm512_scalef_ps(
      _mm512_fmadd_ps(_mm512_mul_ps(u, u), p, _mm512_sub_ps(one, u)), n);
  const __m512 d = _mm512_add_ps(e, one);
  const __m512 estimate = _mm512_rcp14_ps(d);
  // One Newton step: s = s0 (2 - d s0).
  const __m512 sigmoid = _mm512_mul_ps(
      estimate, _mm512_fnmadd_ps(d, estimate, _mm512_set1_ps(2.0f)));
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kSiluLow), _CMP_LT_OQ);
  return _mm512_mul_ps(x, _mm512_mask_mov_ps(sigmoid, tiny, _mm512_setzero_ps()));
}

// x * (min(max(x + 3, 0), 6) / 6) of 16 values (NaN: max gives 0, x * 0 is NaN).
__attribute__((target("avx512f"), always_inline)) inline __m512 hardswish16(__m512 x) {
  const __m512 gate = _mm512_min_ps(
      _mm512_max_ps(_mm512_add_ps(x, _mm512_set1_ps(3.0f)), _mm512_setzero_ps()),
      _mm512_set1_ps(6.0f));
  return _mm512_mul_ps(x, _mm512_mul_ps(gate, _mm512_set1_ps(1.0f / 6.0f)));
}

// silu16 of 8 values by AVX2 and FMA: the same steps, 2^n made in the exponent's bits
// (n is within [-126, 116] after the clamp) and the reciprocal divided.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 silu8(__m256 x) {
  const __m256 c =
      _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(kSiluHigh)), _mm256_set1_ps(kSiluLow));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(-kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 u = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2High), c);
  u = _mm256_fmadd_ps(n, _mm256_set1_ps(kLn2Low), u);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
#pragma GCC unroll 5
  for (int i = 1; i < 6; ++i) {
    p = _mm256_fmadd_ps(p, u, _mm256_set1_ps(kExpPoly[i]));
  }
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 power = _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  const __m256 e =
      _mm256_mul_ps(_mm256_fmadd_ps(_mm256_mul_ps(u, u), p, _mm256_sub_ps(one, u)), power);
  const __m256 sigmoid = _mm256_div_ps(one, _mm256_add_ps(e, one));
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(kSiluLow), _CMP_LT_OQ);
  return _mm256_mul_ps(x, _mm256_blendv_ps(sigmoid, _mm256_setzero_ps(), tiny));
}

// f over `rows` rows of `width` values, row r at data + r * stride.
template <__m512 (*f)(__m512)>
__attribute__((target("avx512f"))) void rows_avx512(float* data, int64_t rows, int64_t width,
                                                    int64_t stride) {
  const int64_t whole = width / 16 * 16;
  const __mmask16 tail = lanes_left(width - whole);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = data + r * stride;
    for (int64_t j = 0; j < whole; j += 16) {
      _mm512_storeu_ps(row + j, f(_mm512_loadu_ps(row + j)));
    }
    if (tail != 0) {
      _mm512_mask_storeu_ps(row + whole, tail, f(_mm512_maskz_loadu_ps(tail, row + whole)));
    }
  }
}

template <__m256 (*f)(__m256)>
__attribute__((target("avx2,fma"))) void rows_avx2(float* data, int64_t rows, int64_t width,
                                                  int64_t stride) {
  const int64_t whole = width / 8 * 8;
  const __m256i tail = lanes8(width - whole);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = data + r * stride;
    for (int64_t j = 0; j < whole; j += 8) {
      _mm256_storeu_ps(row + j, f(_mm256_loadu_ps(row + j)));
    }
    if (whole < width) {
      _mm256_maskstore_ps(row + whole, tail, f(_mm256_maskload_ps(row + whole, tail)));
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

ConvActivation conv_activation(int64_t code) {
  TORCH_CHECK(code >= 0 && code <= static_cast<int64_t>(ConvActivation::kHardswish),
              "blade_ral_conv2d_nhwc_bias: activation ", code,
              " is none of 0 (none), 1 (ReLU), 2 (SiLU) and 3 (hardswish)");
  return static_cast<ConvActivation>(code);
}

bool activation_rows_available() {
  static const bool available =
      has_cpu_feature("avx512f") || (has_cpu_feature("avx2") && has_cpu_feature("fma"));
  return available;
}

void activation_rows(ConvActivation activation, float* data, int64_t rows, int64_t width,
                     int64_t stride) {
  if (!activation_pass(activation)) {
    return;
  }
  TORCH_CHECK(activation_rows_available(),
              "activation_rows: this CPU has neither AVX-512F nor AVX2 with FMA");
  static const bool avx512 = has_cpu_feature("avx512f");
  const bool silu = activation == ConvActivation::kSilu;
  if (avx512) {
    (silu ? rows_avx512<silu16> : rows_avx512<hardswish16>)(data, rows, width, stride);
  } else {
    (silu ? rows_avx2<silu8> : rows_avx2<hardswish8>)(data, rows, width, stride);
  }
}

void activation_dense(ConvActivation activation, float* data, int64_t count) {
  if (count <= 0 || !activation_pass(activation)) {
    return;
  }
  if (!activation_rows_available()) {
    at::Tensor values = at::from_blob(data, {count}, at::kFloat);
    if (activation == ConvActivation::kSilu) {
      at::silu_(values);
    } else {
      at::hardswish_(values);
    }
    return;
  }
  at::parallel_for(0, count, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
    activation_rows(activation, data + begin, 1, end - begin, 0);
  });
}

}  // namespace blade::ral
