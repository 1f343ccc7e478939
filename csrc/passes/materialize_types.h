// materialize_types: gives every tensor value the dtype, rank, device and (when asked)
// sizes that it had when the graph ran on the example inputs.
//
// The graph may be run on several sets of inputs (the example inputs and, for dynamic
// shapes, copies resized along the dimensions that vary): a dimension that had different
// sizes gets a shape symbol instead of a size, and dimensions that had the same sizes in
// every run share a symbol, so the types say which dynamic dimensions are equal.
//
// The types are recorded, not inferred: the graph is instrumented with
// blade::observe_type nodes, run once by the interpreter on the inputs, and the
// instrumentation is removed. (PyTorch's own prim::profile nodes cannot be created from
// outside libtorch: ProfileOp is not exported.) A value observed with different shapes (in a loop, say)
// keeps only what all observations agree on (with static_shapes, as shape symbols). Values the run never reaches keep the plain
// `Tensor` type, and so are never clustered.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <ATen/core/ivalue.h>

#include <vector>

namespace blade::passes {

// Each of `runs` is one set of the graph's inputs, the module itself first for a method
// graph. Returns the number of tensor values whose type was materialized. When
// `first_outputs` is given, it receives what the graph returned on `runs[0]` (the engine
// check compares engines that compute the graph's results with them: see
// blade/self_check.py).
int64_t materialize_types(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<std::vector<c10::IValue>>& runs, bool static_shapes,
                          std::vector<c10::IValue>* first_outputs = nullptr);

}  // namespace blade::passes
