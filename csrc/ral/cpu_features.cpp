#include "ral/cpu_features.h"

#include <fstream>
#include <iterator>
#include <sstream>

namespace blade::ral {

std::set<std::string> parse_cpu_flags(std::istream& cpuinfo) {
  std::string line;
  while (std::getline(cpuinfo, line)) {
    const size_t colon = line.find(':');
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (colon != std::string::npos && (key == "flags" || key == "Features")) {
      std::istringstream words(line.substr(colon + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  }
  return {};
}

const std::set<std::string>& host_cpu_flags() {
  static const std::set<std::string> flags = [] {
    std::ifstream cpuinfo("/proc/cpuinfo");
    return parse_cpu_flags(cpuinfo);
  }();
  return flags;
}

bool has_cpu_feature(const std::string& feature) { return host_cpu_flags().count(feature) > 0; }

std::string missing_cpu_features(const std::string& required) {
  std::string missing;
  std::istringstream in(required);
  std::string feature;
  while (std::getline(in, feature, ',')) {
    if (!feature.empty() && !has_cpu_feature(feature)) {
      missing += (missing.empty() ? "" : ",") + feature;
    }
  }
  return missing;
}

}  // namespace blade::ral
