#include "ral/mkl_functions.h"

#include <dlfcn.h>

namespace blade::ral {

const MklFunctions& mkl_functions() {
  static const MklFunctions found = [] {
    MklFunctions f;
    f.sgemm = reinterpret_cast<MklFunctions::FortranSgemm>(dlsym(RTLD_DEFAULT, "sgemm_"));
    f.pack_get_size = reinterpret_cast<MklFunctions::PackGetSize>(
        dlsym(RTLD_DEFAULT, "cblas_sgemm_pack_get_size"));
    f.pack = reinterpret_cast<MklFunctions::Pack>(dlsym(RTLD_DEFAULT, "cblas_sgemm_pack"));
    f.compute =
        reinterpret_cast<MklFunctions::Compute>(dlsym(RTLD_DEFAULT, "cblas_sgemm_compute"));
    return f;
  }();
  return found;
}

void sgemm_row_major(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                     float beta, float* c, int64_t ldc) {
  const char ta = transpose_a ? 'T' : 'N';
  const char tb = transpose_b ? 'T' : 'N';
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int lda_i = static_cast<int>(lda), ldb_i = static_cast<int>(ldb),
            ldc_i = static_cast<int>(ldc);
  mkl_functions().sgemm(&tb, &ta, &ni, &mi, &ki, &alpha, b, &ldb_i, a, &lda_i, &beta, c,
                        &ldc_i);
}

}  // namespace blade::ral
