// Rounding to bfloat16 and widening back (bf16_rounding.h).
#include "ral/bf16_rounding.h"

#include "ral/cpu_features.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <cstring>

namespace blade::ral {
namespace {

// Values a thread converts at least: smaller tensors are converted by the calling thread.
constexpr int64_t kGrain = 16384;

// `n` bfloat16 values widened to float32, then rectified where `relu` (NaN < 0 is false:
// NaN stays, as torch.relu keeps it). One clone per listed target, picked for the CPU at
// load, each with the loop vectorized for it.
__attribute__((target_clones("avx512f", "avx2", "default"))) void widen_values(
    const uint16_t* __restrict source, float* __restrict destination, int64_t n, bool relu) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(source[i]) << 16;  // bfloat16's bits
    float value = 0.0F;
    std::memcpy(&value, &bits, sizeof(value));
    destination[i] = relu && value < 0.0F ? 0.0F : value;
  }
}

}  // namespace

__attribute__((target("avx512f,avx512bf16"))) void round_to_bf16_avx512(const float* src,
                                                                        c10::BFloat16* dst,
                                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)rounded);
  }
  for (; i < n; ++i) {
    dst[i] = c10::BFloat16(src[i]);
  }
}

at::Tensor rounded_to_bf16(const at::Tensor& x) {
  static const bool avx512_bf16 =
      has_cpu_feature("avx512_bf16") && has_cpu_feature("avx512f");
  if (!avx512_bf16 || x.scalar_type() != at::kFloat || !x.is_non_overlapping_and_dense()) {
    return x.to(at::kBFloat16);
  }
  // Dense with the same strides: both lie in one stretch of numel values from their first
  // element, in the same order.
  at::Tensor rounded = at::empty_strided(x.sizes(), x.strides(), x.options().dtype(at::kBFloat16));
  const float* src = x.const_data_ptr<float>();
  auto* dst = rounded.data_ptr<c10::BFloat16>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    round_to_bf16_avx512(src + begin, dst + begin, end - begin);
  });
  return rounded;
}

void widen_bf16(const at::Tensor& source, const at::Tensor& target, bool relu) {
  if (source.strides() != target.strides() || !source.is_non_overlapping_and_dense() ||
      source.sizes() != target.sizes()) {
    target.copy_(source);
    if (relu) {
      target.relu_();  // max(x, 0) keeping NaN, as eager
    }
    return;
  }
  const auto* from = static_cast<const uint16_t*>(source.const_data_ptr());
  auto* to = static_cast<float*>(target.data_ptr());
  at::parallel_for(0, source.numel(), kGrain, [&](int64_t begin, int64_t end) {
    widen_values(from + begin, to + begin, end - begin, relu);
  });
}

}  // namespace blade::ral
