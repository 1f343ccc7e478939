// Rewrites every call of one op in terms of other ops: the body of a TorchScript function
// (the user's `blade.register_decomposition`, or one of Blade's own) is inlined in place of
// each node calling that overload.
//
//   %r = aten::logsumexp(%x, %dims, %keep)     ==>   %m = aten::amax(%x, %dims, true)
//                                                    ...  (the function's graph, its inputs
//                                                         bound to the node's inputs)
//
// PyTorch's decompositions live in Python (torch._decomp) and work on FX graphs; the
// TorchScript ones (torch.jit._shape_functions and friends) cover shapes only, so this pass
// is our own. It runs before types are materialized, so the inlined ops get their types
// from the example run like everything else. Nodes inside the inlined bodies are never
// rewritten again in the same call, so a decomposition may call the op it decomposes.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// `overload` is "ns::name" or "ns::name.overload", as `schema_name` in Python spells it.
// `body` takes the op's arguments in schema order and returns its results. Only the nodes
// whose results at `unused_results` have no uses are rewritten (a body may return a
// stand-in for a result nobody reads: nn.MultiheadAttention's fast path leaves its
// attention weights undefined, which a TorchScript function cannot return). Returns how
// many nodes were rewritten. Throws, rewriting nothing, when `body` does not fit the op.
int decompose(const std::shared_ptr<torch::jit::Graph>& graph, const std::string& overload,
              const std::shared_ptr<torch::jit::Graph>& body,
              const std::vector<int64_t>& unused_results = {});

}  // namespace blade::passes
