// Products of a few rows by a weight read as it is (few_rows_gemm.h).
#include "ral/few_rows_gemm.h"

#include "ral/cpu_features.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>

namespace blade::ral {
namespace {

// Multiply-adds a task takes at least: below it the threads' start costs more than the sums.
constexpr int64_t kTaskMacs = 32768;

// How far ahead of its loads the weight is fetched, in floats (8 KB): one core's hardware
// prefetch alone keeps too few lines in flight for the memory's rate.
constexpr int64_t kAhead = 2048;

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// _mm512_reduce_add_ps's _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Columns [begin, end) of out's `Rows` rows, one weight row after another: Rows sums of 16
// lanes each, the weight row read once for all the rows of x (which stay in L1). Rows are
// read whole and in order, one stream of memory, fetched kAhead floats ahead: interleaving
// a few rows' streams, or leaving them to the hardware's prefetch, reads memory slower.
template <int Rows>
__attribute__((target("avx512f"))) void columns_avx512(const float* x, int64_t ldx,
                                                       const float* w, int64_t ldw, float* out,
                                                       int64_t ldout, int64_t begin,
                                                       int64_t end, int64_t depth) {
  const int64_t whole = depth & ~int64_t{15};
  const __mmask16 tail = lanes_left(depth & 15);
  for (int64_t n = begin; n < end; ++n) {
    const float* weights = w + n * ldw;
    __m512 sum[Rows];
#pragma GCC unroll 4
    for (int r = 0; r < Rows; ++r) {
      sum[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < whole; k += 16) {
      // A prefetch never faults: past the last row it asks for nothing the loop reads.
      _mm_prefetch(reinterpret_cast<const char*>(weights + k + kAhead), _MM_HINT_T1);
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
  // Enough columns per task to outweigh a thread's start.
  const int64_t grain = std::max<int64_t>(1, kTaskMacs / (depth * rows));
  at::parallel_for(0, cols, grain, [&](int64_t begin, int64_t end) {
    kernel(x, ldx, w, ldw, out, ldout, begin, end, depth);
  });
  return true;
}

}  // namespace blade::ral
