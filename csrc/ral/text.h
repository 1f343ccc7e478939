// Small pieces of the runtime's text formats (specs, kernel-call tables, engine writes).
#pragma once

#include <string>
#include <vector>

namespace blade::ral {

// `text` cut at every `separator`: empty parts kept ("a;" is "a" and ""), one part for
// text without a separator.
inline std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos
                                                                 : end - start));
    if (end == std::string::npos) {
      return parts;
    }
    start = end + 1;
  }
}

}  // namespace blade::ral
