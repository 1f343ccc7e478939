// The tensor constants of a method's graph and of the functions it calls (outlined branches,
// passes/outline_branches.h, hold copies of the constants their branch read), for the
// model cache (python/blade/model_cache.py), which writes an optimized module without the
// model's weights and puts them back after loading it.
//
//   tensor_constants: every prim::Constant holding a tensor, in the graph, its blocks and
//     the graphs of the functions it calls through prim::CallFunction (each function once,
//     and the functions they call), in that walk's order.
//   set_tensor_constants: gives those constants, in the same order, the tensors of
//     `values`; with `retype`, each gets its tensor's complete type (dtype, sizes,
//     strides), as freezing types a constant, else keeps its type.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <vector>

namespace blade::passes {

std::vector<at::Tensor> tensor_constants(const std::shared_ptr<torch::jit::Graph>& graph);

void set_tensor_constants(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<at::Tensor>& values, bool retype);

}  // namespace blade::passes
