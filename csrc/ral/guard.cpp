#include "ral/guard.h"

#include "ral/text.h"

namespace blade::ral {
namespace {

constexpr int64_t kGuardFormatVersion = 1;

bool parse_raise(const std::string& mode) {
  TORCH_CHECK(mode == "fallback" || mode == "error",
              "blade: fallback mode must be 'fallback' or 'error', got '", mode, "'");
  return mode == "error";
}

// The specs without their `!` marks, and which had one.
std::string unmarked(const std::string& text, std::vector<bool>* written) {
  std::string specs;
  for (const std::string& spec : text.empty() ? std::vector<std::string>() : split(text, ';')) {
    const bool marked = !spec.empty() && spec[0] == '!';
    written->push_back(marked);
    specs += (written->size() == 1 ? "" : ";") + spec.substr(marked ? 1 : 0);
  }
  return specs;
}

// The bytes of its storage a strided tensor may touch: [first, last).
std::pair<const char*, const char*> span(const at::Tensor& t) {
  const char* base = static_cast<const char*>(t.storage().data());
  const int64_t item = static_cast<int64_t>(t.element_size());
  int64_t low = t.storage_offset();
  int64_t high = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? low : high) += reach;
  }
  return {base + low * item, base + (high + 1) * item};
}

}  // namespace

Guard::Guard(std::string input_specs, std::string fallback_mode)
    : raise_(parse_raise(fallback_mode)) {
  specs_ = parse_specs(unmarked(input_specs, &written_));
  TORCH_CHECK(written_.size() == specs_.size(), "blade: the input guard's specs '",
              input_specs.substr(0, 80), "' are malformed");
}

std::string Guard::input_specs() const {
  std::string text;
  for (size_t i = 0; i < specs_.size(); ++i) {
    text += (i == 0 ? "" : ";") + std::string(written_[i] ? "!" : "") + specs_[i].str();
  }
  return text;
}

std::string Guard::overlap(const std::vector<at::Tensor>& inputs) const {
  bool writes = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    writes = writes || written_[i];
  }
  if (!writes) {
    return "";
  }
  // Spans are compared as addresses: two storages may hold the same memory (from_numpy).
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (t.defined() && t.numel() > 0 &&
        (t.layout() != at::kStrided || !t.has_storage() || t.storage().data() == nullptr)) {
      return "input " + std::to_string(i) + " is not a dense tensor, so whether it shares " +
             "memory with an input the model writes into cannot be told";
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!written_[i] || !inputs[i].defined() || inputs[i].numel() == 0) {
      continue;
    }
    const auto [first, last] = span(inputs[i]);
    for (size_t j = 0; j < inputs.size(); ++j) {
      if (j == i || !inputs[j].defined() || inputs[j].numel() == 0) {
        continue;
      }
      const auto [other_first, other_last] = span(inputs[j]);
      if (first < other_last && other_first < last) {
        return "input " + std::to_string(i) + ", which the model writes into, shares memory " +
               "with input " + std::to_string(j);
      }
    }
  }
  return "";
}

bool Guard::admits(const std::vector<at::Tensor>& inputs) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto mismatch = check_signature(specs_, inputs);
  if (mismatch.why.empty()) {
    mismatch = {overlap(inputs), SlowPathKind::kMemoryOverlap, -1};
  }
  const std::string& why = mismatch.why;
  if (why.empty()) {
    slow_path_.note_compiled();
    return true;
  }
  TORCH_CHECK(!raise_, "blade: the optimized model cannot run these inputs: ", why,
              ". It was optimized for (", format_specs(specs_), "), got (",
              describe_tensors(inputs),
              "). Call it with inputs like the example inputs, optimize with "
              "Config(dynamic=True) for sizes that vary, or with Config(fallback='fallback') "
              "to run the unoptimized model for such inputs.");
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    last_fallback_reason_ = why;
  }
  slow_path_.note("the optimized model's input guard",
                  "the model as it was before optimization", mismatch.kind, mismatch.input,
                  why + " (optimized for " + format_specs(specs_) + ")");
  return false;
}

std::string Guard::last_fallback_reason() const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  return last_fallback_reason_;
}

Guard::State Guard::serialize() const {
  return State(kGuardFormatVersion, input_specs(), raise_ ? "error" : "fallback");
}

c10::intrusive_ptr<Guard> Guard::deserialize(State state) {
  auto& [version, specs, mode] = state;
  TORCH_CHECK(version == kGuardFormatVersion, "blade: the model's input guard has format "
              "version ", version, ", this Blade runtime reads version ", kGuardFormatVersion,
              ". Rebuild the model with this version of Blade.");
  return c10::make_intrusive<Guard>(specs, mode);
}

}  // namespace blade::ral
