// MKL's sgemm by a weight as it is (matmul_kernels.cpp): one of the two kernels of a GEMM by
// a weight, and of a 1x1 convolution (conv_kernels.cpp), that an engine's kernel trials
// choose between (kernel_trials.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

class PreparedWeights;

// out[m, n] = lhs[m, k] @ op(weight) + beta * out by MKL's sgemm, reading the 2-d weight as
// it is ([n, k] when `transposed`, else [k, n]; unit stride along its rows); a few rows by
// an [n, k] weight (beta 0) by few_rows_gemm where it runs. False without either, or when a
// size does not fit MKL's int arguments.
// out[m, n] = lhs[m, k] @ op(weight) by blocked_gemm on the param's [K, N] copy
// (PreparedWeights::k_by_n; `weight` as trial_gemm takes it). False on CPUs without
// AVX-512F, outside an engine, or where the copy cannot be made.
bool gemm_by_k_by_n(PreparedWeights* prepared, const float* lhs, int64_t lda,
                    const at::Tensor& weight, bool transposed, float* out, int64_t ldc,
                    int64_t m);

// The plain-weight GEMM of the kernel trials (PreparedWeights::Kernel::kGemm) by a param
// `weight` (2-d, or a 1x1 convolution's [O, C, 1, 1] with `transposed`): few_rows_gemm for
// a few rows; for a weight of at most kSmallWeightBytes on an AVX-512 CPU, blocked_gemm on
// its [K, N] copy, where oneDNN's convolution spends more around the call than in it; else
// gemm_by_weight. beta 0.
constexpr int64_t kSmallWeightBytes = int64_t{1} << 20;
bool trial_gemm(PreparedWeights* prepared, const float* lhs, int64_t lda,
                const at::Tensor& weight, bool transposed, float* out, int64_t ldc, int64_t m);

bool gemm_by_weight(const float* lhs, int64_t lda, const at::Tensor& weight, bool transposed,
                    float* out, int64_t ldc, int64_t m, float beta);

}  // namespace blade::ral
