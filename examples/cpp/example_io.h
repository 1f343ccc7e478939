// What blade_run and blade_serve share: reading a file or a saved list, writing an IValue
// that torch.load reads, and printing the input guard's and engines' counters of a loaded model.
#pragma once

#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace blade_example {

inline std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(std::string("cannot open ") + path);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The items of a list saved from Python with torch.save([...], path); `holding` says what
// the list must hold, for the error.
inline std::vector<c10::IValue> read_list(const char* path, const std::string& holding) {
  c10::IValue saved = torch::pickle_load(read_file(path));
  if (!saved.isList()) {
    throw std::runtime_error(std::string(path) + " must hold a list of " + holding +
                             ", found " + saved.tagKind());
  }
  std::vector<c10::IValue> items;
  for (const c10::IValue& item : saved.toListRef()) {
    items.push_back(item);
  }
  return items;
}

// torch::pickle_save, which torch.load reads.
inline void write_pickle(const char* path, const c10::IValue& value) {
  std::vector<char> bytes = torch::pickle_save(value);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    throw std::runtime_error(std::string("cannot write ") + path);
  }
}

// What Blade did, on stderr: the input guard's calls and the calls it sent to the
// unspecialized model (inputs unlike the example inputs), then each engine's calls and
// calls that fell back to TorchScript, each with the reason of the last fallback.
inline void print_counters(torch::jit::Module& model) {
  for (const auto& attr : model.named_attributes(/*recurse=*/false)) {
    const bool guard = attr.name == "blade_guard";
    if ((guard || attr.name.rfind("blade_engine_", 0) == 0) && attr.value.isObject()) {
      torch::jit::Object object(attr.value.toObject());
      const int64_t fallbacks = object.run_method("fallbacks").toInt();
      std::cerr << attr.name << ": calls=" << object.run_method("calls").toInt()
                << " fallbacks=" << fallbacks;
      if (fallbacks > 0) {
        std::cerr << " (last: " << object.run_method("last_fallback_reason").toStringRef()
                  << ")";
      }
      std::cerr << "\n";
    }
  }
}

}  // namespace blade_example
