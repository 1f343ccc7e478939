#include "passes/engine_call.h"

#include "passes/functionalize_input_writes.h"

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/custom_class.h>

#include <algorithm>

namespace blade::passes {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// Shape-free types, so the fallback accepts any input; no scopes (tracing records module
// scopes, which the IR parser does not read back).
void prepare_for_fallback(torch::jit::Block* block) {
  auto strip = [](Value* v) {
    if (v->type()->kind() == c10::TypeKind::TensorType) {
      v->setType(c10::TensorType::get());
    }
  };
  for (Value* v : block->inputs()) {
    strip(v);
  }
  for (Node* n : block->nodes()) {
    n->setScope(c10::make_intrusive<torch::jit::Scope>());
    for (Value* v : n->outputs()) {
      strip(v);
    }
    for (auto* sub : n->blocks()) {
      prepare_for_fallback(sub);
    }
  }
}

}  // namespace

std::vector<at::Tensor> lift_tensor_constants(const std::shared_ptr<torch::jit::Graph>& subgraph) {
  std::vector<at::Tensor> params;
  std::vector<Node*> lifted;
  for (Node* n : subgraph->nodes()) {
    if (n->kind() == c10::prim::Constant &&
        n->output()->type()->kind() == c10::TypeKind::TensorType) {
      Value* input = subgraph->addInput("param");
      input->setType(n->output()->type());
      n->output()->replaceAllUsesWith(input);
      params.push_back(n->t(c10::attr::value));
      lifted.push_back(n);
    }
  }
  for (Node* n : lifted) {
    n->destroy();
  }
  return params;
}

std::string fallback_ir(const std::shared_ptr<torch::jit::Graph>& subgraph) {
  auto copy = subgraph->copy();
  prepare_for_fallback(copy->block());
  return copy->toString(/*print_source_locations=*/false);
}

namespace {

// Whether writing `from` into `to` cannot fail on sizes or dtypes: complete types, the same
// sizes (or the same shape symbols), a dtype that casts.
bool writable(Value* from, Value* to) {
  auto a = from->type()->cast<c10::TensorType>();
  auto b = to->type()->cast<c10::TensorType>();
  if (!a || !b || !a->scalarType() || !b->scalarType() || !a->symbolic_sizes().sizes() ||
      !b->symbolic_sizes().sizes()) {
    return false;
  }
  return at::canCast(*a->scalarType(), *b->scalarType()) &&
         *a->symbolic_sizes().sizes() == *b->symbolic_sizes().sizes();
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> absorbable_write_backs(Node* cluster) {
  struct Candidate {
    Node* node;
    int64_t output;
    int64_t input;
  };
  std::vector<Candidate> candidates;
  for (size_t o = 0; o < cluster->outputs().size(); ++o) {
    for (const auto& use : cluster->output(o)->uses()) {
      Node* user = use.user;
      if (user->kind() != write_back_kind() || use.offset != 1 || user->output()->hasUses() ||
          user->owningBlock() != cluster->owningBlock()) {
        continue;
      }
      Value* target = user->input(0);
      if (!writable(cluster->output(o), target) ||
          target->node()->owningBlock() != cluster->owningBlock() ||
          !target->node()->isBefore(cluster)) {
        continue;
      }
      candidates.push_back({user, static_cast<int64_t>(o), -1});
    }
  }
  std::vector<std::pair<int64_t, int64_t>> writes;
  if (candidates.empty()) {
    return writes;
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.node->isBefore(b.node); });
  torch::jit::AliasDb db(cluster->owningGraph()->shared_from_this());
  Node* last = cluster;
  // Past the nodes between that leave its tensor alone (AliasDb alone takes a graph input
  // to alias every other, so a write into another input would hold it back).
  const auto hoist = [&](Node* write, Node* after) {
    for (Node* n = after->next(); n != write; n = n->next()) {
      if (!leaves_alone(n, write->input(0), db)) {
        return false;
      }
    }
    write->moveAfter(after);
    return true;
  };
  for (const auto& c : candidates) {
    if (!db.moveAfterTopologicallyValid(c.node, last) && !hoist(c.node, last)) {
      continue;
    }
    last = c.node;
    // The tensor written into is an input of the engine: when the cluster does not read
    // it, an input its subgraph takes and leaves unused.
    Value* target = c.node->input(0);
    const auto& inputs = cluster->inputs();
    auto at = std::find(inputs.begin(), inputs.end(), target);
    if (at == inputs.end()) {
      cluster->addInput(target);
      cluster->g(c10::attr::Subgraph)->addInput()->setType(target->type());
      at = cluster->inputs().end() - 1;
    }
    writes.emplace_back(c.output, at - cluster->inputs().begin());
  }
  return writes;
}

void replace_cluster_with_engine(Node* cluster, const std::string& attr_name,
                                 const std::vector<std::pair<int64_t, int64_t>>& writes) {
  auto* graph = cluster->owningGraph();
  TORCH_CHECK(!graph->inputs().empty() &&
                  graph->inputs()[0]->type()->kind() == c10::TypeKind::ClassType,
              "blade: the graph's first input must be the module (self)");
  Value* self = graph->inputs()[0];
  torch::jit::WithInsertPoint guard(cluster);
  auto engine_type = torch::getCustomClass("__torch__.torch.classes.blade.Engine");
  TORCH_CHECK(engine_type, "blade: the Engine class is not registered; load libblade_ral");
  Node* get_engine = graph->insertNode(graph->createGetAttr(self, attr_name));
  get_engine->output()->setType(engine_type);
  std::vector<Value*> inputs(cluster->inputs().begin(), cluster->inputs().end());
  Node* list = graph->insertNode(graph->createList(c10::TensorType::get(), inputs));
  // The write-back nodes the engine does instead go (each its result unused).
  for (const auto& [output, input] : writes) {
    Value* value = cluster->output(output);
    Node* done = nullptr;
    for (const auto& use : value->uses()) {
      if (use.user->kind() == write_back_kind() && use.offset == 1 &&
          use.user->input(0) == cluster->input(input) && !use.user->output()->hasUses()) {
        done = use.user;
        break;
      }
    }
    TORCH_CHECK(done != nullptr, "blade: cluster output ", output, " is not written into input ",
                input, " by a blade::write_back node");
    done->destroy();
  }
  const char* op = writes.empty() ? "blade::execute" : "blade::execute_writing";
  Value* outputs = graph->insert(c10::Symbol::fromQualString(op),
                                 {get_engine->output(), list->output()});
  Node* unpack = graph->insertNode(graph->createListUnpack(outputs, cluster->outputs().size()));
  for (size_t i = 0; i < cluster->outputs().size(); ++i) {
    unpack->output(i)->setType(cluster->output(i)->type());
    cluster->output(i)->replaceAllUsesWith(unpack->output(i));
  }
  cluster->destroy();
}

}  // namespace blade::passes
