#include "ral/cpu_features.h"

#include <cpuid.h>

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

int amd_cpu_family() {
  static const int family = [] {
    unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
    // "AuthenticAMD" in ebx, edx, ecx.
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0 || ebx != 0x68747541 ||
        edx != 0x69746e65 || ecx != 0x444d4163 || __get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) {
      return 0;
    }
    const unsigned int base = (eax >> 8) & 0xf;
    return static_cast<int>(base == 0xf ? base + ((eax >> 20) & 0xff) : base);
  }();
  return family;
}

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
