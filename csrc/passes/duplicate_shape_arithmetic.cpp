#include "passes/duplicate_shape_arithmetic.h"

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

constexpr const char* kShapeSchemas[] = {
    "aten::size.int(Tensor self, int dim) -> int",
    "aten::mul.int(int a, int b) -> int",
    "aten::add.int(int a, int b) -> int",
    "aten::sub.int(int a, int b) -> int",
    "aten::floordiv.int(int a, int b) -> int",
    "aten::neg.int(int a) -> int",
    // Floats computed from sizes: a scale such as 1 / sqrt(q.size(-1)) in a dynamic engine.
    "aten::Float.int(int a) -> float",
    "aten::Float.Scalar(Scalar a) -> float",
    "aten::sqrt.int(int a) -> float",
    "aten::div.int(int a, int b) -> float",
    "aten::div.float(float a, float b) -> float",
    "aten::mul.float(float a, float b) -> float",
    "aten::mul.int_float(int a, float b) -> float",
    "aten::mul.float_int(float a, int b) -> float",
    "aten::add.float(float a, float b) -> float",
    "aten::sub.float(float a, float b) -> float",
};

bool is_scalar_operand(const Value* v) {
  if (v->node()->kind() == c10::prim::Constant) {
    return true;
  }
  return is_shape_arithmetic(v->node());
}

void collect(Block* block, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect(sub, found);
    }
    if (is_shape_arithmetic(node)) {
      found.push_back(node);
    }
  }
}

}  // namespace

bool is_shape_arithmetic(const Node* node) {
  bool matched = false;
  for (const char* schema : kShapeSchemas) {
    if (node->matches(schema)) {
      matched = true;
      break;
    }
  }
  if (!matched) {
    return false;
  }
  for (const Value* v : node->inputs()) {
    if (v->type()->kind() != c10::TypeKind::TensorType && !is_scalar_operand(v)) {
      return false;
    }
  }
  return true;
}

int duplicate_shape_arithmetic(const std::shared_ptr<torch::jit::Graph>& graph) {
  std::vector<Node*> found;
  collect(graph->block(), found);
  int copied = 0;
  // Users first: a copy made for a user adds a use to the copied node's own operands, which
  // are visited later and copied in turn.
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    Node* node = *it;
    auto uses = node->output()->uses();
    for (size_t i = 1; i < uses.size(); ++i) {
      Node* user = uses[i].user;
      Node* copy = graph->createClone(node, [](Value* v) { return v; });
      copy->insertBefore(user);
      user->replaceInput(uses[i].offset, copy->output());
      ++copied;
    }
  }
  return copied;
}

}  // namespace blade::passes
