// The C ABI between generated code and the runtime, declared in one place.
//
// Generated code is linked against libblade_ral and calls only these symbols (plus libc
// and libm). Nothing here may throw: an exception cannot unwind through generated frames.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// Memory for buffers the generated code allocates itself (intermediates), from PyTorch's
// CPU allocator. The names are the ones MLIR's memref-to-LLVM lowering emits when asked
// for generic allocation functions (`use-generic-functions`).
void* _mlir_memref_to_llvm_alloc(size_t size);
void* _mlir_memref_to_llvm_aligned_alloc(size_t alignment, size_t size);
void _mlir_memref_to_llvm_free(void* ptr);

// Bytes still allocated by generated code in this process; tests use it to prove that
// every intermediate buffer was released.
int64_t blade_ral_live_allocations(void);
}
