// Blade's int8 matrix-vector product (int8_gemv.h).
#include "ral/int8_gemv.h"

#include "ral/cpu_features.h"
#include "ral/int8_epilogue.h"
#include "ral/int8_kernels.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace blade::ral {
namespace {

// Output columns per block (one vector of int32 sums), and K per group (VNNI's depth).
constexpr int64_t kColumns = 16;
constexpr int64_t kGroup = 4;
// Blocks per task: a thread's columns stay in order, so its weight streams in order.
constexpr int64_t kBlocksPerTask = 4;

int64_t padded_k(int64_t k) { return (k + kGroup - 1) / kGroup * kGroup; }

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Blocks [first, last) of columns for kRows rows: each group of 4 along K is one 64-byte
// load of the weight and one dot product per row, then the epilogue of the block's sums.
template <int kRows>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void gemv_blocks(
    const uint8_t* x, int64_t k4, const int8_t* weights, const int32_t* sums, int64_t n,
    int64_t first, int64_t last, const Int8GemvEpilogue& e) {
  const __m512 in_scale = _mm512_set1_ps(e.input_scale);
  const __m512i zero_point = _mm512_set1_epi32(e.input_zero_point);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t block = first; block < last; ++block) {
    const int8_t* w = weights + block * k4 * kColumns;
    __m512i acc[kRows];
    for (int r = 0; r < kRows; ++r) {
      acc[r] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g < k4; g += kGroup) {
      const __m512i b = _mm512_loadu_si512(w + g * kColumns);
      for (int r = 0; r < kRows; ++r) {
        int32_t quad;
        std::memcpy(&quad, x + r * k4 + g, sizeof quad);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(quad), b);
      }
    }
    const int64_t column = block * kColumns;
    const __mmask16 mask = lanes_left(n - column);  // kColumns: 16
    const __m512i correction =
        _mm512_mullo_epi32(zero_point, _mm512_maskz_loadu_epi32(mask, sums + column));
    const __m512 multiplier =
        _mm512_mul_ps(in_scale, _mm512_maskz_loadu_ps(mask, e.weight_scale + column));
    const __m512 bias =
        e.bias != nullptr ? _mm512_maskz_loadu_ps(mask, e.bias + column) : zero;
    for (int r = 0; r < kRows; ++r) {
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], correction)),
                                 multiplier, bias);
      if (e.relu) {
        v = _mm512_max_ps(v, zero);
      }
      if (e.out_u8 != nullptr) {  // to nearest, ties to even; NaN: 0
        v = _mm512_fmadd_ps(v, _mm512_set1_ps(1.0f / e.out_scale),
                            _mm512_set1_ps(static_cast<float>(e.out_zero_point)));
        _mm512_mask_cvtepi32_storeu_epi8(e.out_u8 + r * n + column, mask,
                                         uint8_steps(v, zero));
      } else {
        _mm512_mask_storeu_ps(e.out_f32 + r * n + column, mask, v);
      }
    }
  }
}

#pragma GCC diagnostic pop

// The same blocks on AVX2 without VNNI, from the same packed weight: a group's 64 bytes are
// two 32-byte halves (columns 0-7 and 8-15), each multiplied by vpmaddubsw (pairs of u8 x
// s8 products into int16) and vpmaddwd by ones (pairs of those into int32). Exact for
// weights within int8_weight_limit (+-64), the only ones int8_kernels_take gives it. The
// epilogue, a few operations per column against the K bytes streamed for each, is scalar
// and rounds as the AVX-512 one does (fused multiply-adds, ties to even, NaN to the
// lower bound).
template <int kRows>
__attribute__((target("avx2,fma"))) void gemv_blocks_avx2(
    const uint8_t* x, int64_t k4, const int8_t* weights, const int32_t* sums, int64_t n,
    int64_t first, int64_t last, const Int8GemvEpilogue& e) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t block = first; block < last; ++block) {
    const int8_t* w = weights + block * k4 * kColumns;
    __m256i low[kRows], high[kRows];
    for (int r = 0; r < kRows; ++r) {
      low[r] = _mm256_setzero_si256();
      high[r] = _mm256_setzero_si256();
    }
    for (int64_t g = 0; g < k4; g += kGroup) {
      const __m256i b_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * kColumns));
      const __m256i b_high =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * kColumns + 32));
      for (int r = 0; r < kRows; ++r) {
        int32_t quad;
        std::memcpy(&quad, x + r * k4 + g, sizeof quad);
        const __m256i a = _mm256_set1_epi32(quad);
        low[r] = _mm256_add_epi32(low[r],
                                  _mm256_madd_epi16(_mm256_maddubs_epi16(a, b_low), ones));
        high[r] = _mm256_add_epi32(high[r],
                                   _mm256_madd_epi16(_mm256_maddubs_epi16(a, b_high), ones));
      }
    }
    const int64_t column = block * kColumns;
    const int64_t columns = std::min(kColumns, n - column);
    for (int r = 0; r < kRows; ++r) {
      int32_t acc[kColumns];
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), low[r]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 8), high[r]);
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t col = column + c;
        const int32_t correction = e.input_zero_point * sums[col];
        const float multiplier = e.input_scale * e.weight_scale[col];
        float v = std::fma(static_cast<float>(acc[c] - correction), multiplier,
                           e.bias != nullptr ? e.bias[col] : 0.0f);
        if (e.relu) {
          v = v > 0.0f ? v : 0.0f;
        }
        if (e.out_u8 != nullptr) {
          v = std::fma(v, 1.0f / e.out_scale, static_cast<float>(e.out_zero_point));
          v = v > 0.0f ? v : 0.0f;  // NaN: 0
          v = v < 255.0f ? v : 255.0f;
          e.out_u8[r * n + col] = static_cast<uint8_t>(std::nearbyint(v));
        } else {
          e.out_f32[r * n + col] = v;
        }
      }
    }
  }
}

bool avx512_vnni_gemv() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl") && has_cpu_feature("avx512_vnni");
  return available;
}

}  // namespace

bool int8_gemv_available() {
  static const bool avx2 = has_cpu_feature("avx2") && has_cpu_feature("fma");
  return avx512_vnni_gemv() || avx2;
}

at::Tensor pack_int8_gemv_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2,
              "pack_int8_gemv_weight: an int8 [N, K] weight is needed, got ",
              weight.scalar_type(), weight.sizes());
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), k4 = padded_k(k);
  const int64_t blocks = (n + kColumns - 1) / kColumns;
  at::Tensor packed = at::zeros({blocks * k4 * kColumns + n * 4}, at::kChar);
  int8_t* out = packed.data_ptr<int8_t>();
  int32_t* sums = reinterpret_cast<int32_t*>(out + blocks * k4 * kColumns);
  const int8_t* in = w.const_data_ptr<int8_t>();
  for (int64_t column = 0; column < n; ++column) {
    int32_t sum = 0;
    int8_t* block = out + column / kColumns * k4 * kColumns;
    for (int64_t j = 0; j < k; ++j) {
      const int8_t value = in[column * k + j];
      block[(j / kGroup) * kGroup * kColumns + (column % kColumns) * kGroup + j % kGroup] =
          value;
      sum += value;
    }
    sums[column] = sum;
  }
  return packed;
}

void int8_gemv(const uint8_t* x, int64_t rows, int64_t k, const at::Tensor& packed, int64_t n,
               const Int8GemvEpilogue& e) {
  const int64_t k4 = padded_k(k);
  const int64_t blocks = (n + kColumns - 1) / kColumns;
  TORCH_CHECK(rows >= 1 && rows <= kGemvMaxRows, "int8_gemv: 1 to ", kGemvMaxRows,
              " rows, got ", rows);
  TORCH_CHECK(packed.numel() == blocks * k4 * kColumns + n * 4,
              "int8_gemv: the packed weight does not fit ", n, " x ", k);
  // Rows whose K is no multiple of 4 are padded (zero weights there) so that every group
  // reads inside them.
  std::vector<uint8_t> padded;
  if (k4 != k) {
    padded.assign(rows * k4, 0);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(padded.data() + r * k4, x + r * k, k);
    }
    x = padded.data();
  }
  const int8_t* weights = packed.const_data_ptr<int8_t>();
  const int32_t* sums = reinterpret_cast<const int32_t*>(weights + blocks * k4 * kColumns);
  using Blocks = void (*)(const uint8_t*, int64_t, const int8_t*, const int32_t*, int64_t,
                          int64_t, int64_t, const Int8GemvEpilogue&);
  static constexpr Blocks kByRows[] = {nullptr, gemv_blocks<1>, gemv_blocks<2>,
                                       gemv_blocks<3>, gemv_blocks<4>};
  static constexpr Blocks kByRowsAvx2[] = {nullptr, gemv_blocks_avx2<1>, gemv_blocks_avx2<2>,
                                           gemv_blocks_avx2<3>, gemv_blocks_avx2<4>};
  static_assert(std::size(kByRows) == kGemvMaxRows + 1);
  static_assert(std::size(kByRowsAvx2) == kGemvMaxRows + 1);
  // AVX2's where the CPU (or a test, set_int8_dot_product_allowed) has no dot product.
  const Blocks run =
      (avx512_vnni_gemv() && has_int8_dot_product() ? kByRows : kByRowsAvx2)[rows];
  const int64_t tasks = (blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    run(x, k4, weights, sums, n, begin * kBlocksPerTask,
        std::min(blocks, end * kBlocksPerTask), e);
  });
}

}  // namespace blade::ral
