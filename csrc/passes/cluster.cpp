#include "passes/cluster.h"

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/utils/subgraph_utils.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <unordered_map>

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

// Marks a view that runs after an engine call on the engine's result or input (an edge
// view), with the id of the cluster it belongs to; the cluster node holds its id and the
// ops of the edge views that no longer run inside it.
c10::Symbol edge_view_marker() {
  static const c10::Symbol marker = c10::Symbol::attr("blade_edge_view_of");
  return marker;
}

c10::Symbol cluster_id_attr() {
  static const c10::Symbol id = c10::Symbol::attr("blade_cluster_id");
  return id;
}

c10::Symbol edge_ops_attr() {
  static const c10::Symbol ops = c10::Symbol::attr("blade_edge_ops");
  return ops;
}

// Whether `n`'s results may alias its arguments: its schema annotates a return (a view, or
// an in-place op's self), the op views without saying so, its alias analysis is
// conservative, or it has no schema (tuple and list plumbing). An op whose schema promises
// fresh results never aliases, whatever AliasDb infers around it.
bool may_return_alias(const Node* n) {
  if (n->kind() == c10::aten::_unsafe_view) {
    return true;
  }
  const auto* op = n->maybeOperator();
  if (op == nullptr || op->aliasAnalysisKind() == c10::AliasAnalysisKind::CONSERVATIVE) {
    return true;
  }
  const auto& returns = n->schema().returns();
  return std::any_of(returns.begin(), returns.end(),
                     [](const c10::Argument& r) { return r.alias_info() != nullptr; });
}

// A view that can be made again after the engine call from values the outside has: its
// schema views (reads, never writes) its arguments and it reads no memory layout.
bool is_pure_view(const Node* n) {
  if (n->kind() == c10::aten::_unsafe_view) {
    return true;
  }
  const auto* schema = n->maybeSchema();
  if (schema == nullptr || n->kind() == c10::aten::as_strided || !n->blocks().empty()) {
    return false;
  }
  bool views = false;
  for (const auto& r : schema->returns()) {
    if (r.alias_info() != nullptr) {
      if (r.alias_info()->isWrite()) {
        return false;
      }
      views = true;
    }
  }
  return views && n->outputs().size() == 1;
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
      // of each other, become views made after the engine call (move_views_to_edge).
      std::vector<std::string> before = reported_ops(cluster);
      std::string alias_reason;
      std::vector<std::string> edge_ops = move_views_to_edge(cluster, alias_reason);
      std::vector<std::string> after = reported_ops(cluster);
      after.insert(after.end(), edge_ops.begin(), edge_ops.end());
      std::sort(after.begin(), after.end());
      DissolvedCluster moved_out;
      std::set_difference(before.begin(), before.end(), after.begin(), after.end(),
                          std::back_inserter(moved_out.node_kinds));
      if (!moved_out.node_kinds.empty()) {
        moved_out.reason = alias_reason;
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
      dissolved.node_kinds = std::move(after);  // the edge views' ops too
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

  // Outputs that must alias a value outside the engine (an input, or another output) as
  // they do in eager: the engine returns fresh tensors. For a view (by its schema), the
  // engine returns the view's base instead, and a clone of the view runs right after the
  // engine call on it, metadata only (`y = x * 2` and `y[:, :2]` both leaving: the slice is
  // made of the engine's `y`, so a write through it is seen in `y`). The view stays inside
  // for its users there; the ops of views no longer inside are returned (they count as
  // the engine's). An aliasing producer that cannot be made again outside (no schema,
  // layout-reading views, sizes computed from values the outside lacks) moves out with
  // its users. A producer whose schema promises a fresh result never moves.
  // To a fixed point: a view's base may be a view too.
  std::vector<std::string> move_views_to_edge(Node* cluster, std::string& reason) {
    auto subgraph = cluster->g(c10::attr::Subgraph);
    std::vector<std::string> edge_ops;
    for (bool changed = true; changed;) {
      changed = false;
      AliasDb alias_db(subgraph);
      const auto outputs = subgraph->outputs();
      for (size_t k = 0; k < outputs.size() && !changed; ++k) {
        Value* out = outputs[k];
        Node* producer = out->node();
        if (!is_tensor(out) || producer->kind() == c10::prim::Constant) {
          continue;
        }
        if (producer->kind() == c10::prim::Param || repeats_an_output(subgraph, k)) {
          // The input itself, or an output listed twice: the outside reads that value.
          Value* same = producer->kind() == c10::prim::Param
                            ? cluster->input(out->offset())
                            : cluster->output(first_index_of(subgraph, out));
          cluster->output(k)->replaceAllUsesWith(same);
          subgraph->eraseOutput(k);
          cluster->eraseOutput(k);
          changed = true;
          continue;
        }
        if (!may_return_alias(producer) || !must_alias(alias_db, subgraph, k)) {
          continue;
        }
        if (is_pure_view(producer) && remake_after(producer, cluster, k)) {
          if (!producer->hasUses()) {
            edge_ops.push_back(op_name(producer));
            producer->destroy();
          }
          changed = true;
          continue;
        }
        reason = "its result may be a view of its input or of another result (" +
                        std::string(producer->kind().toQualString()) +
                        " may return an alias, AliasDb), and an engine returns fresh tensors, "
                        "so it stays outside the engine";
        SubgraphUtils::unmergeNode(producer, cluster);
        changed = true;
      }
    }
    torch::jit::EliminateDeadCode(subgraph);
    if (!edge_ops.empty()) {
      std::vector<std::string> held = cluster->hasAttribute(edge_ops_attr())
                                           ? cluster->ss(edge_ops_attr())
                                           : std::vector<std::string>{};
      held.insert(held.end(), edge_ops.begin(), edge_ops.end());
      cluster->ss_(edge_ops_attr(), held);
    }
    return edge_ops;
  }

  static size_t first_index_of(const std::shared_ptr<torch::jit::Graph>& subgraph,
                               const Value* v) {
    const auto outputs = subgraph->outputs();
    return std::find(outputs.begin(), outputs.end(), v) - outputs.begin();
  }

  static bool repeats_an_output(const std::shared_ptr<torch::jit::Graph>& subgraph,
                                size_t k) {
    return first_index_of(subgraph, subgraph->outputs()[k]) < k;
  }

  // Whether output k may alias an input or another output.
  static bool must_alias(const AliasDb& alias_db,
                         const std::shared_ptr<torch::jit::Graph>& subgraph, size_t k) {
    Value* out = subgraph->outputs()[k];
    for (Value* in : subgraph->inputs()) {
      if (is_tensor(in) && alias_db.mayAlias(out, in)) {
        return true;
      }
    }
    const auto outputs = subgraph->outputs();
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (j != k && alias_db.mayAlias(out, outputs[j])) {
        return true;
      }
    }
    return false;
  }

  // Makes output k's view (`view`) again right after the cluster node from the values the
  // outside has, and the outside's uses read it; the view's tensors become outputs where
  // they are not inputs, and the non-tensor arguments are made again outside (constants,
  // sizes and the int arithmetic on them). Returns false, changing nothing, when an
  // argument cannot be made outside.
  bool remake_after(Node* view, Node* cluster, size_t k) {
    auto subgraph = cluster->g(c10::attr::Subgraph);
    std::vector<Node*> chain;  // the non-tensor producers to make again, in graph order
    std::unordered_set<Node*> seen;
    for (Value* in : view->inputs()) {
      if (!collect_remakeable(in, chain, seen)) {
        return false;
      }
    }
    std::sort(chain.begin(), chain.end(), [](Node* a, Node* b) { return a->isBefore(b); });
    std::unordered_map<Value*, Value*> outside;
    auto outer = [&](Value* v) -> Value* {
      if (auto it = outside.find(v); it != outside.end()) {
        return it->second;
      }
      Value* mapped = nullptr;
      if (v->node()->kind() == c10::prim::Param) {
        mapped = cluster->input(v->offset());
      } else {
        size_t index = first_index_of(subgraph, v);
        if (index == subgraph->outputs().size()) {
          subgraph->registerOutput(v);
          cluster->addOutput()->setType(v->type());
        }
        mapped = cluster->output(index);
      }
      outside[v] = mapped;
      return mapped;
    };
    int64_t id = cluster_id(cluster);
    torch::jit::WithInsertPoint guard(cluster->next());
    auto clone = [&](Node* n) {
      Node* copy = graph_->createClone(n, outer);
      graph_->insertNode(copy);
      for (size_t i = 0; i < n->outputs().size(); ++i) {
        outside[n->output(i)] = copy->output(i);
      }
      return copy;
    };
    for (Node* n : chain) {
      clone(n);
    }
    Node* copy = clone(view);
    copy->i_(edge_view_marker(), id);
    copy->output()->copyMetadata(view->output());
    cluster->output(k)->replaceAllUsesWith(copy->output());
    subgraph->eraseOutput(k);
    cluster->eraseOutput(k);
    return true;
  }

  // Whether `v` can be had outside: a tensor (an input, or made an output), or a
  // non-tensor made by constants, size reads and pure arithmetic on such values, whose
  // producers are added to `chain`.
  static bool collect_remakeable(Value* v, std::vector<Node*>& chain,
                                 std::unordered_set<Node*>& seen) {
    Node* producer = v->node();
    if (is_tensor(v) || producer->kind() == c10::prim::Param || seen.count(producer) > 0) {
      return true;
    }
    const auto outputs = producer->outputs();
    bool pure = producer->blocks().empty() && !producer->isNondeterministic() &&
                !producer->hasSideEffects() &&
                std::none_of(outputs.begin(), outputs.end(), is_tensor) &&
                (producer->kind() == c10::prim::Constant ||
                 producer->kind() == c10::prim::ListConstruct ||
                 (producer->maybeSchema() != nullptr && !may_return_alias(producer)));
    if (!pure) {
      return false;
    }
    seen.insert(producer);
    for (Value* in : producer->inputs()) {
      if (!collect_remakeable(in, chain, seen)) {
        return false;
      }
    }
    chain.push_back(producer);
    return true;
  }

  // Unique in the process: clusters of later rounds (after a compile failure) share the
  // graph with the edge views of earlier ones.
  static int64_t cluster_id(Node* cluster) {
    static std::atomic<int64_t> next_id{0};
    if (!cluster->hasAttribute(cluster_id_attr())) {
      cluster->i_(cluster_id_attr(), next_id++);
    }
    return cluster->i(cluster_id_attr());
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
  // The subgraph is inlined right before the cluster node, one clone per node in order;
  // the cluster's edge views follow it in its block, and become plain nodes again.
  std::vector<Node*> edge_views;
  if (cluster->hasAttribute(cluster_id_attr())) {
    const int64_t id = cluster->i(cluster_id_attr());
    for (Node* n = cluster->next(); n != cluster->owningBlock()->return_node(); n = n->next()) {
      if (n->hasAttribute(edge_view_marker()) && n->i(edge_view_marker()) == id) {
        n->removeAttribute(edge_view_marker());
        edge_views.push_back(n);
      }
    }
  }
  Node* before = cluster->prev();
  Node* after = cluster->next();
  SubgraphUtils::unmergeSubgraph(cluster);
  std::vector<Node*> moved;
  for (Node* n = before->next(); n != after; n = n->next()) {
    moved.push_back(n);
  }
  moved.insert(moved.end(), edge_views.begin(), edge_views.end());
  return moved;
}

ClusterResult cluster_supported_nodes(const std::shared_ptr<torch::jit::Graph>& graph,
                                      const ClusterOptions& options) {
  return Clusterer(graph, options).run();
}

}  // namespace blade::passes
