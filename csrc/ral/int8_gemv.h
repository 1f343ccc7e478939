// Blade's int8 matrix-vector product: a linear layer's few rows (a classifier's at batch 1,
// a decoder's) by its int8 weight, which the call reads once from memory. oneDNN's GEMM
// reads such a weight at a fraction of the memory's rate once it has left the caches (a
// ResNet's classifier after its convolutions' weights); here each thread streams its own
// columns' weight in order, 64 bytes a product (AVX-512 VNNI; on AVX2, two halves of 32 by
// vpmaddubsw and vpmaddwd, for weights within int8_weight_limit).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

// The most rows int8_gemv takes.
constexpr int64_t kGemvMaxRows = 4;

// Whether int8_gemv runs here (AVX-512 VNNI, BW, VL; or AVX2 and FMA).
bool int8_gemv_available();

// The weight [N, K] int8 in the product's layout: 16 output columns at a time, per group of
// 4 along K (zeros past K and N), 64 bytes a group; then each column's sum of weights
// (int32), for the zero-point correction.
at::Tensor pack_int8_gemv_weight(const at::Tensor& weight);

// What happens to each sum: the input zero point's share taken off, times
// input_scale * weight_scale[n], plus bias[n] (null: none), ReLU where `relu`; then
// float32 into out_f32, or rounded to uint8 with out_scale and out_zero_point into out_u8
// (exactly one of them set).
struct Int8GemvEpilogue {
  float input_scale = 1.0f;
  int32_t input_zero_point = 0;
  const float* weight_scale = nullptr;  // [N]
  const float* bias = nullptr;          // [N] or null
  bool relu = false;
  float* out_f32 = nullptr;
  uint8_t* out_u8 = nullptr;
  float out_scale = 1.0f;
  int32_t out_zero_point = 0;
};

// out[r, n] for r < rows (at most kGemvMaxRows), n < N: the epilogue of
// sum over k < K of x[r * K + k] * weight[n, k], `packed` from pack_int8_gemv_weight. x is
// uint8 [rows, K], contiguous; the results [rows, N], contiguous. On the intra-op threads
// by blocks of columns.
void int8_gemv(const uint8_t* x, int64_t rows, int64_t k, const at::Tensor& packed, int64_t n,
               const Int8GemvEpilogue& e);

}  // namespace blade::ral
