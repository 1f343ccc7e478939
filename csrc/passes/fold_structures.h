// Static folding of Python containers that never escape: dicts with constant keys and
// lists grown by `append`, in straight-line code (after loops with constant trip counts
// have been unrolled).
//
//   %d = prim::DictConstruct("a", %x, "b", %y)          (gone)
//   aten::_set_item(%d, "c", %z)                  ==>   (gone)
//   %v = aten::__getitem__(%d, "c")                     uses of %v use %z
//
//   %l = prim::ListConstruct(%a)                        %l = prim::ListConstruct(%a)
//   aten::append(%l, %b)                          ==>   %l2 = prim::ListConstruct(%a, %b)
//   %r = aten::cat(%l, 0)                               %r = aten::cat(%l2, 0)
//
// PyTorch's list peepholes (`PeepholeOptimizeListIdioms`) fold len/getitem/slice of lists
// that are never mutated, and nothing in PyTorch folds dicts; this pass removes the
// mutations first. A container is folded only when every use is in the block that built
// it, every key is a constant, and every other use only reads it (its schema argument
// carries no alias annotation, i.e. it neither writes nor stores the container);
// otherwise it is left alone.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many containers were folded.
int fold_structures(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
