// The time profile of engine calls by kernel (call_profile.h).
#include "ral/call_profile.h"

#include <map>
#include <mutex>
#include <utility>

namespace blade::ral {
namespace {

std::mutex mutex;
// name -> (calls, seconds); never destroyed, as the runtime's other process-wide caches,
// so that a call timed during exit finds it.
std::map<std::string, std::pair<int64_t, double>>& times() {
  static auto* map = new std::map<std::string, std::pair<int64_t, double>>();
  return *map;
}

}  // namespace

void set_call_profiling(bool enabled) {
  detail::call_profiling_on.store(enabled, std::memory_order_relaxed);
}

void add_call_time(const std::string& name, double seconds) {
  std::lock_guard<std::mutex> lock(mutex);
  auto& entry = times()[name];
  entry.first += 1;
  entry.second += seconds;
}

std::vector<std::tuple<std::string, int64_t, double>> call_profile() {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::tuple<std::string, int64_t, double>> result;
  for (const auto& [name, entry] : times()) {
    result.emplace_back(name, entry.first, entry.second);
  }
  return result;
}

void reset_call_profile() {
  std::lock_guard<std::mutex> lock(mutex);
  times().clear();
}

}  // namespace blade::ral
