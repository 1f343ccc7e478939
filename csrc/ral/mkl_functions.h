// The MKL entry points the runtime calls directly, found in libtorch at run time (dlsym)
// so that a libtorch built without MKL still loads the runtime: each is null then, and its
// caller takes PyTorch's own kernels instead. One lookup for the whole runtime.
#pragma once

#include <cstddef>
#include <cstdint>

namespace blade::ral {

// CBLAS constants.
constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;
constexpr int kCblasTrans = 112;
constexpr int kCblasPacked = 151;
constexpr int kCblasBMatrix = 162;

struct MklFunctions {
  // sgemm through the Fortran interface (column-major; libtorch exports no cblas_sgemm).
  using FortranSgemm = void (*)(const char* transa, const char* transb, const int* m,
                                const int* n, const int* k, const float* alpha, const float* a,
                                const int* lda, const float* b, const int* ldb,
                                const float* beta, float* c, const int* ldc);
  // Packed GEMM: a weight reordered once into MKL's layout, multiplied many times.
  using PackGetSize = size_t (*)(int identifier, int m, int n, int k);
  using Pack = void (*)(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                        const float* src, int ld, float* dest);
  using Compute = void (*)(int layout, int transa, int transb, int m, int n, int k,
                           const float* a, int lda, const float* b, int ldb, float beta,
                           float* c, int ldc);

  FortranSgemm sgemm = nullptr;
  PackGetSize pack_get_size = nullptr;
  Pack pack = nullptr;
  Compute compute = nullptr;

  bool has_packed_gemm() const { return pack_get_size && pack && compute; }
};

const MklFunctions& mkl_functions();

// Row-major C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C by MKL's sgemm (the
// column-major product C^T = op(B)^T @ op(A)^T); every size and leading dim must fit an
// int, and mkl_functions().sgemm must exist.
void sgemm_row_major(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                     float beta, float* c, int64_t ldc);

}  // namespace blade::ral
