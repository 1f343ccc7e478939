// The C ABI between generated code and the runtime, declared in one place.
//
// Generated code is linked against libblade_ral and calls only these symbols (plus libc
// and libm). Nothing here may throw: an exception cannot unwind through generated frames.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Memory for buffers the generated code allocates itself (intermediates, and the outputs
// of dynamic engines), from PyTorch's CPU allocator. Freed buffers are cached for the next
// allocations (see blade_ral_cached_bytes). The names are the ones MLIR's memref-to-LLVM
// lowering emits when asked for generic allocation functions (`use-generic-functions`).
void* _mlir_memref_to_llvm_alloc(size_t size);
void* _mlir_memref_to_llvm_aligned_alloc(size_t alignment, size_t size);
void _mlir_memref_to_llvm_free(void* ptr);

// Conversions to bfloat16 that LLVM lowers to compiler-rt routines; GCC 12's libgcc, which
// the engine's code is otherwise linked with, does not have them. The result is the
// bfloat16's bits in the register a 16-bit float is returned in (the same on x86-64 for
// _Float16 and bfloat16). Rounding is to nearest, ties to even, as PyTorch's.
#if defined(__x86_64__)
_Float16 __truncdfbf2(double value);
_Float16 __truncsfbf2(float value);
#endif

// Runs `task(begin, end, arguments)` over [0, extent) in chunks of at least `grain`, on
// PyTorch's intra-op thread pool (at::parallel_for: torch.get_num_threads() threads).
// python/blade/codegen/loops/parallel.py emits the calls; `arguments` are the task's memref descriptors.
void blade_ral_parallel_for(int64_t extent, int64_t grain,
                            void (*task)(int64_t, int64_t, void**), void** arguments);

// Bytes still allocated by generated code in this process; tests use it to prove that
// every intermediate buffer was released.
int64_t blade_ral_live_allocations(void);

// Bytes of freed buffers kept for reuse, a way to give them all back to PyTorch's
// allocator (blade.release_cached_memory()), and the most the cache may keep (default
// 1 GiB; 0 turns caching off; blade.set_cached_memory_limit()).
int64_t blade_ral_cached_bytes(void);
void blade_ral_release_cached_memory(void);
void blade_ral_set_cached_memory_limit(int64_t bytes);
}
