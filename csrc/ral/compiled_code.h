// CompiledCode: the native code of one engine, loaded from bytes held in memory.
//
// The shared library produced by the compiler is written to an anonymous memory file
// (memfd) and opened from there, so nothing is left in the working directory or /tmp.
// The memory file stays open while the code is loaded (see the constructor for why).
// The library stays loaded as long as this object lives; the destructor unloads it.
#pragma once

#include "ral/kernel_calls.h"
#include "ral/signing.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace blade::ral {

// The one entry point every engine's code exports: `args` holds one pointer per memref
// descriptor, inputs first, then outputs (which the runtime allocates).
using EntryFn = void (*)(void** args);
constexpr const char* kEntrySymbol = "blade_entry";
// A function that returns the table of the code's kernel calls, a NUL-terminated string
// (kernel_calls.h); code that makes none has no such function.
using KernelCallsFn = const char* (*)();
constexpr const char* kKernelCallsSymbol = "blade_kernel_calls";
// A function that returns the indices (among `args`, in decimal, separated by spaces) of the
// float32 buffers the code reads only as the weight of its matmul and convolution kernels,
// never itself (codegen/kernels/weight_arguments.py); absent when there are none.
using WeightArgumentsFn = const char* (*)();
constexpr const char* kWeightArgumentsSymbol = "blade_weight_arguments";

class CompiledCode {
 public:
  // Throws c10::Error with the loader's message if the bytes are not a loadable library.
  CompiledCode(const uint8_t* data, size_t size, const std::string& name);
  ~CompiledCode();
  CompiledCode(const CompiledCode&) = delete;
  CompiledCode& operator=(const CompiledCode&) = delete;

  EntryFn entry() const { return entry_; }
  // The PyTorch ops the code calls (kernel_calls.h); nullptr when it calls none.
  const KernelCallTable* kernel_calls() const { return kernel_calls_.get(); }
  // The indices kWeightArgumentsSymbol lists, ascending (empty when the code has none).
  const std::vector<size_t>& weight_arguments() const { return weight_arguments_; }

  // The loaded code of these bytes (whose SHA-256 is `digest`), shared with every other
  // engine of this process that loaded the same bytes and still holds them: identical
  // clusters (a model's repeated layers) map their library once. Throws as the constructor
  // does.
  static std::shared_ptr<CompiledCode> load_shared(const uint8_t* data, size_t size,
                                                   const Digest& digest,
                                                   const std::string& name);

 private:
  int fd_ = -1;
  void* handle_ = nullptr;
  EntryFn entry_ = nullptr;
  std::unique_ptr<KernelCallTable> kernel_calls_;
  std::vector<size_t> weight_arguments_;
};

}  // namespace blade::ral
