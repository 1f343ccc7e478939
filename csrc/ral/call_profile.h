// A time profile of engine calls by kernel, off unless asked for (benchmarks/lengths.py
// --breakdown turns it on): each library call (ral_kernels.h: matmul, convolution,
// attention, sort) and each kernel call (kernel_calls.h: the aten and int8 ops) adds its
// seconds under its name, each parallel loop of generated code (ral_parallel.cpp) under its
// task's address and extent, and each engine call its whole time under kEngineCalls, so
// what the rest of the generated code took (its serial loops, the glue between calls) is
// what is left.
// The counters are process-wide; the calls of several threads add up.
#pragma once

#include "ral/kernel_trials.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace blade::ral {

// The key of the engines' whole calls.
inline constexpr const char* kEngineCalls = "engine calls (whole)";

namespace detail {
inline std::atomic<bool> call_profiling_on{false};
}  // namespace detail

// Whether calls are timed now (one relaxed load: what every call pays when it is off).
inline bool call_profiling() {
  return detail::call_profiling_on.load(std::memory_order_relaxed);
}
void set_call_profiling(bool enabled);
// Adds one call of `seconds` to `name`'s count and time.
void add_call_time(const std::string& name, double seconds);
// (name, calls, seconds) for every name timed since the last reset, by name.
std::vector<std::tuple<std::string, int64_t, double>> call_profile();
void reset_call_profile();

// Times its scope under `name()` (called only then, so a name built from the operands costs
// nothing unprofiled) when calls are profiled as it begins.
template <typename NameFn>
class ProfiledCall {
 public:
  explicit ProfiledCall(NameFn name) : name_(std::move(name)) {
    if (call_profiling()) {
      stopwatch_.emplace();
    }
  }
  ~ProfiledCall() {
    if (stopwatch_.has_value()) {
      try {
        add_call_time(name_(), stopwatch_->seconds());
      } catch (const std::exception&) {  // a name that cannot be made: the time is dropped
      }
    }
  }
  ProfiledCall(const ProfiledCall&) = delete;
  ProfiledCall& operator=(const ProfiledCall&) = delete;

 private:
  NameFn name_;
  std::optional<Stopwatch> stopwatch_;
};

}  // namespace blade::ral
