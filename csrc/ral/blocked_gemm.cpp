// GEMMs by a weight's [K, N] copy through oneDNN's brgemm microkernel (blocked_gemm.h).
#include "ral/blocked_gemm.h"

#include "ral/cpu_features.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>

namespace blade::ral {
namespace {

// Rows per block at most (the blocks of a call split the rows evenly), columns per block
// (four 16-float vectors), and the depth one microkernel call takes (its slice of b, 128 KB,
// stays in L2 for the block's rows): the best of the blockings tried on BERT-base's GEMMs
// of 8 to 384 rows (the commit that added this file gives the rates).
constexpr int64_t kMaxRowBlock = 128;
constexpr int64_t kColumnBlock = 64;
constexpr int64_t kDepthBlock = 512;

}  // namespace

bool blocked_gemm_available() {
  static const bool available = has_cpu_feature("avx512f");
  return available;
}

bool blocked_gemm(const float* a, int64_t lda, const float* b, int64_t n, float* out,
                  int64_t ldc, int64_t m, int64_t k) {
  if (!blocked_gemm_available() || m <= 0 || n <= 0 || k <= 0 || lda < k || ldc < n) {
    return false;
  }
  const int64_t row_blocks = (m + kMaxRowBlock - 1) / kMaxRowBlock;
  const int64_t rows = (m + row_blocks - 1) / row_blocks;
  const int64_t column_blocks = (n + kColumnBlock - 1) / kColumnBlock;
  // Blocks in row order: a thread's consecutive blocks share their rows of a.
  at::parallel_for(0, row_blocks * column_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t row = block / column_blocks * rows;
      const int64_t column = block % column_blocks * kColumnBlock;
      const int64_t height = std::min(rows, m - row);
      const int64_t width = std::min(kColumnBlock, n - column);
      for (int64_t depth = 0; depth < k; depth += kDepthBlock) {
        at::native::cpublas::brgemm(height, width, std::min(kDepthBlock, k - depth), lda, n, ldc,
                                    /*add_C=*/depth > 0, a + row * lda + depth,
                                    b + depth * n + column, out + row * ldc + column,
                                    /*is_vnni=*/false);
      }
    }
  });
  return true;
}

}  // namespace blade::ral
