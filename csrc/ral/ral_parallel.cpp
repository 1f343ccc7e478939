// Parallel loops of generated code, run on PyTorch's intra-op thread pool.
#include "ral/ral_parallel.h"

#include "ral/call_profile.h"
#include "ral/kernel_errors.h"
#include "ral/ral_abi.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>

namespace blade::ral {

void run_parallel_tasks(int64_t extent, int64_t grain, void (*task)(int64_t, int64_t, void**),
                        void** arguments) {
  // Tasks are plain loops over disjoint rows: nothing to catch, nothing to join but the
  // pool's own barrier. An error a task records (an index out of range) goes to `errors`,
  // whichever thread runs it, and from there to this thread's engine call.
  ErrorSink errors;
  at::parallel_for(0, extent, grain, [&](int64_t begin, int64_t end) {
    ErrorSink* previous = set_error_sink(&errors);
    task(begin, end, arguments);
    set_error_sink(previous);
  });
  if (!errors.message.empty()) {
    record_kernel_error(errors.message);
  }
}

}  // namespace blade::ral

extern "C" void blade_ral_parallel_for(int64_t extent, int64_t grain,
                                       void (*task)(int64_t, int64_t, void**),
                                       void** arguments) {
  // Profiled by the loop's task (its address names the loop nest) and extent; the
  // runtime's own kernels call run_parallel_tasks, inside their own call's time.
  const blade::ral::ProfiledCall profiled([&] {
    char name[64];
    std::snprintf(name, sizeof name, "parallel loop %p extent %lld",
                  reinterpret_cast<void*>(task), static_cast<long long>(extent));
    return std::string(name);
  });
  blade::ral::run_parallel_tasks(extent, grain, task, arguments);
}
