#include "ral/ral_abi.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace {

// PyTorch's CPU allocator aligns every block to this many bytes.
constexpr size_t kAllocatorAlignment = 64;

std::atomic<int64_t> live_allocations{0};

void* allocate(size_t size) noexcept {
  try {
    void* ptr = c10::GetCPUAllocator()->raw_allocate(size == 0 ? 1 : size);
    live_allocations.fetch_add(1, std::memory_order_relaxed);
    return ptr;
  } catch (...) {
    return nullptr;
  }
}

#if defined(__x86_64__)
// `value` rounded to bfloat16 (8 significant bits, float32's exponent range), as bits.
uint16_t to_bfloat16_bits(double value) {
  if (std::isnan(value)) {
    return std::signbit(value) ? 0xFFC0 : 0x7FC0;
  }
  double rounded = value;
  if (std::isfinite(value) && value != 0.0) {
    int exponent = 0;
    std::frexp(value, &exponent);  // value = m * 2^exponent, 0.5 <= |m| < 1
    // The weight of the last kept bit; bfloat16 subnormals have a fixed one (2^-133).
    const int quantum = std::max(exponent - 8, -133);
    rounded = std::ldexp(std::nearbyint(std::ldexp(value, -quantum)), quantum);
  }
  // Exact (or overflowing to infinity, as it must) now that 8 bits remain.
  const float narrowed = static_cast<float>(rounded);
  uint32_t bits = 0;
  std::memcpy(&bits, &narrowed, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

_Float16 as_half_register(uint16_t bits) {
  _Float16 result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}
#endif

}  // namespace

extern "C" {

#if defined(__x86_64__)
_Float16 __truncdfbf2(double value) { return as_half_register(to_bfloat16_bits(value)); }
_Float16 __truncsfbf2(float value) { return as_half_register(to_bfloat16_bits(value)); }
#endif

void* _mlir_memref_to_llvm_alloc(size_t size) { return allocate(size); }

void* _mlir_memref_to_llvm_aligned_alloc(size_t alignment, size_t size) {
  // The allocator's own alignment covers every alignment MLIR asks for on CPU; a larger
  // one would be a code generation bug, and returning null makes it fail loudly.
  if (alignment > kAllocatorAlignment) {
    return nullptr;
  }
  return allocate(size);
}

void _mlir_memref_to_llvm_free(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  live_allocations.fetch_sub(1, std::memory_order_relaxed);
  c10::GetCPUAllocator()->raw_deallocate(ptr);
}

int64_t blade_ral_live_allocations(void) { return live_allocations.load(); }
}
