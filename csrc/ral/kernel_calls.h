// Kernel calls: generated code calling one of PyTorch's ops through the dispatcher, for
// ops nothing lowers to StableHLO (python/blade/partition/kernel_calls.py decides which).
//
// An engine's library holds a table, the NUL-terminated string its function
// `blade_kernel_calls()` returns: one line per call, its fields separated by spaces (see
// kernel_calls.spec in Python):
//
//   <overload> <operand dtypes> <result dtypes> <argument>...
//
// e.g. `aten::bernoulli.p float32 float32 T0 f0x1.0000000000000p-1 N`. Dtypes are Blade's
// names (tensor_spec.h's, as in engine signatures) joined by commas (`-` for none); an int8
// convolution's float32 operand or result may be `float32:nhwc`, its buffer [N, H, W, C]
// data that the op sees as [N, C, H, W] channels_last (the engine's NHWC layout, see
// codegen/stablehlo/layouts.py), so neither side transposes it. Each argument, in schema order, is `T<k>` (the
// call's k-th tensor operand), `N` (None), `b0`/`b1`, `i<int>`, `f<C99 hex float>`,
// `s<UTF-8 bytes in hex>` (a string), `D<device name in hex>`, or a list of ints, floats
// or bools: `I`, `F`, `B` followed by its items joined by commas.
//
// CompiledCode parses the table when it loads the library, after the engine's signature
// was verified; a malformed table, or an op this PyTorch does not have, refuses the code.
// While an engine runs its code, the table is the calling thread's active one, and the
// code's `blade_ral_kernel_call_<n>(call, memrefs...)` runs line `call` of it: the
// operands are viewed in place, the op's results copied into the result buffers the code
// allocated, after checking their dtypes and sizes. Failures are recorded like every
// library call's (kernel_errors.h): the engine then runs its TorchScript fallback.
#pragma once

#include "ral/ral_kernels.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace blade::ral {

struct KernelCall {
  std::string name;  // the overload, for messages
  std::optional<c10::OperatorHandle> op;
  std::vector<c10::ScalarType> operand_types;
  std::vector<c10::ScalarType> result_types;
  // Which operands and results are NHWC buffers, viewed as channels_last [N, C, H, W].
  std::vector<bool> operand_nhwc;
  std::vector<bool> result_nhwc;
  // The op's arguments in schema order: a constant, or (tensor_operand[i] >= 0) the
  // call's tensor operand of that index.
  std::vector<c10::IValue> constants;
  std::vector<int64_t> tensor_operand;
  // Whether the op may make its single result in the engine's result buffer (see
  // run_kernel_call): Blade's int8 ops whose result comes out in the buffer's layout
  // (a convolution's: uint8 NHWC bytes, or float32 into an NHWC buffer).
  bool places_result = false;
};

class KernelCallTable {
 public:
  // Throws c10::Error naming the line and what is wrong with it.
  explicit KernelCallTable(const std::string& text);

  size_t size() const { return calls_.size(); }
  const KernelCall& at(size_t index) const { return calls_.at(index); }
  // Whether some call draws from PyTorch's random generator.
  bool draws_random_numbers() const { return draws_random_numbers_; }

 private:
  std::vector<KernelCall> calls_;
  bool draws_random_numbers_ = false;
};

// The table the calling thread's engine runs with (nullptr outside an engine call), set
// for the duration of a call by ActiveKernelCalls.
class ActiveKernelCalls {
 public:
  explicit ActiveKernelCalls(const KernelCallTable* table);
  ~ActiveKernelCalls();
  ActiveKernelCalls(const ActiveKernelCalls&) = delete;
  ActiveKernelCalls& operator=(const ActiveKernelCalls&) = delete;

 private:
  const KernelCallTable* previous_;
};

// Results of kernel calls in this process that the op made in the engine's buffer, and
// that were copied into it: {placed, copied} (tests).
std::pair<int64_t, int64_t> kernel_call_result_counts();

// Runs call `index` of the active table on `buffers`: its operands, then its results.
// A result is copied into the buffer the code allocated for it, except for calls that
// place it: those run with the buffer offered to PyTorch's CPU allocator (on this thread,
// for one allocation of exactly its size), so the op's own output is made in it and no
// copy is needed. Anything else that takes the offer (a temporary of the same size) only
// borrows the buffer for the call; the result made elsewhere is then copied as before.
void run_kernel_call(int64_t index, const BladeUnrankedMemRef* buffers, int64_t count);

}  // namespace blade::ral

// The parameters of blade_ral_kernel_call_<n>: n memrefs, m0 ... m<n-1>.
#define BLADE_RAL_BUFFERS_1 BLADE_RAL_MEMREF(m0)
#define BLADE_RAL_BUFFERS_2 BLADE_RAL_BUFFERS_1, BLADE_RAL_MEMREF(m1)
#define BLADE_RAL_BUFFERS_3 BLADE_RAL_BUFFERS_2, BLADE_RAL_MEMREF(m2)
#define BLADE_RAL_BUFFERS_4 BLADE_RAL_BUFFERS_3, BLADE_RAL_MEMREF(m3)
#define BLADE_RAL_BUFFERS_5 BLADE_RAL_BUFFERS_4, BLADE_RAL_MEMREF(m4)
#define BLADE_RAL_BUFFERS_6 BLADE_RAL_BUFFERS_5, BLADE_RAL_MEMREF(m5)
#define BLADE_RAL_BUFFERS_7 BLADE_RAL_BUFFERS_6, BLADE_RAL_MEMREF(m6)
#define BLADE_RAL_BUFFERS_8 BLADE_RAL_BUFFERS_7, BLADE_RAL_MEMREF(m7)
#define BLADE_RAL_BUFFERS_9 BLADE_RAL_BUFFERS_8, BLADE_RAL_MEMREF(m8)
#define BLADE_RAL_BUFFERS_10 BLADE_RAL_BUFFERS_9, BLADE_RAL_MEMREF(m9)
#define BLADE_RAL_BUFFERS_11 BLADE_RAL_BUFFERS_10, BLADE_RAL_MEMREF(m10)
#define BLADE_RAL_BUFFERS_12 BLADE_RAL_BUFFERS_11, BLADE_RAL_MEMREF(m11)
#define BLADE_RAL_FOR_EACH_BUFFER_COUNT(X) \
  X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)

extern "C" {
// Call `call` of the active table with its operands and results (python/blade/codegen/
// kernels/kernel_calls.py emits the calls; MAX_BUFFERS there is 12).
#define BLADE_RAL_DECLARE_KERNEL_CALL(n) \
  void blade_ral_kernel_call_##n(int64_t call, BLADE_RAL_BUFFERS_##n) noexcept;
BLADE_RAL_FOR_EACH_BUFFER_COUNT(BLADE_RAL_DECLARE_KERNEL_CALL)
#undef BLADE_RAL_DECLARE_KERNEL_CALL
}
