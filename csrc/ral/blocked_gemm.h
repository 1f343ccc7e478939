// GEMMs of any row count by a weight's dense [K, N] copy (PreparedWeights::k_by_n) through
// oneDNN's brgemm microkernel (PyTorch's exported cpublas::brgemm, AVX-512 code generated at
// run time), in Blade's own blocks on the intra-op threads. One copy serves every row
// count, where oneDNN's convolution wants a copy per row count: it is what a dynamic
// engine's GEMM runs once a weight has all the copies it may have (MKL's sgemm runs its
// AVX2 code on AMD CPUs, at half the speed).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

// Whether blocked_gemm runs here (AVX-512F: the microkernel's float32 code).
bool blocked_gemm_available();

// out[r, j] = sum_k a[r * lda + k] * b[k * n + j] into out[r * ldc + j], for r < m, j < n:
// blocks of up to 128 rows by 64 columns, 512 of the depth at a time added into out.
// False (nothing written) where it does not run or a size is not positive.
bool blocked_gemm(const float* a, int64_t lda, const float* b, int64_t n, float* out,
                  int64_t ldc, int64_t m, int64_t k);

// The columns of a [K, N] matrix per block of kPanelColumns, each block's K rows contiguous
// (zeros past N): [ceil(N / 64), K, 64]. What the engine's weight copies hold
// (PreparedWeights::k_by_n): each microkernel call then reads its weight block from one
// contiguous stretch, where a row-major [K, N] one is read 64 floats from each of K rows
// N floats apart (slower in an engine, where other weights have pushed it out of the
// caches: docs/architecture.md).
inline constexpr int64_t kPanelColumns = 64;
at::Tensor column_panels(const at::Tensor& k_by_n);
// blocked_gemm by `panels` (column_panels of a [k, n] matrix).
bool blocked_gemm_panels(const float* a, int64_t lda, const float* panels, int64_t n,
                         float* out, int64_t ldc, int64_t m, int64_t k);

}  // namespace blade::ral
