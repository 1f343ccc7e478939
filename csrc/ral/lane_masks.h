// Masks of the first lanes of an AVX-512 or AVX2 vector: the tails of rows and of channel
// blocks that the kernels load and store masked.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace blade::ral {

// The first `left` of a vector's 16 lanes: all of them from 16 on, none at 0 or below.
inline __mmask16 lanes_left(int64_t left) {
  return left >= 16  ? static_cast<__mmask16>(0xFFFF)
         : left <= 0 ? static_cast<__mmask16>(0)
                     : static_cast<__mmask16>((1u << left) - 1u);
}

// The first `left` of a vector's 64 bytes, likewise.
inline __mmask64 bytes_left(int64_t left) {
  return left >= 64  ? ~__mmask64{0}
         : left <= 0 ? __mmask64{0}
                     : (__mmask64{1} << left) - 1;
}

// The first `left` of an AVX2 vector's 8 float32 lanes, as _mm256_maskload_ps and
// _mm256_maskstore_ps take them (each lane's top bit): all from 8 on, none at 0 or below.
__attribute__((target("avx2"), always_inline)) inline __m256i lanes8(int64_t left) {
  return _mm256_cmpgt_epi32(
      _mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(left, 0, 8))),
      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace blade::ral
