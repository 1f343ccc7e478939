// guard_specialization: the optimized graph runs only for inputs like the ones it was
// specialized to; any other input runs the model's graph from before specialization.
//
//   graph(%self, %x):                        graph(%self, %x):
//     <optimized body>                ==>      %g = prim::GetAttr[name=<guard>](%self)
//     return (%y)                              %ok = blade::guard_admits(%g, [%x])
//                                              %y = prim::If(%ok)
//                                                block0: <optimized body> -> (%y1)
//                                                block1: <unspecialized body> -> (%y2)
//                                              return (%y)
//
// Simplification folds the example inputs' sizes into the graph (size() calls, reshapes,
// split sizes), so the optimized graph is not the model for other shapes; neither are the
// engines' fallback subgraphs. The graph inputs lose their specialized types, so nothing
// later specializes the unspecialized branch again. The guard is given the inputs at
// `guarded` (positions in the graph's inputs: tensors, and optional tensors the graph was
// specialized to see as None), in that order.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

namespace blade::passes {

// `unspecialized` is a copy of the graph taken before any pass used the example inputs;
// its inputs match `graph`'s.
void guard_specialization(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::shared_ptr<torch::jit::Graph>& unspecialized,
                          const std::string& guard_attr, const std::vector<int64_t>& guarded);

}  // namespace blade::passes
