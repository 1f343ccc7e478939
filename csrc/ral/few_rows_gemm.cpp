// Products of a few rows by a weight read as it is (few_rows_gemm.h).
#include "ral/few_rows_gemm.h"

#include "ral/cpu_features.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>

namespace blade::ral {
namespace {

// Multiply-adds a task takes at least: below it the threads' start costs more than the sums.
constexpr int64_t kTaskMacs = 32768;

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// _mm512_reduce_add_ps's _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Columns [begin, end) of out's `Rows` rows, four weight rows at a time: 4 x Rows sums of 16
// lanes each, the weight rows read once for all the rows of x (which stay in L1).
template <int Rows>
__attribute__((target("avx512f"))) void columns_avx512(const float* x, int64_t ldx,
                                                       const float* w, int64_t ldw, float* out,
                                                       int64_t ldout, int64_t begin,
                                                       int64_t end, int64_t depth) {
  const int64_t whole = depth & ~int64_t{15};
  const __mmask16 tail = static_cast<__mmask16>((1u << (depth & 15)) - 1u);
  int64_t n = begin;
  for (; n + 4 <= end; n += 4) {
    const float* row[4] = {w + n * ldw, w + (n + 1) * ldw, w + (n + 2) * ldw,
                           w + (n + 3) * ldw};
    __m512 sum[Rows][4];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        sum[r][j] = _mm512_setzero_ps();
      }
    }
    for (int64_t k = 0; k < whole; k += 16) {
      __m512 b[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        b[j] = _mm512_loadu_ps(row[j] + k);
      }
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) {
        const __m512 a = _mm512_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          sum[r][j] = _mm512_fmadd_ps(a, b[j], sum[r][j]);
        }
      }
    }
    if (tail != 0) {
      __m512 b[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        b[j] = _mm512_maskz_loadu_ps(tail, row[j] + whole);
      }
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) {
        const __m512 a = _mm512_maskz_loadu_ps(tail, x + r * ldx + whole);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          sum[r][j] = _mm512_fmadd_ps(a, b[j], sum[r][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        out[r * ldout + n + j] = _mm512_reduce_add_ps(sum[r][j]);
      }
    }
  }
  for (; n < end; ++n) {  // the last columns, one at a time
    const float* weights = w + n * ldw;
    __m512 sum[Rows];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
      sum[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < whole; k += 16) {
      const __m512 b = _mm512_loadu_ps(weights + k);
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) {
        sum[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * ldx + k), b, sum[r]);
      }
    }
    if (tail != 0) {
      const __m512 b = _mm512_maskz_loadu_ps(tail, weights + whole);
#pragma GCC unroll 4
      for (int r = 0; r < Rows; ++r) {
        sum[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + r * ldx + whole), b, sum[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
      out[r * ldout + n] = _mm512_reduce_add_ps(sum[r]);
    }
  }
}

#pragma GCC diagnostic pop

using ColumnsKernel = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t,
                               int64_t, int64_t, int64_t);

}  // namespace

bool few_rows_gemm_available() {
  static const bool available = has_cpu_feature("avx512f");
  return available;
}

bool few_rows_gemm(const float* x, int64_t ldx, const float* w, int64_t ldw, float* out,
                   int64_t ldout, int64_t rows, int64_t cols, int64_t depth) {
  if (!few_rows_gemm_available() || rows < 1 || rows > kFewRows || cols < 1 || depth < 1 ||
      ldx < depth || ldw < depth || ldout < cols) {
    return false;
  }
  static constexpr ColumnsKernel kernels[kFewRows] = {
      columns_avx512<1>, columns_avx512<2>, columns_avx512<3>, columns_avx512<4>};
  const ColumnsKernel kernel = kernels[rows - 1];
  // Whole groups of four columns per task, enough of them to outweigh a thread's start.
  const int64_t grain = std::max<int64_t>(4, (kTaskMacs / (depth * rows) + 3) & ~int64_t{3});
  at::parallel_for(0, cols, grain, [&](int64_t begin, int64_t end) {
    kernel(x, ldx, w, ldw, out, ldout, begin, end, depth);
  });
  return true;
}

}  // namespace blade::ral
