#include "ral/ral_abi.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

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

}  // namespace

extern "C" {

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
