// A kernel that calls a PyTorch op writing a fresh tensor can have that tensor made in the
// engine's own buffer instead of copying it there: the buffer is offered to PyTorch's CPU
// allocator, on this thread, for the next allocation of exactly its size.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace blade::ral {

// Installs the offering wrapper of PyTorch's CPU allocator, once; false where another
// allocator of higher priority is PyTorch's (offers are then never taken).
bool offering_installed();

// Offers `out`'s memory for the duration of a scope; withdrawn at its end if not taken.
// Whatever takes it (the op's result, or a temporary of the same size that only borrows
// it) does not own it: freeing that tensor frees nothing.
class ScopedOffer {
 public:
  explicit ScopedOffer(const at::Tensor& out);
  ~ScopedOffer();
  ScopedOffer(const ScopedOffer&) = delete;
  ScopedOffer& operator=(const ScopedOffer&) = delete;
};

// In its scope no allocation takes this thread's offer, which stands again after: for
// work before the result is made that allocates raw memory (oneDNN's packing of a weight),
// which fails on an offered buffer rather than refusing it.
class SuspendedOffer {
 public:
  SuspendedOffer();
  ~SuspendedOffer();
  SuspendedOffer(const SuspendedOffer&) = delete;
  SuspendedOffer& operator=(const SuspendedOffer&) = delete;

 private:
  void* data_;
  size_t bytes_;
};

// Makes `out` hold `result` (of its dtype and sizes), the result of an op that was offered
// out's memory: nothing to do when the op made it there laid out as out is (returns
// true), else `copy(out, result)`, through a clone when it lies in out's memory in another
// layout (out is then both source and destination).
using CopyInto = void (*)(at::Tensor& out, const at::Tensor& result);
bool settle(const at::Tensor& result, at::Tensor& out, CopyInto copy);

// The copy settle makes by default: ATen's copy_.
void copy_into(at::Tensor& out, const at::Tensor& result);

// Results that settle found made in place, and that it copied, in this process (the
// convolutions' and the int8 kernel calls'): {placed, copied} (tests).
std::pair<int64_t, int64_t> settled_result_counts();

}  // namespace blade::ral
