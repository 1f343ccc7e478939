#include "passes/keep_rank_checks.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/library.h>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

const c10::Symbol kFoldBarrier = c10::Symbol::fromQualString("blade::fold_barrier");

// The rank of a batched input of `node`, or 0 when it is no op freezing folds into.
int64_t batched_rank(const Node* node) {
  if (node->outputs().size() != 1) {
    return 0;
  }
  auto kind = node->kind();
  if (kind == c10::aten::conv1d) return 3;
  if (kind == c10::aten::conv2d) return 4;
  if (kind == c10::aten::conv3d) return 5;
  if (kind == c10::aten::linear) return 2;
  return 0;
}

bool is_convolution(const Node* node) {
  return batched_rank(node) > 2;
}

bool raises(Block* block) {
  for (Node* node : block->nodes()) {
    if (node->kind() == c10::prim::RaiseException) {
      return true;
    }
  }
  return false;
}

// `if x.dim() != rank: raise ...` on `x`, the convolution's input (keep_rank_checks has
// moved the read there), between the convolution and the batch_norm.
bool checked_before(Node* producer, Node* batch_norm, int64_t rank) {
  for (Node* node = producer->next(); node != batch_norm; node = node->next()) {
    if (node->kind() != c10::prim::If || node->blocks().size() != 2 ||
        !raises(node->blocks()[0]) || raises(node->blocks()[1])) {
      continue;
    }
    Node* compare = node->input(0)->node();
    if (compare->kind() != c10::aten::ne || compare->inputs().size() != 2) {
      continue;
    }
    Node* dim = compare->input(0)->node();
    auto expected = torch::jit::constant_as<int64_t>(compare->input(1));
    if (dim->kind() == c10::aten::dim && dim->input(0) == producer->input(0) && expected &&
        *expected == rank) {
      return true;
    }
  }
  return false;
}

void rewrite(Block* block, const std::shared_ptr<torch::jit::Graph>& graph,
             RankCheckCounts& counts) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      rewrite(sub, graph, counts);
    }
    if (node->kind() == c10::aten::dim && node->inputs().size() == 1) {
      Value* source = node->input(0);
      while (is_convolution(source->node())) {
        source = source->node()->input(0);
      }
      if (source != node->input(0)) {
        node->replaceInput(0, source);
        ++counts.rank_reads;
      }
    }
    if (node->kind() != c10::aten::batch_norm) {
      continue;
    }
    Node* producer = node->input(0)->node();
    int64_t rank = batched_rank(producer);
    if (rank == 0 || producer->owningBlock() != block ||
        (is_convolution(producer) && checked_before(producer, node, rank))) {
      continue;
    }
    Node* barrier = graph->create(kFoldBarrier, {node->input(0)});
    barrier->output()->setType(node->input(0)->type());
    barrier->insertAfter(producer);
    node->replaceInput(0, barrier->output());
    ++counts.barriers;
  }
}

void collect_calls(Block* block, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect_calls(sub, found);
    }
    if (node->kind() == c10::prim::CallMethod || node->kind() == c10::prim::CallFunction) {
      found.push_back(node);
    }
  }
}

torch::jit::GraphFunction* callee(Node* call) {
  if (call->kind() == c10::prim::CallMethod) {
    auto type = call->input(0)->type()->cast<c10::ClassType>();
    auto* method = type ? type->findMethod(call->s(c10::attr::name)) : nullptr;
    return method ? torch::jit::tryToGraphFunction(*method) : nullptr;
  }
  auto function = call->input(0)->type()->cast<c10::FunctionType>();
  return function ? torch::jit::tryToGraphFunction(*function->function()) : nullptr;
}

// TorchScript's Inline pass inlines each callee's optimized graph, on which the peephole
// has already folded `dim()` of convolutions; the callees' own graphs still have it.
void inline_unoptimized(const std::shared_ptr<torch::jit::Graph>& graph) {
  for (;;) {
    std::vector<Node*> calls;
    collect_calls(graph->block(), calls);
    bool inlined = false;
    for (Node* call : calls) {
      if (auto* function = callee(call)) {
        if (call->kind() == c10::prim::CallFunction) {
          call->removeInput(0);  // the function itself, which the callee does not take
        }
        torch::jit::inlineCallTo(call, function, function->graph().get());
        inlined = true;
      }
    }
    if (!inlined) {
      return;
    }
  }
}

void collect_barriers(Block* block, std::vector<Node*>& found) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect_barriers(sub, found);
    }
    if (node->kind() == kFoldBarrier) {
      found.push_back(node);
    }
  }
}

}  // namespace

RankCheckCounts keep_rank_checks(const std::shared_ptr<torch::jit::Graph>& graph) {
  RankCheckCounts counts;
  rewrite(graph->block(), graph, counts);
  return counts;
}

torch::jit::Module copy_keeping_rank_checks(const torch::jit::Module& module) {
  // clone(inplace=true) gives the copy types and method graphs of its own, and shares the
  // attributes' values (the weights are not copied).
  torch::jit::Module copy = module.clone(/*inplace=*/true);
  if (auto forward = copy.find_method("forward")) {
    auto graph = forward->graph();
    inline_unoptimized(graph);
    keep_rank_checks(graph);
  }
  return copy;
}

int remove_fold_barriers(const std::shared_ptr<torch::jit::Graph>& graph) {
  std::vector<Node*> found;
  collect_barriers(graph->block(), found);
  for (Node* barrier : found) {
    barrier->output()->replaceAllUsesWith(barrier->input(0));
    barrier->destroy();
  }
  return static_cast<int>(found.size());
}

}  // namespace blade::passes

// Registered for alias analysis while the module is frozen; no saved model holds it.
TORCH_LIBRARY_FRAGMENT(blade, m) {
  m.def("fold_barrier(Tensor(a) self) -> Tensor(a)", [](const at::Tensor& self) { return self; });
}
