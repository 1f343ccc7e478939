// Parallel loops of generated code, run on PyTorch's intra-op thread pool.
#include "ral/ral_abi.h"

#include <ATen/Parallel.h>

extern "C" void blade_ral_parallel_for(int64_t extent, int64_t grain,
                                       void (*task)(int64_t, int64_t, void**),
                                       void** arguments) {
  // Tasks are plain loops over disjoint rows: nothing to catch, nothing to join but the
  // pool's own barrier.
  at::parallel_for(0, extent, grain,
                   [&](int64_t begin, int64_t end) { task(begin, end, arguments); });
}
