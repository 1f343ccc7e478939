// Writes into views of a fresh tensor become functional scatters.
//
//   %y = aten::mul(%x, %c)                          %y = aten::mul(%x, %c)
//   %a = aten::slice(%y, 0, None, None, 1)          %a = aten::slice(%y, 0, None, None, 1)
//   %b = aten::slice(%a, 1, None, 2, 1)       ==>   %b = aten::slice(%a, 1, None, 2, 1)
//   aten::copy_(%b, %src, false)                    %s = expand_as(type_as(%src, %b), %b)
//   ... uses of %y ...                              %a2 = aten::slice_scatter(%a, %s, 1, None, 2, 1)
//                                                   %y2 = aten::slice_scatter(%y, %a2, 0, None, None, 1)
//                                                   ... uses of %y2 ...
//
// `x[:, :2] = v`, `x[0] = v` and `x[1:].fill_(v)` in scripted code are such writes:
// aten::copy_ or aten::fill_ into a chain of aten::slice / aten::select views. PyTorch's
// RemoveMutation only rewrites in-place ops applied to a fresh value itself, not writes
// through views, hence this pass. A write is rewritten only when it is provably the only
// way the base changes and nothing observes the old aliasing: the base is a fresh tensor
// made in the same block (not an input, not itself a view), every view in the chain has a
// single use, the write's result is unused, and any other view of the base taken before
// the write is used only before it (views taken after it read the new value, so writes
// through several slices of one tensor are rewritten in turn). Otherwise the mutation
// stays, and its node is not compiled.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many writes were rewritten.
int functionalize_view_writes(const std::shared_ptr<torch::jit::Graph>& graph);

// The pieces of the rewrite, shared with functionalize_input_writes.
namespace view_writes {

// Whether `node` calls exactly the overload `name`.`overload` ("" for the default one).
bool is_op(const torch::jit::Node* node, const char* name, const char* overload);
// aten::copy_, aten::fill_.Scalar or aten::fill_.Tensor.
bool is_write(const torch::jit::Node* node);
// What copy_/fill_ `write` writes, as a tensor of its destination's shape and dtype
// (inserted at the insertion point).
torch::jit::Value* written_value(torch::jit::Graph& graph, torch::jit::Node* write);

}  // namespace view_writes

}  // namespace blade::passes
