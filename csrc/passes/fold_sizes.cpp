#include "passes/fold_sizes.h"

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;

constexpr const char* kSizeOfDim = "aten::size.int(Tensor self, int dim) -> int";
constexpr const char* kSizes = "aten::size(Tensor self) -> int[]";

void collect(Block* block, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect(sub, found);
    }
    if (node->kind() == c10::aten::size) {
      found.push_back(node);
    }
  }
}

// The dims of `node`'s tensor input, when its rank is known.
std::optional<std::vector<c10::ShapeSymbol>> dims_of(Node* node) {
  auto type = node->input(0)->type()->cast<c10::TensorType>();
  if (!type) {
    return std::nullopt;
  }
  return type->symbolic_sizes().sizes();
}

}  // namespace

int fold_sizes(const std::shared_ptr<torch::jit::Graph>& graph) {
  std::vector<Node*> found;
  collect(graph->block(), found);
  int rewritten = 0;
  for (Node* node : found) {
    auto dims = dims_of(node);
    if (!dims) {
      continue;
    }
    const auto rank = static_cast<int64_t>(dims->size());
    torch::jit::WithInsertPoint guard(node);
    if (node->matches(kSizeOfDim)) {
      auto dim = torch::jit::constant_as<int64_t>(node->input(1));
      if (!dim || *dim < -rank || *dim >= rank) {
        continue;  // unknown or out of range: left for the run to report
      }
      const auto& symbol = (*dims)[static_cast<size_t>(*dim < 0 ? *dim + rank : *dim)];
      if (!symbol.is_static()) {
        continue;
      }
      node->output()->replaceAllUsesWith(graph->insertConstant(symbol.static_size()));
      node->destroy();
      ++rewritten;
    } else if (node->matches(kSizes)) {
      std::vector<torch::jit::Value*> items;
      for (int64_t d = 0; d < rank; ++d) {
        const auto& symbol = (*dims)[static_cast<size_t>(d)];
        if (symbol.is_static()) {
          items.push_back(graph->insertConstant(symbol.static_size()));
          continue;
        }
        Node* size = graph->create(c10::aten::size, {node->input(0), graph->insertConstant(d)});
        size->output()->setType(c10::IntType::get());
        graph->insertNode(size);
        items.push_back(size->output());
      }
      // With every dim known too: PyTorch's shape peephole would fold the list to one list
      // constant without asking whether the list is written, so `s = x.shape; s[3] = 5`
      // would write into the constant (the run still right, the constant wrong for the
      // importer). A list of constants is folded further only where nothing writes it
      // (constant propagation asks), and a written one has its writes removed
      // (remove_mutation).
      Node* list = graph->insertNode(graph->createList(c10::IntType::get(), items));
      node->output()->replaceAllUsesWith(list->output());
      node->destroy();
      ++rewritten;
    }
  }
  return rewritten;
}

}  // namespace blade::passes
