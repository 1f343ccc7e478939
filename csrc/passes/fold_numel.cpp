#include "passes/fold_numel.h"

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;

void collect(Block* block, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect(sub, found);
    }
    if (node->kind() == c10::aten::numel && node->inputs().size() == 1) {
      found.push_back(node);
    }
  }
}

}  // namespace

int fold_numel(const std::shared_ptr<torch::jit::Graph>& graph) {
  std::vector<Node*> found;
  collect(graph->block(), found);
  int folded = 0;
  for (Node* node : found) {
    auto type = node->input(0)->type()->cast<c10::TensorType>();
    auto sizes = type ? type->sizes().concrete_sizes() : std::nullopt;
    if (!sizes) {
      continue;
    }
    int64_t count = 1;
    for (int64_t s : *sizes) {
      count *= s;
    }
    torch::jit::WithInsertPoint guard(node);
    node->output()->replaceAllUsesWith(graph->insertConstant(count));
    node->destroy();
    ++folded;
  }
  return folded;
}

}  // namespace blade::passes
