// The runtime's parallel tasks (ral_parallel.cpp): what blade_ral_parallel_for (ral_abi.h)
// runs for generated code, for the runtime's own kernels to call without going through the
// generated code's entry (whose calls the call profile times as loops).
#pragma once

#include <cstdint>

namespace blade::ral {

// `task(begin, end, arguments)` over [0, extent) in chunks of at least `grain` on the
// intra-op threads; an error a task records becomes this thread's kernel error.
void run_parallel_tasks(int64_t extent, int64_t grain, void (*task)(int64_t, int64_t, void**),
                        void** arguments);

}  // namespace blade::ral
