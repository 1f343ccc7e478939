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

// GELU's gate g (erf's form (1 + erf(x / sqrt 2)) / 2, or PyTorch's approximate="tanh"
// (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2) as a cubic on each of kGateSegments
// equal segments of |x| in [0, kGateEnd); g(-x) = 1 - g(x), and past the end g is 1 within
// float32 rounding. Each cubic interpolates g at its segment's 4 Chebyshev nodes (in f,
// the offset within the segment, 0..1), within float32 rounding of g. Two-register
// permutations give 16 values' coefficients at once: cheaper than a rational form of erf
// or tanh (a dozen multiply-adds and a divide), which the epilogue of a GELU layer with
// K = 512 spent a fifth of its time on.
constexpr int kGateSegments = 32;
// Both lookups read a coefficient's segments as whole registers: two of 16 (AVX-512), four
// of 8 (AVX2).
static_assert(kGateSegments == 32, "gate_coefficient and gate_coefficient8 read 32 segments");
constexpr float kGateEnd = 5.5f;

struct GateTable {
  // c[k][s]: segment s's coefficient of f^k.
  alignas(64) float c[4][kGateSegments];
};

// The table of the tanh form (tanh_form) or of erf's, made once.
const GateTable& gelu_gate_table(bool tanh_form);

// Coefficient k of each of 16 values' segments.
__attribute__((target("avx512f"), always_inline)) inline __m512 gate_coefficient(
    const GateTable& table, int k, __m512i segment) {
  return _mm512_permutex2var_ps(_mm512_load_ps(table.c[k]), segment,
                                _mm512_load_ps(table.c[k] + 16));
}

// GELU of 16 values in a result's units, as hardswish_units: d * g(d * scale) + zero.
__attribute__((target("avx512f"), always_inline)) inline __m512 gelu_units(
    __m512 v, __m512 scale, __m512 zero, const GateTable& table) {
  const __m512 d = _mm512_sub_ps(v, zero);
  const __m512 x = _mm512_mul_ps(d, scale);
  const __m512 a = _mm512_abs_ps(x);
  const __m512 t = _mm512_min_ps(_mm512_mul_ps(a, _mm512_set1_ps(kGateSegments / kGateEnd)),
                                 _mm512_set1_ps(kGateSegments - 0.5f));
  const __m512i segment = _mm512_cvttps_epi32(t);
  const __m512 f = _mm512_sub_ps(t, _mm512_cvtepi32_ps(segment));
  __m512 g = _mm512_fmadd_ps(gate_coefficient(table, 3, segment), f,
                             gate_coefficient(table, 2, segment));
  g = _mm512_fmadd_ps(g, f, gate_coefficient(table, 1, segment));
  g = _mm512_fmadd_ps(g, f, gate_coefficient(table, 0, segment));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 gate = _mm512_mask_sub_ps(g, negative, _mm512_set1_ps(1.0f), g);
  return _mm512_fmadd_ps(d, gate, zero);
}

// AVX2 forms of the steps above for Blade's AVX2 int8 tiles (int8_conv.cpp), 8 values at
// a time, giving the same values bit for bit.
__attribute__((target("avx2"), always_inline)) inline __m256i uint8_steps8(__m256 v,
                                                                        __m256 low) {
  return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, low), _mm256_set1_ps(255.0f)));
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 hardswish_units8(
    __m256 v, __m256 scale, __m256 zero) {
  const __m256 d = _mm256_sub_ps(v, zero);
  const __m256 gate = _mm256_min_ps(
      _mm256_max_ps(_mm256_fmadd_ps(d, scale, _mm256_set1_ps(3.0f)), _mm256_setzero_ps()),
      _mm256_set1_ps(6.0f));
  return _mm256_fmadd_ps(d, _mm256_mul_ps(gate, _mm256_set1_ps(1.0f / 6.0f)), zero);
}

// Coefficient k of each of 8 values' segments: the table's four runs of 8 permuted by the
// segment's low 3 bits, then picked by its bits 3 and 4 (`bit3`, `bit4`: in the lanes'
// sign bits, as blendv reads them): cheaper than four gathers on an AMD EPYC.
__attribute__((target("avx2"), always_inline)) inline __m256 gate_coefficient8(
    const GateTable& table, int k, __m256i segment, __m256 bit3, __m256 bit4) {
  const float* c = table.c[k];
  const __m256 low = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_load_ps(c), segment),
                                      _mm256_permutevar8x32_ps(_mm256_load_ps(c + 8), segment),
                                      bit3);
  const __m256 high =
      _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_load_ps(c + 16), segment),
                       _mm256_permutevar8x32_ps(_mm256_load_ps(c + 24), segment), bit3);
  return _mm256_blendv_ps(low, high, bit4);
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 gelu_units8(
    __m256 v, __m256 scale, __m256 zero, const GateTable& table) {
  const __m256 d = _mm256_sub_ps(v, zero);
  const __m256 x = _mm256_mul_ps(d, scale);
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 t = _mm256_min_ps(_mm256_mul_ps(a, _mm256_set1_ps(kGateSegments / kGateEnd)),
                                 _mm256_set1_ps(kGateSegments - 0.5f));
  const __m256i segment = _mm256_cvttps_epi32(t);
  const __m256 f = _mm256_sub_ps(t, _mm256_cvtepi32_ps(segment));
  const __m256 bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(segment, 28));
  const __m256 bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(segment, 27));
  __m256 g = _mm256_fmadd_ps(gate_coefficient8(table, 3, segment, bit3, bit4), f,
                             gate_coefficient8(table, 2, segment, bit3, bit4));
  g = _mm256_fmadd_ps(g, f, gate_coefficient8(table, 1, segment, bit3, bit4));
  g = _mm256_fmadd_ps(g, f, gate_coefficient8(table, 0, segment, bit3, bit4));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 gate = _mm256_blendv_ps(g, _mm256_sub_ps(_mm256_set1_ps(1.0f), g), negative);
  return _mm256_fmadd_ps(d, gate, zero);
}

#pragma GCC diagnostic pop

}  // namespace blade::ral
