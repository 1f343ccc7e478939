#include "passes/materialize_types.h"

#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <map>
#include <unordered_map>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

bool is_tensor(const Value* v) {
  return v->type()->kind() == c10::TypeKind::TensorType;
}

class TypeRecorder;
// The recorder of the materialization running on this thread; the observe op reports to it.
thread_local TypeRecorder* active_recorder = nullptr;

const c10::Symbol kObserve = c10::Symbol::fromQualString("blade::observe_type");

class TypeRecorder {
 public:
  explicit TypeRecorder(torch::jit::Graph& graph) : graph_(graph) {}

  void record(int64_t slot, const at::Tensor& t) {
    Value* v = observed_values_.at(static_cast<size_t>(slot));
    auto& history = sizes_seen_[v];
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (history.size() <= static_cast<size_t>(d)) {
        history.resize(static_cast<size_t>(d) + 1);
      }
      history[static_cast<size_t>(d)].push_back(t.size(d));
    }
    auto seen = c10::TensorType::create(t)->withRequiresGrad(false);
    auto it = observed_.find(v);
    if (it == observed_.end()) {
      observed_.emplace(v, seen);
    } else {
      it->second = it->second->merge(*seen);
    }
  }

  void instrument(Block* block) {
    for (Value* v : block->inputs()) {
      observe_at_start(block, v);
    }
    for (Node* node : block->nodes()) {
      for (Block* sub : node->blocks()) {
        instrument(sub);
      }
      for (Value* v : node->outputs()) {
        if (is_tensor(v)) {
          insert_after(node, v);
        }
      }
    }
  }

  void remove_instrumentation() {
    for (Node* n : profiles_) {
      n->destroy();
    }
    profiles_.clear();
  }

  int64_t apply(bool static_shapes) {
    int64_t count = 0;
    // A dimension whose size differed between observations gets a shape symbol; dimensions
    // that went through the same sizes in the same order share one, so the relation "these
    // two are equal" survives into the types (and from there into the engines' guards).
    std::map<std::vector<int64_t>, c10::ShapeSymbol> symbols;
    for (auto& [value, type] : observed_) {
      if (!type->scalarType() || !type->device() || !type->dim()) {
        continue;
      }
      c10::TensorTypePtr result = type;
      if (static_shapes && !type->sizes().concrete_sizes()) {
        const auto& history = sizes_seen_.at(value);
        std::vector<c10::ShapeSymbol> dims;
        for (size_t d = 0; d < *type->dim(); ++d) {
          auto size = type->sizes()[d];
          if (size) {
            dims.push_back(c10::ShapeSymbol::fromStaticSize(*size));
            continue;
          }
          auto it = symbols.find(history[d]);
          if (it == symbols.end()) {
            it = symbols.emplace(history[d], c10::ShapeSymbol::newSymbol()).first;
          }
          dims.push_back(it->second);
        }
        result = c10::TensorType::create(*type->scalarType(), *type->device(),
                                         c10::SymbolicShape(dims),
                                         c10::VaryingShape<c10::Stride>(*type->dim()),
                                         /*requires_grad=*/false);
      } else if (!static_shapes) {
        result = c10::TensorType::create(*type->scalarType(), *type->device(),
                                         c10::SymbolicShape(std::optional<size_t>(*type->dim())),
                                         c10::VaryingShape<c10::Stride>(*type->dim()),
                                         /*requires_grad=*/false);
      }
      value->setType(result);
      ++count;
    }
    return count;
  }

 private:
  void observe_at_start(Block* block, Value* v) {
    if (!is_tensor(v)) {
      return;
    }
    // The block's param node heads its node list, so "after it" is the block's start.
    make_profile(v)->insertAfter(block->param_node());
  }

  void insert_after(Node* node, Value* v) { make_profile(v)->insertAfter(node); }

  Node* make_profile(Value* v) {
    auto slot = static_cast<int64_t>(observed_values_.size());
    observed_values_.push_back(v);
    Node* observe = graph_.create(kObserve, {v}, 0);
    observe->i_(c10::attr::value, slot);
    profiles_.push_back(observe);
    return observe;
  }

  torch::jit::Graph& graph_;
  std::vector<Node*> profiles_;
  std::vector<Value*> observed_values_;
  std::unordered_map<Value*, c10::TensorTypePtr> observed_;
  // Per value and dimension, every size observed, in order.
  std::unordered_map<Value*, std::vector<std::vector<int64_t>>> sizes_seen_;
};

// Records the type of its tensor input; inserted by TypeRecorder, never left in a graph.
// The slot is a node attribute, read when the interpreter creates the operation.
torch::jit::RegisterOperators observe_op({torch::jit::Operator(
    kObserve,
    [](const Node* node) -> torch::jit::Operation {
      int64_t slot = node->i(c10::attr::value);
      return [slot](torch::jit::Stack& stack) {
        auto value = std::move(stack.back());
        stack.pop_back();
        if (active_recorder != nullptr && value.isTensor() && value.toTensor().defined()) {
          active_recorder->record(slot, value.toTensor());
        }
      };
    },
    c10::AliasAnalysisKind::INTERNAL_SPECIAL_CASE)});

}  // namespace

int64_t materialize_types(const std::shared_ptr<torch::jit::Graph>& graph,
                          const std::vector<std::vector<c10::IValue>>& runs, bool static_shapes,
                          std::vector<c10::IValue>* first_outputs) {
  TORCH_CHECK(!runs.empty(), "blade: materialize_types needs at least one set of inputs");
  for (const auto& inputs : runs) {
    TORCH_CHECK(inputs.size() == graph->inputs().size(), "blade: the graph takes ",
                graph->inputs().size(), " inputs (the module first), but ", inputs.size(),
                " were given");
  }
  TypeRecorder recorder(*graph);
  recorder.instrument(graph->block());
  try {
    torch::jit::Code code(graph, "blade_materialize_types");
    active_recorder = &recorder;
    for (const auto& inputs : runs) {
      torch::jit::InterpreterState state(code);
      torch::jit::Stack stack(inputs.begin(), inputs.end());
      state.run(stack);
      if (first_outputs != nullptr && &inputs == &runs.front()) {
        *first_outputs = std::move(stack);
      }
    }
    active_recorder = nullptr;
  } catch (...) {
    active_recorder = nullptr;
    recorder.remove_instrumentation();
    throw;
  }
  recorder.remove_instrumentation();
  return recorder.apply(static_shapes);
}

}  // namespace blade::passes
