// Rounding float32 to bfloat16 and widening it back, for the bfloat16 paths (a bf16
// engine's convolutions and matmuls, an int8 engine's attention): AVX512-BF16's conversion
// where the CPU has it (ATen's own conversion runs its AVX2 code on some AVX-512 CPUs,
// rounding with several integer steps a value), split among the threads.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace blade::ral {

// n values of `src` to the nearest bfloat16, ties to even (NaN stays NaN), as PyTorch
// rounds, but for values under 2^-126 (subnormal), which become 0: the instruction treats
// them as 0. Only on a CPU with AVX512-BF16 (the callers check).
void round_to_bf16_avx512(const float* src, c10::BFloat16* dst, int64_t n);

// `x` (float32) as bfloat16 with the same sizes and strides. A tensor that is not dense,
// or a CPU without AVX512-BF16, takes ATen's conversion.
at::Tensor rounded_to_bf16(const at::Tensor& x);

// `source` (bfloat16) widened into `target` (float32, of the same shape and strides, both
// dense), then max(x, 0) keeping NaN where `relu`: one pass over the memory where a copy
// and a ReLU took two (ResNet-50's convolutions are mostly followed by one). Other layouts
// take ATen's copy.
void widen_bf16(const at::Tensor& source, const at::Tensor& target, bool relu);

}  // namespace blade::ral
