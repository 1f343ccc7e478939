// Kernel trials: where a kernel by one of an engine's weights has a second way to compute
// it (Winograd's 3x3 convolution, MKL's sgemm for a GEMM or a 1x1 convolution), the
// engine's own first calls time it against oneDNN's and keep the faster
// (PreparedWeights::next_kernel in prepared_weights.h; defined in kernel_trials.cpp).
#pragma once

#include <chrono>
#include <cstdint>

namespace blade::ral {

// Whether engines time a second kernel against oneDNN's (PreparedWeights::next_kernel;
// on by default). Off, every kernel with a second way runs oneDNN's (a bf16 engine's
// convolutions in bfloat16): tests use it to get the same kernels on every CPU.
void set_kernel_trials(bool enabled);

// The calls of an engine by which each of its trials has decided (its first call, then
// each kernel's timed turns): benchmarks and tests warm an engine up with as many.
int64_t kernel_trial_calls();

// While one lives on a thread, its calls run one kernel per trial op (onednn_run_pending
// is false): the compile-time check (Engine::run_code) needs the result, not the timing.
class OneKernelPerCall {
 public:
  OneKernelPerCall();
  ~OneKernelPerCall();
  OneKernelPerCall(const OneKernelPerCall&) = delete;
  OneKernelPerCall& operator=(const OneKernelPerCall&) = delete;

 private:
  bool previous_;
};

// Seconds since construction: how long a trial's kernel took (record_kernel_time).
class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace blade::ral
