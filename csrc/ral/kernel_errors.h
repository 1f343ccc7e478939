// How library calls and generated code report an error. None of them may throw (an
// exception cannot unwind through generated frames): a failure is recorded for the calling
// thread, and the engine call that ran the code takes it, discards the results and runs its
// TorchScript fallback instead (see Engine::execute). Generated code records its own
// errors (an index out of range, a zero divisor) through blade_ral_index_out_of_range and
// blade_ral_division_by_zero (ral_kernels.h), defined with these.
#pragma once

#include <mutex>
#include <string>

namespace blade::ral {

// The error a library call recorded on this thread since the last call, and clears it.
std::string take_kernel_error();

// Where errors recorded on a thread go while it runs a task of a parallel loop: the thread
// that launched the loop takes the first one after it (blade_ral_parallel_for), so an error
// in a task reaches the engine call that made it, whichever thread ran the task.
struct ErrorSink {
  std::mutex mutex;
  std::string message;
};

// Sends this thread's errors to `sink` (nullptr: to the thread itself); returns the
// previous sink.
ErrorSink* set_error_sink(ErrorSink* sink);

// Records `message` for the engine call in progress, unless an error is recorded already.
void record_kernel_error(const std::string& message);

// Whether an error is recorded for the engine call in progress on this thread.
bool kernel_error_pending();

}  // namespace blade::ral
