#include "passes/decompose.h"

#include <torch/csrc/jit/passes/inliner.h>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;

std::string overload_of(const Node* node) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  if (schema == nullptr) {
    return "";
  }
  if (schema->overload_name().empty()) {
    return schema->name();
  }
  return schema->name() + "." + schema->overload_name();
}

bool results_unused(const Node* node, const std::vector<int64_t>& unused_results) {
  for (int64_t i : unused_results) {
    if (i < 0 || static_cast<size_t>(i) >= node->outputs().size() ||
        node->output(static_cast<size_t>(i))->hasUses()) {
      return false;
    }
  }
  return true;
}

void collect(Block* block, const std::string& overload,
             const std::vector<int64_t>& unused_results, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect(sub, overload, unused_results, found);
    }
    if (overload_of(node) == overload && results_unused(node, unused_results)) {
      found.push_back(node);
    }
  }
}

// A function returning several values returns one tuple; an op returning several values has
// one output per value. The body's tuple is taken apart so it matches the op: its elements
// where the body builds it last, else unpacked (a tuple that branches return).
void flatten_tuple_result(Graph& body, size_t op_results) {
  if (op_results < 2 || body.outputs().size() != 1 ||
      body.outputs()[0]->type()->cast<c10::TupleType>() == nullptr) {
    return;
  }
  Node* tuple = body.outputs()[0]->node();
  if (tuple->kind() != c10::prim::TupleConstruct) {
    Node* unpack = body.insertNode(body.createTupleUnpack(body.outputs()[0]));
    body.eraseOutput(0);
    for (torch::jit::Value* element : unpack->outputs()) {
      body.registerOutput(element);
    }
    return;
  }
  body.eraseOutput(0);
  for (torch::jit::Value* element : tuple->inputs()) {
    body.registerOutput(element);
  }
  if (!tuple->hasUses()) {
    tuple->destroy();
  }
}

}  // namespace

int decompose(const std::shared_ptr<Graph>& graph, const std::string& overload,
              const std::shared_ptr<Graph>& body, const std::vector<int64_t>& unused_results) {
  auto inlined = body->copy();
  torch::jit::Inline(*inlined);

  std::vector<Node*> found;
  collect(graph->block(), overload, unused_results, found);
  if (found.empty()) {
    return 0;
  }
  flatten_tuple_result(*inlined, found.front()->outputs().size());
  for (Node* node : found) {
    TORCH_CHECK(node->inputs().size() == inlined->inputs().size(), "blade: the decomposition of ",
                overload, " takes ", inlined->inputs().size(), " arguments, but the node ",
                node->kind().toQualString(), " passes ", node->inputs().size());
    TORCH_CHECK(node->outputs().size() == inlined->outputs().size(), "blade: the decomposition of ",
                overload, " returns ", inlined->outputs().size(), " values, but the op has ",
                node->outputs().size(), " results");
    for (size_t i = 0; i < node->outputs().size(); ++i) {
      TORCH_CHECK(inlined->outputs()[i]->type()->isSubtypeOf(*node->output(i)->type()),
                  "blade: the decomposition of ", overload, " returns ",
                  inlined->outputs()[i]->type()->repr_str(), " as result ", i,
                  ", where the op returns ", node->output(i)->type()->repr_str());
    }
  }
  for (Node* node : found) {
    torch::jit::WithInsertPoint guard(node);
    auto results = torch::jit::insertGraph(*graph, *inlined, node->inputs());
    for (size_t i = 0; i < results.size(); ++i) {
      node->output(i)->replaceAllUsesWith(results[i]);
    }
    node->destroy();
  }
  return static_cast<int>(found.size());
}

}  // namespace blade::passes
