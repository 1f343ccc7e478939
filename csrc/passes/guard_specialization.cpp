#include "passes/guard_specialization.h"

#include <torch/custom_class.h>

namespace blade::passes {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

void guard_specialization(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::shared_ptr<torch::jit::Graph>& unspecialized,
                          const std::string& guard_attr, const std::vector<int64_t>& guarded) {
  TORCH_CHECK(graph->inputs().size() == unspecialized->inputs().size(),
              "blade: the unspecialized graph takes ", unspecialized->inputs().size(),
              " inputs, the optimized one ", graph->inputs().size());
  TORCH_CHECK(!graph->inputs().empty() &&
                  graph->inputs()[0]->type()->kind() == c10::TypeKind::ClassType,
              "blade: the graph's first input must be the module (self)");
  auto guard_type = torch::getCustomClass("__torch__.torch.classes.blade.Guard");
  TORCH_CHECK(guard_type, "blade: the Guard class is not registered; load libblade_ral");

  // The optimized body moves into the first branch of an If at the top of the graph.
  Block* top = graph->block();
  Node* first = top->nodes().front();
  torch::jit::WithInsertPoint at_start(first);
  Value* self = graph->inputs()[0];
  Node* get_guard = graph->insertNode(graph->createGetAttr(self, guard_attr));
  get_guard->output()->setType(guard_type);
  std::vector<Value*> tensors;
  for (int64_t i : guarded) {
    TORCH_CHECK(i > 0 && i < static_cast<int64_t>(graph->inputs().size()),
                "blade: guarded input ", i, " is not an input of the graph");
    tensors.push_back(graph->inputs()[static_cast<size_t>(i)]);
  }
  Node* list = graph->insertNode(
      graph->createList(c10::OptionalType::create(c10::TensorType::get()), tensors));
  Value* admitted = graph->insert(c10::Symbol::fromQualString("blade::guard_admits"),
                                  {get_guard->output(), list->output()});
  const size_t num_outputs = graph->outputs().size();
  Node* branch = graph->insertNode(graph->create(c10::prim::If, {admitted}, num_outputs));
  Block* optimized = branch->addBlock();
  Block* fallback = branch->addBlock();

  for (Node* n = branch->next(); n != top->return_node();) {
    Node* next = n->next();
    n->moveBefore(optimized->return_node());
    n = next;
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    optimized->registerOutput(graph->outputs()[i]);
  }
  {
    torch::jit::WithInsertPoint in_fallback(fallback->return_node());
    std::vector<Value*> inputs(graph->inputs().begin(), graph->inputs().end());
    auto outputs = torch::jit::insertGraph(*graph, *unspecialized, inputs);
    for (Value* v : outputs) {
      fallback->registerOutput(v);
    }
  }
  while (!graph->outputs().empty()) {
    graph->eraseOutput(0);
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    branch->output(i)->setType(unspecialized->outputs()[i]->type());
    graph->registerOutput(branch->output(i));
  }
  for (size_t i = 1; i < graph->inputs().size(); ++i) {
    graph->inputs()[i]->setType(unspecialized->inputs()[i]->type());
  }
}

}  // namespace blade::passes
