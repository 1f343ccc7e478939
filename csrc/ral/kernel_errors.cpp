#include "ral/kernel_errors.h"

#include "ral/ral_kernels.h"

#include <string>

namespace blade::ral {
namespace {

thread_local std::string kernel_error;
thread_local ErrorSink* error_sink = nullptr;

}  // namespace

std::string take_kernel_error() {
  std::string error;
  error.swap(kernel_error);
  return error;
}

ErrorSink* set_error_sink(ErrorSink* sink) {
  ErrorSink* previous = error_sink;
  error_sink = sink;
  return previous;
}

bool kernel_error_pending() {
  if (error_sink != nullptr) {
    std::lock_guard<std::mutex> lock(error_sink->mutex);
    return !error_sink->message.empty();
  }
  return !kernel_error.empty();
}

void record_kernel_error(const std::string& message) {
  if (error_sink != nullptr) {
    std::lock_guard<std::mutex> lock(error_sink->mutex);
    if (error_sink->message.empty()) {
      error_sink->message = message;
    }
  } else if (kernel_error.empty()) {
    kernel_error = message;
  }
}

}  // namespace blade::ral

extern "C" {

void blade_ral_index_out_of_range(int64_t index, int64_t size) {
  blade::ral::record_kernel_error("index " + std::to_string(index) +
                                  " is out of bounds for a dimension of size " +
                                  std::to_string(size));
}

void blade_ral_division_by_zero() {
  blade::ral::record_kernel_error("integer division by zero");
}
}
