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

}  // namespace blade::ral
