// Products of a few rows by a weight read as it is: out[r, n] = sum_k x[r, k] * w[n, k]
// for r < kFewRows, w a dense [N, K] matrix (a linear layer's weight, a 1x1 convolution's
// [O, C]). Such a product reads each weight element once for a handful of multiply-adds,
// so its time is the weight's bytes over the memory bandwidth; oneDNN's convolution and
// MKL's sgemm spend tens of microseconds a call around it (a squeeze-excitation layer, a
// classifier, a decoder's token), which this loop does not.
#pragma once

#include <cstdint>

namespace blade::ral {

// The most rows few_rows_gemm takes: one pass over the weight serves them all.
constexpr int64_t kFewRows = 4;

// Whether few_rows_gemm runs here (AVX-512F; elsewhere the callers use MKL's sgemm).
bool few_rows_gemm_available();

// out[r, n] = sum_k x[r * ldx + k] * w[n * ldw + k] into out[r * ldout + n], for r < rows
// (1 <= rows <= kFewRows) and n < cols, on the intra-op threads (a range of n each).
// Sums run over k in 16 lanes, each added in order, then the lanes: a float32 rounding
// away from a sequential sum. False (nothing written) when it does not run here or the
// sizes are out of its range.
bool few_rows_gemm(const float* x, int64_t ldx, const float* w, int64_t ldw, float* out,
                   int64_t ldout, int64_t rows, int64_t cols, int64_t depth);

}  // namespace blade::ral
