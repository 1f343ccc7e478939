#include "passes/functionalize_view_writes.h"

#include <torch/csrc/jit/ir/alias_analysis.h>

#include <torch/csrc/jit/ir/constants.h>

#include <optional>

namespace blade::passes {
namespace view_writes {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool is_op(const Node* node, const char* name, const char* overload) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  return schema != nullptr && schema->name() == name && schema->overload_name() == overload;
}

static bool is_view_step(const Node* node) {
  return is_op(node, "aten::slice", "Tensor") || is_op(node, "aten::select", "int");
}

bool is_write(const Node* node) {
  return is_op(node, "aten::copy_", "") || is_op(node, "aten::fill_", "Scalar") ||
         is_op(node, "aten::fill_", "Tensor");
}

// Uses that read only a tensor's metadata, never its values (TorchScript reads the dtype
// and device of `x[...]` to build the scalar it writes there).
static bool reads_metadata_only(const Node* user) {
  return user->kind() == c10::prim::dtype || user->kind() == c10::prim::device ||
         user->kind() == c10::aten::dim || user->kind() == c10::aten::size;
}

static size_t value_uses(Value* v) {
  size_t count = 0;
  for (const auto& use : v->uses()) {
    count += reads_metadata_only(use.user) ? 0 : 1;
  }
  return count;
}

// The views from the base down to the written one, outermost first; empty when the chain
// does not qualify.
static std::vector<Node*> view_chain(Node* write) {
  std::vector<Node*> chain;
  Value* v = write->input(0);
  while (is_view_step(v->node())) {
    if (value_uses(v) != 1) {
      return {};
    }
    chain.insert(chain.begin(), v->node());
    v = v->node()->input(0);
  }
  return chain;
}

// The value written, as a tensor of the written view's shape and dtype.
Value* written_value(Graph& graph, Node* write) {
  Value* view = write->input(0);
  if (is_op(write, "aten::fill_", "Scalar")) {
    return graph.insert(c10::aten::full_like, {view, write->input(1)});
  }
  Value* src = write->input(1);
  Value* cast = graph.insert(c10::aten::type_as, {src, view});
  auto src_type = src->type()->cast<c10::TensorType>();
  auto view_type = view->type()->cast<c10::TensorType>();
  if (src_type && view_type && view_type->scalarType()) {
    cast->setType(src_type->withScalarType(view_type->scalarType()));
  }
  return graph.insert(c10::aten::expand_as, {cast, view});
}

// A bound of the view that the rewrite can use: None, or a constant >= 0.
static std::optional<std::optional<int64_t>> plain_bound(Value* v) {
  if (v->type()->kind() == c10::TypeKind::NoneType) {
    return std::optional<int64_t>();
  }
  auto bound = torch::jit::constant_as<int64_t>(v);
  if (!bound || *bound < 0) {
    return std::nullopt;
  }
  return std::optional<int64_t>(*bound);
}

// Whether the rewrite handles this view: step 1 and plain bounds (start <= end), or a
// select of a constant index >= 0. Negative or computed bounds are left alone.
static bool supported_view(Node* view_node) {
  if (is_op(view_node, "aten::select", "int")) {
    auto index = torch::jit::constant_as<int64_t>(view_node->input(2));
    return index && *index >= 0;
  }
  auto step = torch::jit::constant_as<int64_t>(view_node->input(4));
  auto start = plain_bound(view_node->input(2));
  auto end = plain_bound(view_node->input(3));
  if (!step || *step != 1 || !start || !end) {
    return false;
  }
  return !(*start && *end && **start > **end);
}

// `into` with the view `view_node` replaced by `src`: the parts before and after the view
// along its dim, concatenated around `src`. (aten::slice_scatter would say the same, but
// Torch-MLIR lowers it to a scatter that does not bufferize; slices and cat fuse.)
static Value* scatter(Graph& graph, Node* view_node, Value* into, Value* src) {
  Value* dim = view_node->input(1);
  std::optional<int64_t> start;
  std::optional<int64_t> end;
  if (is_op(view_node, "aten::select", "int")) {
    start = torch::jit::constant_as<int64_t>(view_node->input(2));
    end = *start + 1;
    src = graph.insert(c10::aten::unsqueeze, {src, dim});
  } else {
    start = *plain_bound(view_node->input(2));
    end = *plain_bound(view_node->input(3));
  }
  std::vector<Value*> parts;
  if (start && *start > 0) {
    parts.push_back(graph.insert(c10::aten::slice, {into, dim, int64_t{0}, *start, int64_t{1}}));
  }
  parts.push_back(src);
  if (end) {
    parts.push_back(graph.insert(
        c10::aten::slice, {into, dim, *end, torch::jit::IValue(), int64_t{1}}));
  }
  if (parts.size() == 1) {
    return src;  // the view is all of `into`
  }
  Node* list = graph.insertNode(graph.createList(c10::TensorType::get(), parts));
  return graph.insert(c10::aten::cat, {list->output(), dim});
}

}  // namespace view_writes

namespace {

using namespace view_writes;
using torch::jit::AliasDb;
using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// The base is a fresh tensor: made in the write's block by a node whose outputs alias
// none of its inputs, and every other alias of it is dead by the time of the write.
bool safe_base(Value* base, Node* first_view, Node* write, const AliasDb& alias_db) {
  Node* producer = base->node();
  if (producer->kind() == c10::prim::Param || producer->owningBlock() != write->owningBlock() ||
      !base->type()->cast<c10::TensorType>()) {
    return false;
  }
  for (Value* in : producer->inputs()) {
    if (alias_db.mayAlias(base, in)) {
      return false;
    }
  }
  for (const auto& use : base->uses()) {
    Node* user = use.user;
    if (user == first_view) {
      continue;
    }
    if (user->owningBlock() != write->owningBlock()) {
      return false;
    }
    for (Value* out : user->outputs()) {
      if (!alias_db.mayAlias(out, base)) {
        continue;
      }
      // A view taken after the write reads the written value once the uses after the
      // write read it (the next write through a slice of the same mask, say). One taken
      // before must be used up before the write, and not further aliased.
      if (!user->isBefore(write)) {
        continue;
      }
      for (const auto& view_use : out->uses()) {
        if (view_use.user->owningBlock() != write->owningBlock() ||
            !view_use.user->isBefore(write)) {
          return false;
        }
        for (Value* further : view_use.user->outputs()) {
          if (alias_db.mayAlias(further, out)) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

bool rewrite_one(const std::shared_ptr<Graph>& graph, Block* block, const AliasDb& alias_db) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      if (rewrite_one(graph, sub, alias_db)) {
        return true;
      }
    }
    if (!is_write(node) || node->output()->hasUses()) {
      continue;
    }
    auto chain = view_chain(node);
    if (chain.empty()) {
      continue;
    }
    bool supported = true;
    for (Node* view_node : chain) {
      supported = supported && supported_view(view_node);
    }
    if (!supported) {
      continue;
    }
    Value* base = chain.front()->input(0);
    if (!safe_base(base, chain.front(), node, alias_db)) {
      continue;
    }
    torch::jit::WithInsertPoint guard(node);
    Value* src = written_value(*graph, node);
    src->setType(node->input(0)->type());
    // Innermost first: each scatter writes into the view one level up.
    for (size_t i = chain.size(); i-- > 0;) {
      Value* into = chain[i]->input(0);
      src = scatter(*graph, chain[i], into, src);
      src->setType(into->type());
    }
    base->replaceAllUsesAfterNodeWith(node, src);
    node->destroy();
    return true;
  }
  return false;
}

}  // namespace

int functionalize_view_writes(const std::shared_ptr<Graph>& graph) {
  int rewritten = 0;
  // Alias information changes with every rewrite: recomputed each time.
  while (true) {
    AliasDb alias_db(graph);
    if (!rewrite_one(graph, graph->block(), alias_db)) {
      break;
    }
    ++rewritten;
  }
  return rewritten;
}

}  // namespace blade::passes
