#include "passes/detach_inlined_functions.h"

#include <torch/csrc/jit/api/function_impl.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::InlinedCallStack;
using torch::jit::InlinedCallStackPtr;
using torch::jit::Node;

// A function of this name with an empty body, never freed: what a rebuilt call stack
// points to. Names are the model's method names, so there are few.
torch::jit::Function* placeholder(const std::string& name) {
  static std::mutex mutex;
  static auto* functions =
      new std::unordered_map<std::string, std::unique_ptr<torch::jit::GraphFunction>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& function = (*functions)[name];
  if (!function) {
    function = std::make_unique<torch::jit::GraphFunction>(
        c10::QualifiedName(name), std::make_shared<torch::jit::Graph>(), nullptr);
  }
  return function.get();
}

using Rebuilt = std::unordered_map<const InlinedCallStack*, InlinedCallStackPtr>;

// The same call stack (outermost entry first, its callee next) over placeholders. The
// entries' names are read from function_name(), which the stack stores by value, never
// through the stale pointer.
InlinedCallStackPtr rebuild(const InlinedCallStackPtr& stack, Rebuilt& rebuilt) {
  auto found = rebuilt.find(stack.get());
  if (found != rebuilt.end()) {
    return found->second;
  }
  std::string name = stack->function_name();
  torch::jit::Function* function = placeholder(name);
  InlinedCallStackPtr copy;
  if (auto callee = stack->callee()) {
    copy = c10::make_intrusive<InlinedCallStack>(rebuild(*callee, rebuilt), function,
                                                 stack->source_range(),
                                                 stack->module_instance(), name);
  } else {
    copy = c10::make_intrusive<InlinedCallStack>(function, stack->source_range(),
                                                 stack->module_instance(), name);
  }
  rebuilt.emplace(stack.get(), copy);
  return copy;
}

int detach_block(Block* block, Rebuilt& rebuilt) {
  int count = 0;
  for (Node* node : block->nodes()) {
    if (auto stack = node->callstack()) {
      node->setCallStack(rebuild(*stack, rebuilt));
      ++count;
    }
    for (Block* inner : node->blocks()) {
      count += detach_block(inner, rebuilt);
    }
  }
  return count;
}

}  // namespace

int detach_inlined_functions(const std::shared_ptr<torch::jit::Graph>& graph) {
  Rebuilt rebuilt;
  return detach_block(graph->block(), rebuilt);
}

}  // namespace blade::passes
