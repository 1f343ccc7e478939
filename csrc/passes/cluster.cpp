#include "passes/cluster.h"

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include <algorithm>
#include <iterator>

namespace blade::passes {
namespace {

using torch::jit::AliasDb;
using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;
namespace SubgraphUtils = torch::jit::SubgraphUtils;

bool is_tensor(const Value* v) {
  return v->type()->kind() == c10::TypeKind::TensorType;
}

// Compute nodes carry this attribute while clustering: merging clones nodes into the
// cluster's subgraph, and unmerging clones them back out, and attributes go with the
// clones, so a cluster's compute ops can be counted after outputs were moved out of it.
c10::Symbol compute_marker() {
  static const c10::Symbol marker = c10::Symbol::attr("blade_compute");
  return marker;
}

bool is_compute(const Node* n) {
  return n->hasAttribute(compute_marker());
}

// What the report counts as an op: a non-prim node with a tensor output, by its overload.
bool is_reported_op(const Node* n) {
  if (n->kind().is_prim()) {
    return false;
  }
  const auto outputs = n->outputs();
  return std::any_of(outputs.begin(), outputs.end(), is_tensor);
}

std::string op_name(const Node* n) {
  if (const auto* schema = n->maybeSchema()) {
    const auto& op = schema->operator_name();
    return op.overload_name.empty() ? op.name : op.name + "." + op.overload_name;
  }
  return n->kind().toQualString();
}

void clear_compute_markers(Block* block) {
  for (Node* n : block->nodes()) {
    if (is_compute(n)) {
      n->removeAttribute(compute_marker());
    }
    for (Block* sub : n->blocks()) {
      clear_compute_markers(sub);
    }
    if (n->hasAttribute(c10::attr::Subgraph)) {
      clear_compute_markers(n->g(c10::attr::Subgraph)->block());
    }
  }
}

// Whether `n` draws random numbers, itself or through a block or subgraph it holds.
bool draws_random_numbers(const Node* n) {
  if (n->isNondeterministic()) {
    return true;
  }
  std::vector<const Block*> blocks(n->blocks().begin(), n->blocks().end());
  if (n->hasAttribute(c10::attr::Subgraph)) {
    blocks.push_back(n->g(c10::attr::Subgraph)->block());
  }
  for (const Block* block : blocks) {
    for (const Node* inner : block->nodes()) {
      if (draws_random_numbers(inner)) {
        return true;
      }
    }
  }
  return false;
}

class Clusterer {
 public:
  Clusterer(const std::shared_ptr<torch::jit::Graph>& graph, const ClusterOptions& options)
      : graph_(graph), options_(options), alias_db_(std::make_unique<AliasDb>(graph)) {
    for (Node* n : options_.compute) {
      n->i_(compute_marker(), 1);
    }
    for (const Node* n : graph->nodes()) {
      random_ = random_ || draws_random_numbers(n);
    }
  }

  ClusterResult run() {
    cluster_block(graph_->block());
    ClusterResult result;
    finalize_block(graph_->block(), result);
    clear_compute_markers(graph_->block());
    return result;
  }

 private:
  bool joinable(Node* n) const {
    return n->kind() == cluster_kind() || options_.supported.count(n) > 0;
  }

  void cluster_block(Block* block) {
    for (Node* n : block->nodes()) {
      for (Block* sub : n->blocks()) {
        cluster_block(sub);
      }
    }
    // Walk backwards, letting each cluster absorb its producers, until nothing changes.
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto it = block->nodes().rbegin(); it != block->nodes().rend();) {
        auto [next, merged] = visit(*it);
        it = next;
        changed |= merged;
      }
    }
  }

  std::pair<torch::jit::graph_node_list_iterator, bool> visit(Node* consumer) {
    if (!joinable(consumer)) {
      return {++consumer->reverseIterator(), false};
    }
    if (consumer->kind() != cluster_kind()) {
      // Only a tensor op starts a cluster. Size arithmetic joins the one that uses it;
      // a chain of it used only outside (a check that a size is not 1, say) would start a
      // cluster that pulls in the ops producing the tensor it measures, and then have to
      // pass an int out, dissolving them all.
      const auto outputs = consumer->outputs();
      if (std::none_of(outputs.begin(), outputs.end(), is_tensor)) {
        return {++consumer->reverseIterator(), false};
      }
      consumer = SubgraphUtils::createSingletonSubgraphAndUpdateAliasing(consumer, cluster_kind(),
                                                                         *alias_db_);
    }
    // Try producers from the latest to the earliest, as they are the cheapest to move.
    std::vector<Node*> producers;
    for (Value* input : consumer->inputs()) {
      Node* p = input->node();
      if (p->owningBlock() == consumer->owningBlock() && joinable(p) &&
          std::find(producers.begin(), producers.end(), p) == producers.end()) {
        producers.push_back(p);
      }
    }
    std::sort(producers.begin(), producers.end(),
              [](Node* a, Node* b) { return b->isBefore(a); });
    for (Node* producer : producers) {
      if (!only_tensors_escape(producer, consumer) || !keeps_random_order(producer, consumer)) {
        continue;
      }
      if (!alias_db_->moveBeforeTopologicallyValid(producer, consumer)) {
        continue;
      }
      SubgraphUtils::mergeNodeIntoSubgraphAndUpdateAliasing(producer, consumer, *alias_db_);
      return {consumer->reverseIterator(), true};
    }
    return {++consumer->reverseIterator(), false};
  }

  // Merging moves `producer`, and what uses it before `consumer`, down to `consumer`. With
  // two nodes that draw random numbers from there to `consumer`, their order could change,
  // and with it which numbers each draws: kernel calls draw from PyTorch's generator as
  // eager does (python/blade/partition/kernel_calls.py), so the graph's order is kept.
  bool keeps_random_order(Node* producer, Node* consumer) const {
    if (!random_) {
      return true;
    }
    int drawing = 0;
    for (Node* n = producer; n != consumer && drawing < 2; n = n->next()) {
      drawing += draws_random_numbers(n) ? 1 : 0;
    }
    return drawing < 2;
  }

  // A producer whose non-tensor outputs are used outside `consumer` would make a
  // non-tensor cross the cluster boundary.
  static bool only_tensors_escape(Node* producer, Node* consumer) {
    for (Value* out : producer->outputs()) {
      if (is_tensor(out)) {
        continue;
      }
      for (const auto& use : out->uses()) {
        if (use.user != consumer) {
          return false;
        }
      }
    }
    return true;
  }

  void finalize_block(Block* block, ClusterResult& result) {
    std::vector<Node*> clusters;
    for (Node* n : block->nodes()) {
      for (Block* sub : n->blocks()) {
        finalize_block(sub, result);
      }
      if (n->kind() == cluster_kind()) {
        clusters.push_back(n);
      }
    }
    for (Node* cluster : clusters) {
      // An engine returns fresh tensors: outputs that are views of the cluster's inputs, or
      // of each other, run outside it so that TorchScript keeps their aliasing.
      std::vector<std::string> before = reported_ops(cluster);
      SubgraphUtils::unmergeOutputsAlisingInputs(cluster);
      SubgraphUtils::unmergeAliasedOutputs(cluster);
      unmerge_view_outputs(cluster);
      std::vector<std::string> after = reported_ops(cluster);
      DissolvedCluster moved_out;
      std::set_difference(before.begin(), before.end(), after.begin(), after.end(),
                          std::back_inserter(moved_out.node_kinds));
      if (!moved_out.node_kinds.empty()) {
        moved_out.reason =
            "its result may be a view of its input or of another result (AliasDb), and an "
            "engine returns fresh tensors, so it stays outside the engine";
        result.dissolved.push_back(std::move(moved_out));
      }
      // Counted after the outputs moved out: an engine without a compute op would only
      // copy its inputs (a cast to the dtype its input has, say), so none is made.
      int64_t compute_ops = 0;
      for (Node* inner : cluster->g(c10::attr::Subgraph)->nodes()) {
        compute_ops += is_compute(inner) ? 1 : 0;
      }
      absorb_constant_inputs(cluster);
      std::string reason = check_boundary(cluster);
      if (reason.empty() && compute_ops < options_.min_compute_ops) {
        reason = compute_ops == 0
                     ? "its cluster has no compute op (only views, constants, size arithmetic or "
                       "kernel calls); an engine would only copy its inputs"
                     : "its cluster has " + std::to_string(compute_ops) +
                           " compute ops, fewer than min_cluster_size=" +
                           std::to_string(options_.min_compute_ops);
      }
      if (reason.empty()) {
        result.clusters.push_back(cluster);
        continue;
      }
      DissolvedCluster dissolved;
      dissolved.node_kinds = std::move(after);
      dissolved.reason = reason;
      result.dissolved.push_back(std::move(dissolved));
      dissolve_cluster(cluster);
    }
  }

  // The ops the report counts in a cluster, by overload, sorted.
  static std::vector<std::string> reported_ops(Node* cluster) {
    std::vector<std::string> names;
    for (Node* inner : cluster->g(c10::attr::Subgraph)->nodes()) {
      if (is_reported_op(inner)) {
        names.push_back(op_name(inner));
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Two outputs that alias (`y = x * 2` and the view `y[:, :2]` both leaving the cluster)
  // would come back as separate fresh tensors, so a write through the view outside would
  // not reach `y`. The view node, and what uses it inside, moves out after the cluster;
  // its source is an output already. To a fixed point, since the source may be a view too.
  // (A view whose source stays inside may be returned as a fresh tensor: nothing outside
  // can observe the difference.)
  static void unmerge_view_outputs(Node* cluster) {
    for (bool moved = true; moved;) {
      moved = false;
      auto subgraph = cluster->g(c10::attr::Subgraph);
      AliasDb alias_db(subgraph);
      for (Value* out : subgraph->outputs()) {
        Node* producer = out->node();
        if (producer->kind() == c10::prim::Constant || producer->kind() == c10::prim::Param) {
          continue;
        }
        bool is_view = false;
        for (Value* in : producer->inputs()) {
          if (is_tensor(in) && alias_db.mayAlias(out, in)) {
            is_view = true;
            break;
          }
        }
        bool aliases_an_output = false;
        for (Value* other : subgraph->outputs()) {
          if (other != out && alias_db.mayAlias(out, other)) {
            aliases_an_output = true;
            break;
          }
        }
        if (is_view && aliases_an_output) {
          SubgraphUtils::unmergeNode(producer, cluster);
          moved = true;
          break;
        }
      }
    }
  }

  // Constants computed outside become constants inside, so they never cross the boundary.
  static void absorb_constant_inputs(Node* cluster) {
    auto subgraph = cluster->g(c10::attr::Subgraph);
    for (size_t i = cluster->inputs().size(); i-- > 0;) {
      Node* producer = cluster->input(i)->node();
      if (producer->kind() != c10::prim::Constant) {
        continue;
      }
      torch::jit::WithInsertPoint guard(subgraph->block()->nodes().front());
      Node* copy = subgraph->createClone(producer, [](Value* v) { return v; });
      subgraph->insertNode(copy);
      subgraph->inputs()[i]->replaceAllUsesWith(copy->output());
      subgraph->eraseInput(i);
      cluster->removeInput(i);
    }
  }

  static std::string check_boundary(Node* cluster) {
    for (Value* v : cluster->inputs()) {
      if (!is_tensor(v)) {
        return "a non-tensor value (" + v->type()->repr_str() + ", produced by " +
               v->node()->kind().toQualString() + ") would enter the cluster";
      }
    }
    for (Value* v : cluster->outputs()) {
      if (!is_tensor(v)) {
        return "a non-tensor value (" + v->type()->repr_str() + ") would leave the cluster";
      }
    }
    return "";
  }

  std::shared_ptr<torch::jit::Graph> graph_;
  const ClusterOptions& options_;
  std::unique_ptr<AliasDb> alias_db_;
  bool random_ = false;  // some node of the graph draws random numbers
};

}  // namespace

c10::Symbol cluster_kind() {
  return c10::prim::FunctionalGraph;
}

std::vector<Node*> dissolve_cluster(Node* cluster) {
  // The subgraph is inlined right before the cluster node, one clone per node in order.
  Node* before = cluster->prev();
  Node* after = cluster->next();
  SubgraphUtils::unmergeSubgraph(cluster);
  std::vector<Node*> moved;
  for (Node* n = before->next(); n != after; n = n->next()) {
    moved.push_back(n);
  }
  return moved;
}

ClusterResult cluster_supported_nodes(const std::shared_ptr<torch::jit::Graph>& graph,
                                      const ClusterOptions& options) {
  return Clusterer(graph, options).run();
}

}  // namespace blade::passes
