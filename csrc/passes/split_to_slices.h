// Splits whose pieces are unpacked right away become one slice per piece.
//
//   %parts : Tensor[] = aten::split(%x, 64, 2)          %q = aten::slice(%x, 2, 0, 64, 1)
//   %q, %k, %v = prim::ListUnpack(%parts)        ==>    %k = aten::slice(%x, 2, 64, 128, 1)
//                                                       %v = aten::slice(%x, 2, 128, 192, 1)
//
// Covers aten::split.Tensor, aten::split.sizes, aten::split_with_sizes, aten::chunk,
// prim::ConstantChunk and aten::unbind.int (pieces become aten::select). A Tensor[] hides its elements from alias
// analysis, so without this a list between two compiled ops splits their cluster in two.
// PyTorch's own passes leave these lists alone. A split is rewritten only when its list has
// exactly one use, a prim::ListUnpack, and the size of the split dim is known (static
// shape, from materialize_types) and consistent with the pieces; otherwise it is untouched.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many splits were rewritten.
int split_to_slices(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
