// cluster_supported_nodes: merges the nodes the converter registry accepts into clusters.
//
// Guarantees:
//  - no cycles: a node joins a cluster only when AliasDb can move it next to the cluster
//    without breaking a data dependency or reordering a memory effect, so no cluster ever
//    depends on itself through an outside node;
//  - every block is clustered, recursing into prim::If and prim::Loop bodies; a cluster
//    never spans blocks;
//  - only tensors cross a cluster's boundary: non-tensor constants used inside are cloned
//    into it, and a cluster that would still take or give a non-tensor is dissolved;
//  - an output that is a view (by its op's schema) of an input or of another output is
//    made again after the cluster node, from the engine's results and inputs, by a clone
//    of the view (an edge view, carrying the attribute `blade_edge_view_of` = the
//    cluster's `blade_cluster_id`), so eager's aliasing is kept and the work around the
//    view stays inside; the ops of views that no longer run inside are listed in the
//    cluster's `blade_edge_ops` (they count as the engine's). Other producers that may
//    alias move out with their users; one whose schema promises a fresh result never does;
//  - clusters with fewer than `min_compute_ops` compute nodes, counted after the outputs
//    that alias an input or each other moved out, are dissolved; one with none never
//    stays (it would only copy its inputs);
//  - every op (a non-prim node with a tensor output) left outside a cluster after being
//    put in one is named in `dissolved`, with the reason.
// Each cluster is a node of kind prim::FunctionalGraph whose `Subgraph` attribute holds
// the nodes (the kind AliasDb already analyses as a pure subgraph).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace blade::passes {

struct ClusterOptions {
  std::unordered_set<torch::jit::Node*> supported;  // nodes that may join a cluster
  std::unordered_set<torch::jit::Node*> compute;    // those that count towards the size
  int64_t min_compute_ops = 1;
};

struct DissolvedCluster {
  std::vector<std::string> node_kinds;  // the ops (by overload, `aten::add.Tensor`) left out
  std::string reason;
};

struct ClusterResult {
  std::vector<torch::jit::Node*> clusters;
  std::vector<DissolvedCluster> dissolved;
};

ClusterResult cluster_supported_nodes(const std::shared_ptr<torch::jit::Graph>& graph,
                                      const ClusterOptions& options);

// The kind of the nodes cluster_supported_nodes creates.
c10::Symbol cluster_kind();

// Moves a cluster's nodes back into the graph and removes the cluster node. Returns the
// moved nodes in the order of the cluster's subgraph (constants included), so the k-th
// node of the subgraph is the k-th one returned, followed by the cluster's edge views
// (plain nodes again).
std::vector<torch::jit::Node*> dissolve_cluster(torch::jit::Node* cluster);

}  // namespace blade::passes
