#include "ral/slow_path.h"

#include <c10/util/Exception.h>

namespace blade::ral {

const char* slow_path_fix(SlowPathKind kind) {
  switch (kind) {
    case SlowPathKind::kInputCount:
      return "Call it with the inputs the example had.";
    case SlowPathKind::kUndefined:
      return "Pass a tensor (or None) where the example inputs did, or optimize with example "
             "inputs like these.";
    case SlowPathKind::kDevice:
      return "Move the input to the CPU: Blade compiles for the CPU.";
    case SlowPathKind::kDtype:
      return "Cast the input to the dtype of the example inputs, or optimize with example "
             "inputs of this dtype.";
    case SlowPathKind::kRank:
      return "Call it with inputs of the example inputs' rank.";
    case SlowPathKind::kSize:
      return "Optimize with Config(dynamic=True), or name the dims that vary with "
             "Config(dynamic_dims=...).";
    case SlowPathKind::kStaticDim:
      return "The model was optimized with dynamic shapes, but this dim stayed static (a "
             "size-1 dim of the example, or one the model needs at that size; blade.report's "
             "'the example cannot tell' lines name the first kind): optimize with an example "
             "where it is larger, or name it in Config(dynamic_dims=...).";
    case SlowPathKind::kSharedSize:
      return "The example inputs had equal sizes here: optimize with example inputs whose "
             "sizes differ where they may, or name the dims with Config(dynamic_dims=...).";
    case SlowPathKind::kMemoryOverlap:
      return "Pass inputs that share no memory with the input the model writes into.";
    case SlowPathKind::kGradMode:
      return "Run inference under torch.no_grad() or torch.inference_mode().";
    case SlowPathKind::kCodeError:
      return "The engine's status in blade.report says more; please report it.";
    case SlowPathKind::kNotLoaded:
      return "blade.report shows the engine's status.";
  }
  return "";
}

void warn_user(const std::string& message) {
  TORCH_WARN(message);
}

void SlowPathLog::note(const std::string& who, const std::string& path, SlowPathKind kind,
                       int64_t input, const std::string& reason) {
  last_compiled_.store(false);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, first] = seen_.try_emplace({static_cast<int>(kind), input}, Entry{reason, 0});
    ++it->second.calls;
    if (!first) {
      return;
    }
  }
  warn_user("blade: " + who + " ran " + path + " (slower) for a call: " + reason + ". " +
            slow_path_fix(kind) +
            " (Said once per kind of reason; blade.report counts every such call.)");
}

std::vector<std::pair<std::string, int64_t>> SlowPathLog::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<std::string, int64_t>> result;
  for (const auto& [key, entry] : seen_) {
    result.emplace_back(entry.reason, entry.calls);
  }
  return result;
}

}  // namespace blade::ral
