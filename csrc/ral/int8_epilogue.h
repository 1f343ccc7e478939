// Vector steps the int8 kernels' epilogues share (int8_conv, depthwise_conv, int8_gemv), so
// that every path finishes its values alike.
#pragma once

#include <immintrin.h>

namespace blade::ral {

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined), not about
// this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// A uint8 result's steps: 16 values clamped to [low, 255] (NaN gives the lower bound:
// max's second operand), then to nearest, ties to even, as quantize_uint8 rounds.
__attribute__((target("avx512f"), always_inline)) inline __m512i uint8_steps(__m512 v,
                                                                          __m512 low) {
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, low), _mm512_set1_ps(255.0f)));
}

// 64 uint8 results from 16 values of each of 4 vectors (vector i to bytes 16i..16i+15),
// as uint8_steps gives them: clamped above in float32 (NaN stays NaN: min's second
// operand), rounded, saturated to 0..255 by the packs (NaN and large negatives give 0),
// then raised to the lower bound `low` in bytes, fewer steps than clamping each vector.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i uint8_pack64(
    const __m512 (&v)[4], __m512i low) {
  const __m512 top = _mm512_set1_ps(255.0f);
  __m512i q[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm512_cvtps_epi32(_mm512_min_ps(top, v[i]));
  }
  // The packs leave 4 values of vector i from 128-bit lane k in dword 4k + i; the
  // permutation puts them back at 4i + k.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i packed =
      _mm512_packus_epi16(_mm512_packs_epi32(q[0], q[1]), _mm512_packs_epi32(q[2], q[3]));
  return _mm512_permutexvar_epi32(order, _mm512_max_epu8(packed, low));
}

// Hardswish of 16 values in a result's units v = x / scale + zero (float32 results: scale
// 1, zero 0): d = v - zero is x / scale, and hardswish(x) / scale = d * min(max(x + 3, 0),
// 6) / 6.
__attribute__((target("avx512f"), always_inline)) inline __m512 hardswish_units(
    __m512 v, __m512 scale, __m512 zero) {
  const __m512 d = _mm512_sub_ps(v, zero);
  const __m512 gate = _mm512_min_ps(
      _mm512_max_ps(_mm512_fmadd_ps(d, scale, _mm512_set1_ps(3.0f)), _mm512_setzero_ps()),
      _mm512_set1_ps(6.0f));
  return _mm512_fmadd_ps(d, _mm512_mul_ps(gate, _mm512_set1_ps(1.0f / 6.0f)), zero);
}

// x * P(x^2) / Q(x^2) with x clamped to [-bound, bound], P and Q by Horner from their
// highest coefficient: the odd rational forms of erf and tanh that the generated code's
// approximations use (python/blade/codegen/loops/approximations.py, same coefficients).
template <int kP, int kQ>
__attribute__((target("avx512f"), always_inline)) inline __m512 odd_rational(
    __m512 x, float bound, const float (&p)[kP], const float (&q)[kQ]) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-bound)), _mm512_set1_ps(bound));
  const __m512 x2 = _mm512_mul_ps(xc, xc);
  __m512 num = _mm512_set1_ps(p[0]);
#pragma GCC unroll 8
  for (int i = 1; i < kP; ++i) {
    num = _mm512_fmadd_ps(num, x2, _mm512_set1_ps(p[i]));
  }
  __m512 den = _mm512_set1_ps(q[0]);
#pragma GCC unroll 8
  for (int i = 1; i < kQ; ++i) {
    den = _mm512_fmadd_ps(den, x2, _mm512_set1_ps(q[i]));
  }
  return _mm512_div_ps(_mm512_mul_ps(xc, num), den);
}

// GELU of 16 values in a result's units, as hardswish_units: d * g(x) + zero with x = d *
// scale and g(x) = (1 + erf(x / sqrt 2)) / 2, or with `tanh_form` (1 + tanh(sqrt(2 / pi) *
// (x + 0.044715 x^3))) / 2, PyTorch's approximate="tanh".
__attribute__((target("avx512f"), always_inline)) inline __m512 gelu_units(
    __m512 v, __m512 scale, __m512 zero, bool tanh_form) {
  static constexpr float kErfP[] = {-2.72614225801306e-10f, 2.77068142495902e-08f,
                                    -2.10102402082508e-06f, -5.69250639462346e-05f,
                                    -7.34990630326855e-04f, -2.95459980854025e-03f,
                                    -1.60960333262415e-02f};
  static constexpr float kErfQ[] = {-1.45660718464996e-05f, -2.13374055278905e-04f,
                                    -1.68282697438203e-03f, -7.37332916720468e-03f,
                                    -1.42647390514189e-02f};
  static constexpr float kTanhP[] = {-2.76076847742355e-16f, 2.00018790482477e-13f,
                                     -8.60467152213735e-11f, 5.12229709037114e-08f,
                                     1.48572235717979e-05f,  6.37261928875436e-04f,
                                     4.89352455891786e-03f};
  static constexpr float kTanhQ[] = {1.19825839466702e-06f, 1.18534705686654e-04f,
                                     2.26843463243900e-03f, 4.89352518554385e-03f};
  const __m512 d = _mm512_sub_ps(v, zero);
  const __m512 x = _mm512_mul_ps(d, scale);
  __m512 t;
  if (tanh_form) {
    // sqrt(2 / pi) * (x + 0.044715 x^3); near 0 the rational form is u * P(0) / Q(0),
    // within float32 rounding of u.
    const __m512 x2 = _mm512_mul_ps(x, x);
    const __m512 u = _mm512_mul_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(0.7978845608028654f)),
        _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.0f)));
    t = odd_rational(u, 7.90531110763549805f, kTanhP, kTanhQ);
  } else {
    t = odd_rational(_mm512_mul_ps(x, _mm512_set1_ps(0.7071067811865476f)), 4.0f, kErfP,
                     kErfQ);
  }
  const __m512 gate = _mm512_fmadd_ps(t, _mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  return _mm512_fmadd_ps(d, gate, zero);
}

#pragma GCC diagnostic pop

}  // namespace blade::ral
