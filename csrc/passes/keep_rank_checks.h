// Eager's rank checks and BatchNorm's channel axis, kept through freezing.
//
// Two of freezing's optimizations assume a batched input, and are wrong without one:
// - PyTorch's alias-sensitive peephole replaces `dim()` of a conv1d/conv2d/conv3d result
//   with 3/4/5, so BatchNorm2d's `expected 4D input` check after an unbatched conv2d
//   (which takes and returns 3-D) is folded away and the model answers where eager raises.
//   A convolution's result has its input's rank: reading the input's rank keeps the check
//   exact, and leaves the result with its one use, so Conv->BatchNorm still folds.
// - Conv/Linear->BatchNorm folding scales the op's output channels, while batch_norm reads
//   dim 1 as channels: the same only for a batched input. BatchNorm1d takes 2-D and 3-D, so
//   after an unbatched conv1d, or a Linear given 3-D, eager normalizes another axis (or
//   raises). Those pairs get a fold barrier, removed again once the module is frozen; a
//   pair whose BatchNorm first checks the exact batched rank (BatchNorm2d/3d) still folds.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

struct RankCheckCounts {
  int64_t rank_reads = 0;  // dim() reads moved from a convolution's result to its input
  int64_t barriers = 0;    // BatchNorms kept from folding
};

// Both rewrites above on an inlined graph.
RankCheckCounts keep_rank_checks(const std::shared_ptr<torch::jit::Graph>& graph);

// A copy of `module` to freeze: its own types and methods over the same tensors, with
// forward inlined and keep_rank_checks applied. The module itself is left as it was.
torch::jit::Module copy_keeping_rank_checks(const torch::jit::Module& module);

// Removes the fold barriers from a frozen graph; returns how many.
int remove_fold_barriers(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
