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

namespace {

// The blocked GEMM, its weight block for (depth, column) at `b_at(depth, column)` with
// leading dimension `ldb`.
template <typename BlockOf>
bool gemm_blocks(const float* a, int64_t lda, BlockOf b_at, int64_t ldb, int64_t n,
                 float* out, int64_t ldc, int64_t m, int64_t k) {
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
        at::native::cpublas::brgemm(height, width, std::min(kDepthBlock, k - depth), lda, ldb,
                                    ldc, /*add_C=*/depth > 0, a + row * lda + depth,
                                    b_at(depth, column), out + row * ldc + column,
                                    /*is_vnni=*/false);
      }
    }
  });
  return true;
}

}  // namespace

bool blocked_gemm(const float* a, int64_t lda, const float* b, int64_t n, float* out,
                  int64_t ldc, int64_t m, int64_t k) {
  return gemm_blocks(
      a, lda, [&](int64_t depth, int64_t column) { return b + depth * n + column; }, n, n,
      out, ldc, m, k);
}

bool blocked_gemm_panels(const float* a, int64_t lda, const float* panels, int64_t n,
                         float* out, int64_t ldc, int64_t m, int64_t k) {
  static_assert(kPanelColumns == kColumnBlock, "a panel is a block's columns");
  return gemm_blocks(
      a, lda,
      [&](int64_t depth, int64_t column) {
        return panels + (column / kPanelColumns * k + depth) * kPanelColumns;
      },
      kPanelColumns, n, out, ldc, m, k);
}

at::Tensor column_panels(const at::Tensor& k_by_n) {
  TORCH_CHECK(k_by_n.dim() == 2 && k_by_n.scalar_type() == at::kFloat,
              "column_panels: a float32 [K, N] matrix is needed, got ", k_by_n.scalar_type(),
              k_by_n.sizes());
  const int64_t k = k_by_n.size(0);
  const int64_t n = k_by_n.size(1);
  const int64_t blocks = (n + kPanelColumns - 1) / kPanelColumns;
  at::Tensor padded = at::zeros({k, blocks * kPanelColumns}, k_by_n.options());
  padded.narrow(1, 0, n).copy_(k_by_n);
  return padded.view({k, blocks, kPanelColumns}).permute({1, 0, 2}).contiguous();
}

}  // namespace blade::ral
