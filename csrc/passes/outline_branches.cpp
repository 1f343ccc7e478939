#include "passes/outline_branches.h"

#include <torch/csrc/jit/api/compilation_unit.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool is_inside(const Block* block, const Node* node) {
  for (const Block* b = node->owningBlock(); b != nullptr;
       b = b->owningNode() != nullptr ? b->owningNode()->owningBlock() : nullptr) {
    if (b == block) {
      return true;
    }
  }
  return false;
}

struct BranchSize {
  int64_t nodes = 0;
  bool calls_engine = false;
};

void measure(const Block* block, BranchSize* size) {
  static const auto kExecute = c10::Symbol::fromQualString("blade::execute");
  for (const Node* n : block->nodes()) {
    if (n->kind() == c10::prim::Constant) {
      continue;
    }
    size->nodes += 1;
    size->calls_engine = size->calls_engine || n->kind() == kExecute;
    for (const Block* b : n->blocks()) {
      measure(b, size);
    }
  }
}

// Values `block` reads (in its nodes, nested blocks and results) that are defined outside
// it, in order of first use.
void collect_free_values(Block* outer, Block* block, std::vector<Value*>* found,
                         std::unordered_set<Value*>* seen) {
  auto visit = [&](Value* v) {
    if (!is_inside(outer, v->node()) && seen->insert(v).second) {
      found->push_back(v);
    }
  };
  for (Node* n : block->nodes()) {
    for (Value* v : n->inputs()) {
      visit(v);
    }
    for (Block* b : n->blocks()) {
      collect_free_values(outer, b, found, seen);
    }
  }
  for (Value* v : block->outputs()) {
    visit(v);
  }
}

std::string unused_method_name(const c10::ClassTypePtr& module) {
  for (int64_t i = 0;; ++i) {
    std::string name = "blade_branch_" + std::to_string(i);
    if (module->findMethod(name) == nullptr && !module->hasAttribute(name)) {
      return name;
    }
  }
}

void outline(Graph& graph, Block* block) {
  Value* self = graph.inputs()[0];
  auto module = self->type()->expect<c10::ClassType>();
  std::vector<Value*> free;
  std::unordered_set<Value*> seen;
  collect_free_values(block, block, &free, &seen);

  auto method = std::make_shared<Graph>();
  std::unordered_map<Value*, Value*> env;
  env[self] = method->addInput("self")->setType(self->type());
  std::vector<Value*> arguments{self};
  for (Value* v : free) {
    if (v == self) {
      continue;
    }
    if (v->node()->kind() == c10::prim::Constant) {
      Node* copy = method->insertNode(method->createClone(v->node(), [](Value* u) { return u; }));
      env[v] = copy->output();
      continue;
    }
    env[v] = method->addInput()->copyMetadata(v);
    arguments.push_back(v);
  }
  for (Node* n : block->nodes()) {
    Node* copy = method->insertNode(method->createClone(n, [&](Value* v) { return env.at(v); }));
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      env[n->output(i)] = copy->output(i);
    }
  }
  std::vector<Value*> results;
  for (Value* v : block->outputs()) {
    results.push_back(env.at(v));
  }
  if (results.size() == 1) {
    method->registerOutput(results[0]);
  } else if (results.empty()) {
    method->registerOutput(method->insertConstant(c10::IValue()));
  } else {
    method->registerOutput(method->insertNode(method->createTuple(results))->output());
  }

  const std::string name = unused_method_name(module);
  auto* function = module->compilation_unit()->create_function(
      c10::QualifiedName(*module->name(), name), method);
  module->addMethod(function);

  std::vector<Node*> old_nodes(block->nodes().begin(), block->nodes().end());
  torch::jit::WithInsertPoint at_start(old_nodes.front());
  Node* call = graph.insertNode(graph.create(c10::prim::CallMethod, arguments, 1));
  call->s_(c10::attr::name, name);
  call->output()->setType(method->outputs()[0]->type());
  std::vector<Value*> outputs{call->output()};
  if (results.size() > 1) {
    Node* unpack = graph.insertNode(graph.createTupleUnpack(call->output()));
    outputs.assign(unpack->outputs().begin(), unpack->outputs().end());
  }
  for (size_t i = 0; i < results.size(); ++i) {
    block->return_node()->replaceInput(i, outputs[i]);
  }
  for (auto it = old_nodes.rbegin(); it != old_nodes.rend(); ++it) {
    (*it)->destroy();
  }
}

int64_t outline_in(Graph& graph, Block* block, int64_t min_nodes) {
  int64_t outlined = 0;
  for (Node* n : block->nodes()) {
    for (Block* b : n->blocks()) {
      outlined += outline_in(graph, b, min_nodes);
    }
    if (n->kind() != c10::prim::If) {
      continue;
    }
    for (Block* b : n->blocks()) {
      BranchSize size;
      measure(b, &size);
      if (size.nodes > min_nodes && !size.calls_engine) {
        outline(graph, b);
        outlined += 1;
      }
    }
  }
  return outlined;
}

}  // namespace

int64_t outline_branches(const std::shared_ptr<torch::jit::Graph>& graph, int64_t min_nodes) {
  TORCH_CHECK(!graph->inputs().empty() &&
                  graph->inputs()[0]->type()->kind() == c10::TypeKind::ClassType,
              "blade: the graph's first input must be the module (self)");
  return outline_in(*graph, graph->block(), min_nodes);
}

}  // namespace blade::passes
