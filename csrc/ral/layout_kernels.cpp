#include "ral/layout_kernels.h"

#include "ral/cpu_features.h"
#include "ral/int8_epilogue.h"
#include "ral/int8_kernels.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

namespace blade::ral {
namespace {

constexpr int64_t kTile = 16;
// 1.5 * 2^23: adding and subtracting it rounds a float below 2^22 in magnitude to an
// integer, ties to even.
constexpr float kRound = 12582912.0f;

uint8_t quantize_one(float x, float inverse, float zero) {
  float v = x * inverse + zero;
  v = v > 0.0f ? v : 0.0f;
  v = v < 255.0f ? v : 255.0f;
  return static_cast<uint8_t>((v + kRound) - kRound);
}

// One image's tile: channels [c0, c1) of pixels [p0, p1), scalar.
void quantize_tile(const float* src, uint8_t* dst, int64_t c, int64_t hw, int64_t c0,
                   int64_t c1, int64_t p0, int64_t p1, float inverse, float zero) {
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      dst[p * c + ch] = quantize_one(src[ch * hw + p], inverse, zero);
    }
  }
}

void transpose_tile(const float* src, float* dst, int64_t c, int64_t hw, int64_t c0,
                    int64_t c1, int64_t p0, int64_t p1) {
  for (int64_t ch = c0; ch < c1; ++ch) {
    for (int64_t p = p0; p < p1; ++p) {
      dst[ch * hw + p] = src[p * c + ch];
    }
  }
}

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// their _mm512_undefined; "is used uninitialized" for the gathers), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// 16 floats quantized, as int32 lanes: times inverse, plus zero (two roundings, as
// quantize_one), then the uint8 steps of the int8 kernels (NaN gives 0).
__attribute__((target("avx512f"))) inline __m512i quantize16(__m512 v, __m512 scale,
                                                             __m512 offset) {
  return uint8_steps(_mm512_add_ps(_mm512_mul_ps(v, scale), offset), _mm512_setzero_ps());
}

// A whole 16 x 16 tile: each channel's 16 pixels loaded contiguously and quantized to 16
// bytes, then the 16 x 16 bytes transposed (bytes, words, dwords, qwords interleaved in
// turn) so each pixel's 16 channels are stored together.
__attribute__((target("avx512f"))) void quantize_tile_avx512(const float* src, uint8_t* dst,
                                                              int64_t c, int64_t hw,
                                                              int64_t c0, int64_t p0,
                                                              float inverse, float zero) {
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512 offset = _mm512_set1_ps(zero);
  __m128i rows[kTile];  // channel c0 + i: pixels p0..p0+15
  for (int i = 0; i < kTile; ++i) {
    rows[i] = _mm512_cvtepi32_epi8(
        quantize16(_mm512_loadu_ps(src + (c0 + i) * hw + p0), scale, offset));
  }
  // Pairs of channels by pixel: pairs[2i] pixels 0-7, pairs[2i + 1] pixels 8-15.
  __m128i pairs[kTile];
  for (int i = 0; i < kTile / 2; ++i) {
    pairs[2 * i] = _mm_unpacklo_epi8(rows[2 * i], rows[2 * i + 1]);
    pairs[2 * i + 1] = _mm_unpackhi_epi8(rows[2 * i], rows[2 * i + 1]);
  }
  // Quads of channels 4g..4g+3 by pixel: quads[4g + q] pixels 4q..4q+3.
  __m128i quads[kTile];
  for (int g = 0; g < 4; ++g) {
    quads[4 * g + 0] = _mm_unpacklo_epi16(pairs[4 * g], pairs[4 * g + 2]);
    quads[4 * g + 1] = _mm_unpackhi_epi16(pairs[4 * g], pairs[4 * g + 2]);
    quads[4 * g + 2] = _mm_unpacklo_epi16(pairs[4 * g + 1], pairs[4 * g + 3]);
    quads[4 * g + 3] = _mm_unpackhi_epi16(pairs[4 * g + 1], pairs[4 * g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    // Channels 0-7 and 8-15 of pixels 4q, 4q+1 (low) and 4q+2, 4q+3 (high).
    const __m128i low0 = _mm_unpacklo_epi32(quads[q], quads[4 + q]);
    const __m128i high0 = _mm_unpackhi_epi32(quads[q], quads[4 + q]);
    const __m128i low1 = _mm_unpacklo_epi32(quads[8 + q], quads[12 + q]);
    const __m128i high1 = _mm_unpackhi_epi32(quads[8 + q], quads[12 + q]);
    uint8_t* to = dst + (p0 + 4 * q) * c + c0;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to), _mm_unpacklo_epi64(low0, low1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + c), _mm_unpackhi_epi64(low0, low1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 2 * c), _mm_unpacklo_epi64(high0, high1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + 3 * c), _mm_unpackhi_epi64(high0, high1));
  }
}

// A whole 16 x 16 tile: for each channel, its 16 pixels gathered (stride c) and stored.
__attribute__((target("avx512f"))) void transpose_tile_avx512(const float* src, float* dst,
                                                               int64_t c, int64_t hw,
                                                               int64_t c0, int64_t p0) {
  const __m512i pixels = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int>(c)));
  const float* base = src + p0 * c;
  for (int64_t ch = c0; ch < c0 + kTile; ++ch) {
    _mm512_storeu_ps(dst + ch * hw + p0, _mm512_i32gather_ps(pixels, base + ch, 4));
  }
}

// Pixels [p0, p1) of an image of c <= 4 channels (an RGB image's 3): each channel's 16
// pixels loaded contiguously and quantized, their bytes combined into one 32-bit lane per
// pixel, then stored c bytes a pixel (for 3, vpermb drops every fourth byte).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) void quantize_pixels_avx512(
    const float* src, uint8_t* dst, int64_t c, int64_t hw, int64_t p0, int64_t p1,
    float inverse, float zero) {
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512 offset = _mm512_set1_ps(zero);
  // Byte i of 3-channel pixels is byte i / 3 * 4 + i % 3 of 4-byte ones.
  alignas(64) static const std::array<uint8_t, 64> order = [] {
    std::array<uint8_t, 64> bytes{};
    for (int i = 0; i < 48; ++i) {
      bytes[i] = static_cast<uint8_t>(i / 3 * 4 + i % 3);
    }
    return bytes;
  }();
  const __m512i pick = _mm512_load_si512(order.data());
  for (int64_t p = p0; p < p1; p += 16) {
    const int64_t count = std::min<int64_t>(16, p1 - p);
    const __mmask16 mask = lanes_left(count);
    __m512i word = _mm512_setzero_si512();
    for (int64_t ch = 0; ch < c; ++ch) {
      const __m512i q = quantize16(_mm512_maskz_loadu_ps(mask, src + ch * hw + p), scale,
                                   offset);
      word = _mm512_or_si512(word, _mm512_slli_epi32(q, static_cast<unsigned>(8 * ch)));
    }
    uint8_t* to = dst + p * c;
    const __mmask64 bytes = bytes_left(count * c);
    if (c == 4) {
      _mm512_mask_storeu_epi8(to, bytes, word);
    } else if (c == 3) {
      _mm512_mask_storeu_epi8(to, bytes, _mm512_permutexvar_epi8(pick, word));
    } else if (c == 2) {
      _mm256_mask_storeu_epi8(to, static_cast<__mmask32>(bytes), _mm512_cvtepi32_epi16(word));
    } else {
      _mm_mask_storeu_epi8(to, static_cast<__mmask16>(bytes), _mm512_cvtepi32_epi8(word));
    }
  }
}

// quantize_pixels_avx512 on AVX2: 8 pixels at a time, each channel's quantized as
// quantize_one rounds them (no FMA in this target: two roundings), then a 3-channel
// pixel's 3 bytes picked within each 128-bit lane; a tail of fewer than 8 pixels is
// quantized one by one.
__attribute__((target("avx2"))) void quantize_pixels_avx2(const float* src, uint8_t* dst,
                                                           int64_t c, int64_t hw, int64_t p0,
                                                           int64_t p1, float inverse,
                                                           float zero) {
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256 offset = _mm256_set1_ps(zero);
  const __m256 none = _mm256_setzero_ps();
  const __m256i pick3 = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1,
                                         -1, 0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1,
                                         -1, -1);
  int64_t p = p0;
  for (; p + 8 <= p1; p += 8) {
    __m256i word = _mm256_setzero_si256();
    for (int64_t ch = 0; ch < c; ++ch) {
      const __m256i q = uint8_steps8(
          _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src + ch * hw + p), scale), offset),
          none);
      word = _mm256_or_si256(word, _mm256_slli_epi32(q, static_cast<int>(8 * ch)));
    }
    uint8_t* to = dst + p * c;
    if (c == 4) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), word);
      continue;
    }
    alignas(32) uint8_t bytes[32];
    if (c == 3) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), _mm256_shuffle_epi8(word, pick3));
      std::memcpy(to, bytes, 12);
      std::memcpy(to + 12, bytes + 16, 12);
      continue;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), word);
    for (int i = 0; i < 8; ++i) {
      std::memcpy(to + i * c, bytes + 4 * i, static_cast<size_t>(c));
    }
  }
  quantize_tile(src, dst, c, hw, 0, c, p, p1, inverse, zero);
}

#pragma GCC diagnostic pop

bool use_avx512() {
  static const bool avx512 = has_cpu_feature("avx512f");
  return avx512;
}

// Runs `tile(image, c0, c1, p0, p1)` over every tile of n images of c channels and hw
// pixels, split over the threads. A pixel block's channel tiles run in a row (on one
// thread but where a thread's range ends): their NHWC lines are written (or read) whole,
// mostly not shared between threads.
template <typename Tile>
void for_each_tile(int64_t n, int64_t c, int64_t hw, const Tile& tile) {
  const int64_t c_tiles = (c + kTile - 1) / kTile, hw_tiles = (hw + kTile - 1) / kTile;
  at::parallel_for(0, n * c_tiles * hw_tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t image = t / (c_tiles * hw_tiles);
      const int64_t p0 = (t / c_tiles) % hw_tiles * kTile;
      const int64_t c0 = t % c_tiles * kTile;
      tile(image, c0, std::min(c, c0 + kTile), p0, std::min(hw, p0 + kTile));
    }
  });
}

}  // namespace

at::Tensor quantize_uint8_channels_last(const at::Tensor& input, double scale,
                                        int64_t zero_point) {
  TORCH_CHECK(input.dim() == 4 && input.scalar_type() == at::kFloat,
              "quantize_uint8_channels_last: expected a float32 [N, C, H, W] tensor, got ",
              input.scalar_type(), input.sizes());
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast) && !input.is_contiguous()) {
    // Already in the result's order: quantized value by value, as NHWC.
    return quantize_uint8(input.permute({0, 2, 3, 1}), scale, zero_point).permute({0, 3, 1, 2});
  }
  const at::Tensor x = input.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kByte),
                           at::MemoryFormat::ChannelsLast);
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  const float inverse = static_cast<float>(1.0 / scale);
  const float zero = static_cast<float>(zero_point);
  const float* src = x.data_ptr<float>();
  uint8_t* dst = q.data_ptr<uint8_t>();
  const bool avx512 = use_avx512() && hw * c < (int64_t{1} << 31);
  static const bool few_channels_avx512 =
      use_avx512() && has_cpu_feature("avx512bw") && has_cpu_feature("avx512vl") &&
      has_cpu_feature("avx512vbmi");
  static const bool avx2 = has_cpu_feature("avx2");
  if ((few_channels_avx512 || avx2) && c <= 4) {  // an image's: a pixel's channels at once
    constexpr int64_t kPixels = 1024;
    const int64_t chunks = (hw + kPixels - 1) / kPixels;
    at::parallel_for(0, n * chunks, 4, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t image = t / chunks, p0 = t % chunks * kPixels;
        const auto quantize = few_channels_avx512 ? quantize_pixels_avx512
                                                  : quantize_pixels_avx2;
        quantize(src + image * c * hw, dst + image * c * hw, c, hw, p0,
                 std::min(hw, p0 + kPixels), inverse, zero);
      }
    });
    return q;
  }
  for_each_tile(n, c, hw, [&](int64_t image, int64_t c0, int64_t c1, int64_t p0, int64_t p1) {
    const float* from = src + image * c * hw;
    uint8_t* to = dst + image * c * hw;
    if (avx512 && c1 - c0 == kTile && p1 - p0 == kTile) {
      quantize_tile_avx512(from, to, c, hw, c0, p0, inverse, zero);
    } else {
      quantize_tile(from, to, c, hw, c0, c1, p0, p1, inverse, zero);
    }
  });
  return q;
}

void channels_last_to_contiguous(const at::Tensor& src, at::Tensor& dst) {
  TORCH_CHECK(src.dim() == 4 && src.scalar_type() == at::kFloat &&
                  src.is_contiguous(at::MemoryFormat::ChannelsLast) &&
                  dst.scalar_type() == at::kFloat && dst.is_contiguous() &&
                  dst.sizes() == src.sizes(),
              "channels_last_to_contiguous: expected a channels_last float32 tensor and a "
              "contiguous one of its sizes");
  const int64_t n = src.size(0), c = src.size(1), hw = src.size(2) * src.size(3);
  const float* in = src.data_ptr<float>();
  float* out = dst.data_ptr<float>();
  const bool avx512 = use_avx512() && hw * c < (int64_t{1} << 31);
  for_each_tile(n, c, hw, [&](int64_t image, int64_t c0, int64_t c1, int64_t p0, int64_t p1) {
    const float* from = in + image * hw * c;
    float* to = out + image * c * hw;
    if (avx512 && c1 - c0 == kTile && p1 - p0 == kTile) {
      transpose_tile_avx512(from, to, c, hw, c0, p0);
    } else {
      transpose_tile(from, to, c, hw, c0, c1, p0, p1);
    }
  });
}

}  // namespace blade::ral
