// What the model cache (python/blade/model_cache.py) reads of a graph: the kinds of its
// nodes, to key a model, and the tensor constants of an optimized module's graph and of the
// functions it calls (outlined branches, passes/outline_branches.h, hold copies of the
// constants their branch read), which it writes without the model's weights and puts back
// after loading.
//
//   node_kinds: the distinct kinds of the nodes of a graph, its blocks and the subgraphs
//     its nodes hold (prim::fork's, say), sorted.
//   tensors_in_containers: how many tensors the list, tuple, dict and object constants of a
//     graph and of the functions it calls hold (freezing leaves such a constant where it
//     cannot fold a read of a list attribute of tensors).
//   tensor_constants: every prim::Constant holding a tensor, in the graph, its blocks and
//     the graphs of the functions it calls through prim::CallFunction (each function once,
//     and the functions they call), in that walk's order.
//   set_tensor_constants: gives those constants, in the same order, the tensors of
//     `values`; with `retype`, each gets its tensor's complete type (dtype, sizes,
//     strides), as freezing types a constant, else keeps its type.
//
// And what the compiler removes of an optimized module:
//
//   remove_attribute: takes the attribute `name` off every module of `instances` (all the
//     modules of one class type) and off their class type, as freezing removes attributes
//     no method reads; false when the type has no such attribute or a module of
//     `instances` is of another type.
#pragma once

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>
#include <vector>

namespace blade::passes {

std::vector<std::string> node_kinds(const std::shared_ptr<torch::jit::Graph>& graph);

int64_t tensors_in_containers(const std::shared_ptr<torch::jit::Graph>& graph);

std::vector<at::Tensor> tensor_constants(const std::shared_ptr<torch::jit::Graph>& graph);

void set_tensor_constants(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<at::Tensor>& values, bool retype);

bool remove_attribute(const std::vector<torch::jit::Module>& instances, const std::string& name);

}  // namespace blade::passes
