// Turning a cluster into an engine call, and the pieces of a cluster an engine keeps.
//
//   lift_tensor_constants: tensor constants inside a cluster become trailing subgraph
//     inputs; the engine holds their values (params) and passes them on every call, so
//     weights are neither baked into the code nor printed into the fallback IR.
//   fallback_ir: the subgraph as parseable IR text with shape-free tensor types, so the
//     fallback runs correctly on any input the engine refuses.
//   absorbable_write_backs: the blade::write_back nodes (passes/functionalize_input_writes.h)
//     of a cluster's output into one of its inputs that its engine can do instead: their
//     result unused, the types such that the write cannot fail for the sizes (equal
//     shapes, a dtype that casts), and AliasDb letting them move to right after the
//     cluster, where they are moved.
//   replace_cluster_with_engine: the cluster node becomes
//     prim::GetAttr[name=<attr>](self) -> blade::execute(engine, [inputs]) -> ListUnpack;
//     with `writes` (absorbable_write_backs' pairs, given to the engine too) the call is
//     blade::execute_writing, which AliasDb takes to write into its inputs, and those
//     write-back nodes go.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <utility>
#include <vector>

namespace blade::passes {

std::vector<at::Tensor> lift_tensor_constants(const std::shared_ptr<torch::jit::Graph>& subgraph);

std::string fallback_ir(const std::shared_ptr<torch::jit::Graph>& subgraph);

std::vector<std::pair<int64_t, int64_t>> absorbable_write_backs(torch::jit::Node* cluster);

void replace_cluster_with_engine(torch::jit::Node* cluster, const std::string& attr_name,
                                 const std::vector<std::pair<int64_t, int64_t>>& writes);

}  // namespace blade::passes
