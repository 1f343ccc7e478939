// Masks of the first lanes of an AVX-512 vector: the tails of rows and of channel blocks
// that the kernels load and store masked.
#pragma once

#include <immintrin.h>

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

}  // namespace blade::ral
