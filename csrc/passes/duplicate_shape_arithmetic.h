// duplicate_shape_arithmetic: every use of a size computed at run time gets its own copy
// of the computation.
//
//   %b = aten::size(%x, 0)                 %b1 = aten::size(%x, 0)
//   %n = aten::mul(%b, %c12)        ==>    %n1 = aten::mul(%b1, %c12); aten::view(%q, [%n1, ...])
//   aten::view(%q, [%n, ...])              %b2 = aten::size(%x, 0)
//   aten::view(%k, [%b, ...])              aten::view(%k, [%b2, ...])
//
// With dynamic shapes, reshapes take sizes computed from `size()` of a dynamic dim. Only
// tensors may cross a cluster's boundary, so a cluster can use such a size only if it
// computes it itself; one shared computation would tie every user to one cluster (or
// dissolve it). Sizes are cheap integer arithmetic on the tensors' metadata, so each use
// gets a private chain that its cluster absorbs. The same holds for floats computed from
// sizes (the scale 1 / sqrt(q.size(-1)) of attention with a dynamic head dim), which an
// elementwise op takes as its scalar. Run just before clustering (CSE would
// merge the copies back).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Whether `node` computes a number from tensor sizes and constants only:
// aten::size(Tensor, int), int add/sub/mul/floordiv/neg of such ints, and the float
// arithmetic on them that Torch-MLIR lowers (conversion to float, sqrt of an int, true
// division, float add/sub/mul).
bool is_shape_arithmetic(const torch::jit::Node* node);

// Returns how many nodes were copied.
int duplicate_shape_arithmetic(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
