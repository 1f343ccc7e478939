// The activation a float32 convolution applies after its bias (conv2d_nhwc_bias's
// `activation` argument, python/blade/codegen/kernels/convolution.py), and SiLU or
// hardswish over rows of values: Blade's own convolutions run them on each task's block of
// results while the block is in the core's cache, where a loop of generated code after the
// call read and wrote the whole result through memory again (EfficientNet's expanded
// activations are several times a core's L2 cache; MobileNetV3's hardswish follows most of
// its convolutions).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace blade::ral {

// The ABI's values: 0 and 1 as the argument's old meaning (ReLU or not), so an engine
// compiled before SiLU was added calls the same. Hardswish is x * (min(max(x + 3, 0), 6)
// / 6), the division a multiply by 1/6 (within a float32 ulp of PyTorch's).
enum class ConvActivation : int64_t { kNone = 0, kRelu = 1, kSilu = 2, kHardswish = 3 };

// Whether the activation is a pass over the results (SiLU, hardswish), not a kernel's own
// ReLU.
inline bool activation_pass(ConvActivation activation) {
  return activation == ConvActivation::kSilu || activation == ConvActivation::kHardswish;
}

// Hardswish of 8 values by AVX2 (NaN: max gives 0, x * 0 is NaN): the row pass's, and
// the AVX2 depthwise kernel's fused one.
__attribute__((target("avx2"), always_inline)) inline __m256 hardswish8(__m256 x) {
  const __m256 gate = _mm256_min_ps(
      _mm256_max_ps(_mm256_add_ps(x, _mm256_set1_ps(3.0f)), _mm256_setzero_ps()),
      _mm256_set1_ps(6.0f));
  return _mm256_mul_ps(x, _mm256_mul_ps(gate, _mm256_set1_ps(1.0f / 6.0f)));
}

// The activation the ABI's argument names; throws for any other value.
ConvActivation conv_activation(int64_t code);

// The activation's pass (activation_pass; nothing for the others) in place over `rows`
// rows of `width` float32 values, row r starting at data + r * stride; needs AVX-512F, or
// AVX2 and FMA (activation_rows_available). SiLU, x * sigmoid(x): exp is a degree-5
// polynomial after Cody-Waite reduction (codegen/loops/approximations.py's) and the
// reciprocal an estimate refined by a Newton step (AVX2: divided): a few float32 ulps from x / (1 + exp(-x)); -0 below -80 (the
// exact value is under 2e-33 there), NaN for NaN and -inf, as PyTorch's.
void activation_rows(ConvActivation activation, float* data, int64_t rows, int64_t width,
                     int64_t stride);
bool activation_rows_available();

// The activation's pass over `count` dense float32 values in place on the intra-op
// threads, on any CPU (PyTorch's kernel where activation_rows does not run).
void activation_dense(ConvActivation activation, float* data, int64_t count);

}  // namespace blade::ral
