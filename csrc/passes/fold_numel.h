// `x.numel()` of a tensor whose sizes are all known (static shapes, from
// materialize_types) becomes a constant.
//
//   %n : int = aten::numel(%x)     ==>    %n : int = prim::Constant[value=24]()
//
// PyTorch's shape peepholes fold size(), dim(), dtype and device of complete tensor types,
// but not numel, which `x.view(x.numel() // d, d)` style reshapes use. Values with an
// unknown (dynamic) dim are left alone.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many numel() calls were folded.
int fold_numel(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
