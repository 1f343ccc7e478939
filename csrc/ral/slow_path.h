// SlowPath: telling the user when a call runs TorchScript instead of compiled code.
//
// A guard that refuses a call, or an engine that runs its subgraph, gives the right
// results, only slower; without a word a service can lose its speed unnoticed. Each kind
// of reason (an input's size, dtype, rank, device; shared memory; grad mode; code that
// failed or was not loaded) is said once per guard or engine, with the fix in one line,
// through TORCH_WARN: a UserWarning under Python (so `-W error` and warning filters
// apply), c10's warning handler in a C++ service (which can route it with
// c10::WarningUtils::set_warning_handler). The counters in blade.report count every call.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace blade::ral {

enum class SlowPathKind {
  kInputCount,    // another number of inputs
  kUndefined,     // a tensor where None was compiled, or the reverse
  kDevice,
  kDtype,
  kRank,
  kSize,          // a static dim of another size
  kStaticDim,     // the same, in a signature with dynamic dims (a dynamic compile)
  kSharedSize,    // dims that share a symbol have different sizes
  kMemoryOverlap, // an input the model writes into shares memory with another
  kGradMode,      // an input requires grad under grad mode
  kCodeError,     // a library call in the compiled code reported an error
  kNotLoaded,     // the code was not loaded (untrusted key, CPU features, format)
};

// The one-line fix for a kind of reason.
const char* slow_path_fix(SlowPathKind kind);

// A UserWarning (TORCH_WARN): under Python it points at the model's call.
void warn_user(const std::string& message);

// What one guard or engine says of its slow calls: how many, by kind of reason, and the
// first reason of each kind. Thread-safe.
class SlowPathLog {
 public:
  // Counts a call that ran `path` (the slower one) for `reason`, of `kind` in input
  // `input` (-1: none in particular); warns "blade: <who> ran <path> (slower) for a call:
  // <reason>. <fix>" the first time this kind and input are seen.
  void note(const std::string& who, const std::string& path, SlowPathKind kind,
            int64_t input, const std::string& reason);
  // The first reason of each kind and input, with the number of calls of that kind.
  std::vector<std::pair<std::string, int64_t>> counts() const;
  // Whether the latest call ran the compiled path (true before any call).
  bool last_call_compiled() const { return last_compiled_.load(); }
  // On every compiled call: a read, and a write only after a slow call (no cache line
  // passed between threads serving compiled calls).
  void note_compiled() {
    if (!last_compiled_.load(std::memory_order_relaxed)) {
      last_compiled_.store(true, std::memory_order_relaxed);
    }
  }

 private:
  struct Entry {
    std::string reason;
    int64_t calls = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<int, int64_t>, Entry> seen_;
  std::atomic<bool> last_compiled_{true};
};

}  // namespace blade::ral
