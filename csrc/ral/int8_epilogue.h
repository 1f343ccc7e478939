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

#pragma GCC diagnostic pop

}  // namespace blade::ral
