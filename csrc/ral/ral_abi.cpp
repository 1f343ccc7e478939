#include "ral/ral_abi.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

namespace {

// PyTorch's CPU allocator aligns every block to this many bytes.
constexpr size_t kAllocatorAlignment = 64;

// Every block starts with a header this large holding its capacity, so that a freed block
// can be cached by size; the generated code gets the memory after it (still aligned).
constexpr size_t kHeaderBytes = kAllocatorAlignment;

std::atomic<int64_t> live_allocations{0};

// Buffers that generated code freed, kept for its next allocations: an engine allocates
// the same intermediates on every call, and fresh memory costs a page fault per 4 KiB
// page (the kernel zeroes each one) every time. A request takes the smallest cached block
// that holds it and is at most twice its size. The cache holds at most 1 GiB by default
// (blade_ral_set_cached_memory_limit); beyond that, freed blocks go back to PyTorch's
// allocator, as do all of them on blade_ral_release_cached_memory().
class BufferCache {
 public:
  void* take(size_t capacity_needed) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.lower_bound(capacity_needed);
    if (it == blocks_.end() || it->first / 2 > capacity_needed) {
      return nullptr;
    }
    void* block = it->second;
    cached_bytes_ -= it->first;
    blocks_.erase(it);
    return block;
  }

  // False when the cache is full: the caller frees the block.
  bool keep(void* block, size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_bytes_ + capacity > limit_) {
      return false;
    }
    blocks_.emplace(capacity, block);
    cached_bytes_ += capacity;
    return true;
  }

  // Sets the most the cache keeps; returns the blocks that no longer fit (largest first),
  // for the caller to free. A limit of 0 empties it.
  std::vector<void*> set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
    std::vector<void*> evicted;
    while (cached_bytes_ > limit_) {
      auto largest = std::prev(blocks_.end());
      cached_bytes_ -= largest->first;
      evicted.push_back(largest->second);
      blocks_.erase(largest);
    }
    return evicted;
  }

  std::vector<void*> take_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<void*> all;
    all.reserve(blocks_.size());
    for (const auto& entry : blocks_) {
      all.push_back(entry.second);
    }
    blocks_.clear();
    cached_bytes_ = 0;
    return all;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> blocks_;  // capacity -> block (header included)
  size_t cached_bytes_ = 0;
  size_t limit_ = size_t{1} << 30;
};

// Never destroyed: engines may free buffers while static objects are being torn down.
BufferCache& cache() {
  static auto* instance = new BufferCache();
  return *instance;
}

void* allocate(size_t size) noexcept {
  try {
    const size_t capacity = kHeaderBytes + (size == 0 ? 1 : size);
    void* block = cache().take(capacity);
    if (block == nullptr) {
      block = c10::GetCPUAllocator()->raw_allocate(capacity);
      *static_cast<size_t*>(block) = capacity;
    }
    live_allocations.fetch_add(1, std::memory_order_relaxed);
    return static_cast<char*>(block) + kHeaderBytes;
  } catch (...) {
    return nullptr;
  }
}

void free_blocks(const std::vector<void*>& blocks) {
  for (void* block : blocks) {
    c10::GetCPUAllocator()->raw_deallocate(block);
  }
}

void deallocate(void* ptr) noexcept {
  void* block = static_cast<char*>(ptr) - kHeaderBytes;
  const size_t capacity = *static_cast<size_t*>(block);
  bool kept = false;
  try {
    kept = cache().keep(block, capacity);
  } catch (...) {  // no memory for the cache's own bookkeeping: free the block instead
  }
  if (!kept) {
    c10::GetCPUAllocator()->raw_deallocate(block);
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
  deallocate(ptr);
}

int64_t blade_ral_live_allocations(void) { return live_allocations.load(); }

int64_t blade_ral_cached_bytes(void) { return static_cast<int64_t>(cache().cached_bytes()); }

void blade_ral_release_cached_memory(void) { free_blocks(cache().take_all()); }

void blade_ral_set_cached_memory_limit(int64_t bytes) {
  free_blocks(cache().set_limit(bytes > 0 ? static_cast<size_t>(bytes) : 0));
}
}
