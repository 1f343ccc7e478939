// fold_sizes: sizes of tensors whose dims are partly known (dynamic shapes) fold as far
// as they can.
//
//   %n : int = aten::size(%x, %c2)     ==>  %n : int = prim::Constant[value=768]()
//                                            (dim 2 of %x is static)
//   %s : int[] = aten::size(%x)        ==>  %s : int[] = prim::ListConstruct(%b, %t, %c768)
//                                            with %b = aten::size(%x, 0), ... for dynamic dims
//
// PyTorch's shape peepholes fold size() only when every dim is known. With dynamic dims,
// `b, t, c = x.shape` must still give a constant `c`, so that the arithmetic on it folds,
// and `b` and `t` must become per-dim sizes that a cluster can compute from its inputs.
// The size of a dynamic dim is never folded. A size() with every dim known becomes a list
// of constants too, not one list constant as the peephole makes it (run this first): the
// list may be written (`s = x.shape; s[3] = 5`, which the peephole's constant would keep
// in its value while the run writes it).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many size() calls were rewritten.
int fold_sizes(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
