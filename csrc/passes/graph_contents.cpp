#include "passes/graph_contents.h"

#include <torch/csrc/jit/api/function_impl.h>

#include <functional>
#include <set>
#include <unordered_set>

namespace blade::passes {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;

namespace {

// Calls `visit` on each constant node of `graph` and of the functions it calls.
void for_each_constant(const std::shared_ptr<Graph>& graph,
                       const std::function<void(Node*)>& visit) {
  std::unordered_set<const Graph*> seen;
  std::function<void(Block*)> walk_block;
  std::function<void(const std::shared_ptr<Graph>&)> walk_graph =
      [&](const std::shared_ptr<Graph>& g) {
        if (seen.insert(g.get()).second) {
          walk_block(g->block());
        }
      };
  walk_block = [&](Block* block) {
    for (Node* node : block->nodes()) {
      if (node->kind() == c10::prim::Constant) {
        visit(node);
      } else if (node->kind() == c10::prim::CallFunction) {
        auto function_type = node->input(0)->type()->cast<c10::FunctionType>();
        if (function_type) {
          if (auto* graph_function =
                  torch::jit::tryToGraphFunction(*function_type->function())) {
            walk_graph(graph_function->graph());
          }
        }
      }
      for (Block* inner : node->blocks()) {
        walk_block(inner);
      }
    }
  };
  walk_graph(graph);
}

// Calls `visit` on each tensor constant node of `graph` and of the functions it calls.
void for_each_tensor_constant(const std::shared_ptr<Graph>& graph,
                              const std::function<void(Node*)>& visit) {
  for_each_constant(graph, [&](Node* node) {
    if (node->output()->type()->cast<c10::TensorType>() && node->hasAttribute(c10::attr::value)) {
      visit(node);
    }
  });
}

void add_kinds(const Block* block, std::set<std::string>& kinds) {
  for (const Node* node : block->nodes()) {
    kinds.insert(node->kind().toQualString());
    for (const Block* inner : node->blocks()) {
      add_kinds(inner, kinds);
    }
    if (node->hasAttribute(c10::attr::Subgraph) &&
        node->kindOf(c10::attr::Subgraph) == torch::jit::AttributeKind::g) {
      add_kinds(node->g(c10::attr::Subgraph)->block(), kinds);
    }
  }
}

}  // namespace

std::vector<std::string> node_kinds(const std::shared_ptr<Graph>& graph) {
  std::set<std::string> kinds;
  add_kinds(graph->block(), kinds);
  return {kinds.begin(), kinds.end()};
}

int64_t tensors_in_containers(const std::shared_ptr<Graph>& graph) {
  int64_t count = 0;
  for_each_constant(graph, [&](Node* node) {
    if (node->output()->type()->cast<c10::TensorType>()) {
      return;
    }
    auto value = torch::jit::toIValue(node->output());
    if (!value) {
      return;
    }
    value->visit([&](const c10::IValue& inner) {
      count += inner.isTensor() ? 1 : 0;
      return false;  // and go on inside
    });
  });
  return count;
}

std::vector<at::Tensor> tensor_constants(const std::shared_ptr<Graph>& graph) {
  std::vector<at::Tensor> values;
  for_each_tensor_constant(graph, [&](Node* node) { values.push_back(node->t(c10::attr::value)); });
  return values;
}

void set_tensor_constants(const std::shared_ptr<Graph>& graph,
                          const std::vector<at::Tensor>& values, bool retype) {
  size_t count = 0;
  for_each_tensor_constant(graph, [&](Node*) { ++count; });
  TORCH_CHECK(count == values.size(), "blade: set_tensor_constants: the graph holds ", count,
              " tensor constants, ", values.size(), " values were given");
  size_t next = 0;
  for_each_tensor_constant(graph, [&](Node* node) {
    const at::Tensor& value = values[next++];
    node->t_(c10::attr::value, value);
    if (retype) {
      node->output()->setType(c10::TensorType::create(value));
    }
  });
}

bool remove_attribute(const std::vector<torch::jit::Module>& instances, const std::string& name) {
  if (instances.empty()) {
    return false;
  }
  const c10::ClassTypePtr type = instances.front().type();
  if (!type->hasAttribute(name)) {
    return false;
  }
  for (const auto& instance : instances) {
    if (instance.type() != type) {
      return false;
    }
  }
  // Each object's slot first (found through the type), then the type's; an object listed
  // twice loses its slot once.
  std::set<const c10::ivalue::Object*> done;
  for (const auto& instance : instances) {
    if (done.insert(instance._ivalue().get()).second) {
      instance._ivalue()->unsafeRemoveAttr(name);
    }
  }
  type->unsafeRemoveAttribute(name);
  return true;
}

}  // namespace blade::passes
