// A time profile of engine calls by kernel, off unless asked for (benchmarks/lengths.py
// --breakdown turns it on): each library call (ral_kernels.h: matmul, convolution,
// attention, sort) and each kernel call (kernel_calls.h: the aten and int8 ops) adds its
// seconds under its name, and each engine call its whole time under kEngineCalls, so what
// the generated code itself took (its loops, and the glue between calls) is the rest.
// The counters are process-wide; the calls of several threads add up.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <tuple>
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

}  // namespace blade::ral
