// Turning a cluster into an engine call, and the pieces of a cluster an engine keeps.
//
//   lift_tensor_constants: tensor constants inside a cluster become trailing subgraph
//     inputs; the engine holds their values (params) and passes them on every call, so
//     weights are neither baked into the code nor printed into the fallback IR.
//   fallback_ir: the subgraph as parseable IR text with shape-free tensor types, so the
//     fallback runs correctly on any input the engine refuses.
//   replace_cluster_with_engine: the cluster node becomes
//     prim::GetAttr[name=<attr>](self) -> blade::execute(engine, [inputs]) -> ListUnpack.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

namespace blade::passes {

std::vector<at::Tensor> lift_tensor_constants(const std::shared_ptr<torch::jit::Graph>& subgraph);

std::string fallback_ir(const std::shared_ptr<torch::jit::Graph>& subgraph);

void replace_cluster_with_engine(torch::jit::Node* cluster, const std::string& attr_name);

}  // namespace blade::passes
