#include "passes/outline_branches.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/frontend/schema_matching.h>

#include <cctype>

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

constexpr int64_t kFunctionsPerFile = 32;

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
  static const auto kExecuteWriting = c10::Symbol::fromQualString("blade::execute_writing");
  for (const Node* n : block->nodes()) {
    if (n->kind() == c10::prim::Constant) {
      continue;
    }
    size->nodes += 1;
    size->calls_engine =
        size->calls_engine || n->kind() == kExecute || n->kind() == kExecuteWriting;
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

bool is_module(const Value* v) {
  auto type = v->type()->cast<c10::ClassType>();
  return type != nullptr && type->is_module();
}

// Whether every use of the module inside `block` reads an attribute that is no module (an
// engine, the guard, a tensor): those reads can move out before the branch.
bool reads_only_plain_attributes(const Block* block, const Value* self) {
  for (const Node* n : block->nodes()) {
    for (const Value* v : n->inputs()) {
      if (v == self && (n->kind() != c10::prim::GetAttr || is_module(n->output()))) {
        return false;
      }
    }
    for (const Block* b : n->blocks()) {
      if (!reads_only_plain_attributes(b, self)) {
        return false;
      }
    }
  }
  for (const Value* v : block->outputs()) {
    if (v == self) {
      return false;
    }
  }
  return true;
}

// Moves the reads of the module's attributes inside `block` to just before `before`, so
// that the function the branch becomes takes what they read as arguments.
void hoist_attribute_reads(Block* block, Value* self, Node* before) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* n = *it;
    ++it;
    if (n->kind() == c10::prim::GetAttr && n->input(0) == self) {
      n->moveBefore(before);
      continue;
    }
    for (Block* b : n->blocks()) {
      hoist_attribute_reads(b, self, before);
    }
  }
}

void outline(Graph& graph, Block* block, const std::string& module_name, int64_t index) {
  Value* self = graph.inputs()[0];
  auto module = self->type()->expect<c10::ClassType>();
  hoist_attribute_reads(block, self, block->owningNode());
  std::vector<Value*> free;
  std::unordered_set<Value*> seen;
  collect_free_values(block, block, &free, &seen);

  auto function_graph = std::make_shared<Graph>();
  std::unordered_map<Value*, Value*> env;
  std::vector<Value*> arguments;
  for (Value* v : free) {
    if (v->node()->kind() == c10::prim::Constant) {
      Node* copy = function_graph->insertNode(
          function_graph->createClone(v->node(), [](Value* u) { return u; }));
      env[v] = copy->output();
      continue;
    }
    env[v] = function_graph->addInput()->copyMetadata(v);
    arguments.push_back(v);
  }
  for (Node* n : block->nodes()) {
    Node* copy = function_graph->insertNode(
        function_graph->createClone(n, [&](Value* v) { return env.at(v); }));
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      env[n->output(i)] = copy->output(i);
    }
  }
  std::vector<Value*> results;
  for (Value* v : block->outputs()) {
    results.push_back(env.at(v));
  }
  if (results.size() == 1) {
    function_graph->registerOutput(results[0]);
  } else if (results.empty()) {
    function_graph->registerOutput(function_graph->insertConstant(c10::IValue()));
  } else {
    function_graph->registerOutput(
        function_graph->insertNode(function_graph->createTuple(results))->output());
  }

  // torch.jit.save writes the functions of one qualifier to one file
  // (code/__torch__/blade_branches/<module>_<group>.py), with the source the file's code
  // came from (its .debug_pkl): files of a few functions each keep both what loading copies
  // per variable and the repeated source small.
  auto* function = module->compilation_unit()->create_function(
      c10::QualifiedName("__torch__.blade_branches." + module_name + "_" +
                             std::to_string(index / kFunctionsPerFile),
                         "branch_" + std::to_string(index)),
      function_graph, /*shouldMangle=*/true);

  std::vector<Node*> old_nodes(block->nodes().begin(), block->nodes().end());
  torch::jit::WithInsertPoint at_start(old_nodes.front());
  torch::jit::MatchedSchema call{arguments, {function_graph->outputs()[0]->type()}, {},
                                 function->name()};
  Value* returned = graph.insertFunctionCall(function, call);
  std::vector<Value*> outputs{returned};
  if (results.size() > 1) {
    Node* unpack = graph.insertNode(graph.createTupleUnpack(returned));
    outputs.assign(unpack->outputs().begin(), unpack->outputs().end());
  }
  for (size_t i = 0; i < results.size(); ++i) {
    block->return_node()->replaceInput(i, outputs[i]);
  }
  for (auto it = old_nodes.rbegin(); it != old_nodes.rend(); ++it) {
    (*it)->destroy();
  }
}

struct Outlining {
  std::string module_name;  // the module class's name, as an identifier
  int64_t min_nodes;
  int64_t outlined = 0;
};

void outline_in(Graph& graph, Block* block, Outlining* state) {
  for (Node* n : block->nodes()) {
    for (Block* b : n->blocks()) {
      outline_in(graph, b, state);
    }
    if (n->kind() != c10::prim::If) {
      continue;
    }
    for (Block* b : n->blocks()) {
      BranchSize size;
      measure(b, &size);
      if (size.nodes > state->min_nodes && !size.calls_engine &&
          reads_only_plain_attributes(b, graph.inputs()[0])) {
        outline(graph, b, state->module_name, state->outlined);
        state->outlined += 1;
      }
    }
  }
}

}  // namespace

int64_t outline_branches(const std::shared_ptr<torch::jit::Graph>& graph, int64_t min_nodes) {
  TORCH_CHECK(!graph->inputs().empty() &&
                  graph->inputs()[0]->type()->kind() == c10::TypeKind::ClassType,
              "blade: the graph's first input must be the module (self)");
  // The module class's qualified name is unique in its compilation unit (TorchScript
  // mangles it), so the functions' names are too.
  std::string name =
      graph->inputs()[0]->type()->expect<c10::ClassType>()->name()->qualifiedName();
  if (name.rfind("__torch__.", 0) == 0) {
    name = name.substr(10);
  }
  for (char& c : name) {
    c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  }
  Outlining state{name, min_nodes};
  outline_in(*graph, graph->block(), &state);
  return state.outlined;
}

}  // namespace blade::passes
