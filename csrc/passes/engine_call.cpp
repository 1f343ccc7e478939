#include "passes/engine_call.h"

#include <torch/custom_class.h>

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

void replace_cluster_with_engine(Node* cluster, const std::string& attr_name) {
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
  Value* outputs = graph->insert(c10::Symbol::fromQualString("blade::execute"),
                                 {get_engine->output(), list->output()});
  Node* unpack = graph->insertNode(graph->createListUnpack(outputs, cluster->outputs().size()));
  for (size_t i = 0; i < cluster->outputs().size(); ++i) {
    unpack->output(i)->setType(cluster->output(i)->type());
    cluster->output(i)->replaceAllUsesWith(unpack->output(i));
  }
  cluster->destroy();
}

}  // namespace blade::passes
