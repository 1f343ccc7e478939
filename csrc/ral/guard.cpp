#include "ral/guard.h"

namespace blade::ral {
namespace {

constexpr int64_t kGuardFormatVersion = 1;

bool parse_raise(const std::string& mode) {
  TORCH_CHECK(mode == "fallback" || mode == "error",
              "blade: fallback mode must be 'fallback' or 'error', got '", mode, "'");
  return mode == "error";
}

}  // namespace

Guard::Guard(std::string input_specs, std::string fallback_mode)
    : specs_(parse_specs(input_specs)), raise_(parse_raise(fallback_mode)) {}

bool Guard::admits(const std::vector<at::Tensor>& inputs) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto why = signature_mismatch(specs_, inputs);
  if (why.empty()) {
    return true;
  }
  TORCH_CHECK(!raise_, "blade: the optimized model cannot run these inputs: ", why,
              ". It was optimized for (", format_specs(specs_), "), got (",
              describe_tensors(inputs),
              "). Call it with inputs like the example inputs, optimize with "
              "Config(dynamic=True) for sizes that vary, or with Config(fallback='fallback') "
              "to run the unoptimized model for such inputs.");
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(reason_mutex_);
  last_fallback_reason_ = why;
  return false;
}

std::string Guard::last_fallback_reason() const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  return last_fallback_reason_;
}

Guard::State Guard::serialize() const {
  return State(kGuardFormatVersion, format_specs(specs_), raise_ ? "error" : "fallback");
}

c10::intrusive_ptr<Guard> Guard::deserialize(State state) {
  auto& [version, specs, mode] = state;
  TORCH_CHECK(version == kGuardFormatVersion, "blade: the model's input guard has format "
              "version ", version, ", this Blade runtime reads version ", kGuardFormatVersion,
              ". Rebuild the model with this version of Blade.");
  return c10::make_intrusive<Guard>(specs, mode);
}

}  // namespace blade::ral
