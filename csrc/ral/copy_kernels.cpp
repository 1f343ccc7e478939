// memrefCopy (ral_kernels.h): what MLIR's memref.copy between non-contiguous memrefs
// lowers to.
#include "ral/ral_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace blade::ral {
namespace {

// Copies `rank`-dimensional strided data (sizes/strides in elements) whose innermost
// elements form contiguous runs of `run_bytes` on both sides: one memcpy per run.
void copy_runs(const char* src, char* dst, const int64_t* sizes, const int64_t* src_strides,
               const int64_t* dst_strides, int64_t rank, int64_t element_size,
               size_t run_bytes) {
  if (rank == 0) {
    std::memcpy(dst, src, run_bytes);
    return;
  }
  for (int64_t i = 0; i < sizes[0]; ++i) {
    copy_runs(src + i * src_strides[0] * element_size, dst + i * dst_strides[0] * element_size,
              sizes + 1, src_strides + 1, dst_strides + 1, rank - 1, element_size, run_bytes);
  }
}

// Below this many bytes a copy runs on the calling thread: splitting it costs more than it
// saves.
constexpr int64_t kParallelCopyBytes = 256 * 1024;

// What memref.copy lowers to (a padded pooling input, a slice written into a
// concatenation). The innermost dims both sides store contiguously are merged into runs
// copied with memcpy, and a large copy is split over the intra-op threads along its
// outermost two dims (or, when all of it is one run, into equal chunks): copied one element
// at a time on one thread, the pad copy of a max pooling was a visible share of a model.
void strided_copy(const char* src, char* dst, const int64_t* sizes, const int64_t* src_strides,
                  const int64_t* dst_strides, int64_t rank, int64_t element_size) {
  int64_t run = 1;  // elements per contiguous run
  int64_t outer_rank = rank;
  while (outer_rank > 0 && src_strides[outer_rank - 1] == run &&
         dst_strides[outer_rank - 1] == run) {
    run *= sizes[outer_rank - 1];
    --outer_rank;
  }
  int64_t total = run * element_size;
  for (int64_t d = 0; d < outer_rank; ++d) {
    total *= sizes[d];
  }
  const size_t run_bytes = static_cast<size_t>(run * element_size);
  if (total < kParallelCopyBytes || at::in_parallel_region()) {
    copy_runs(src, dst, sizes, src_strides, dst_strides, outer_rank, element_size, run_bytes);
    return;
  }
  if (outer_rank == 0) {  // one contiguous run: equal chunks
    const int64_t chunk = kParallelCopyBytes / 4;
    at::parallel_for(0, (total + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
      const int64_t from = begin * chunk;
      const int64_t to = std::min(total, end * chunk);
      std::memcpy(dst + from, src + from, static_cast<size_t>(to - from));
    });
    return;
  }
  // Tasks over the outermost two dims, so that a batch of one still splits.
  const int64_t inner = outer_rank >= 2 ? sizes[1] : 1;
  const int64_t split_rank = outer_rank >= 2 ? 2 : 1;
  at::parallel_for(0, sizes[0] * inner, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t src_offset = (i / inner) * src_strides[0] +
                                 (split_rank == 2 ? (i % inner) * src_strides[1] : 0);
      const int64_t dst_offset = (i / inner) * dst_strides[0] +
                                 (split_rank == 2 ? (i % inner) * dst_strides[1] : 0);
      copy_runs(src + src_offset * element_size, dst + dst_offset * element_size,
                sizes + split_rank, src_strides + split_rank, dst_strides + split_rank,
                outer_rank - split_rank, element_size, run_bytes);
    }
  });
}

}  // namespace
}  // namespace blade::ral

extern "C" {

void memrefCopy(int64_t element_size, BladeUnrankedMemRef* source,
                BladeUnrankedMemRef* target) {
  const auto* s = static_cast<const int64_t*>(source->descriptor);
  const auto* t = static_cast<const int64_t*>(target->descriptor);
  const int64_t rank = source->rank;
  const char* src = reinterpret_cast<const char*>(s[1]) + s[2] * element_size;
  char* dst = reinterpret_cast<char*>(t[1]) + t[2] * element_size;
  for (int64_t k = 0; k < rank; ++k) {
    if (s[3 + k] == 0) {
      return;  // nothing to copy
    }
  }
  blade::ral::strided_copy(src, dst, s + 3, s + 3 + rank, t + 3 + rank, rank, element_size);
}
}
