#include "passes/functionalize_input_writes.h"

#include "passes/functionalize_view_writes.h"
#include "passes/uses.h"

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace blade::passes {
namespace {

using torch::jit::AliasDb;
using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

// How a write's functional value is made.
struct Twin {
  enum class Kind { kWrittenValue, kOp } how = Kind::kOp;
  c10::Symbol op;    // the functional op (kOp)
  size_t arity = 0;  // how many of the write's inputs it takes
};

bool arguments_match(const c10::FunctionSchema& write, const c10::FunctionSchema& twin) {
  const auto& a = write.arguments();
  const auto& b = twin.arguments();
  if (a.size() != b.size() || twin.returns().size() != 1 ||
      twin.returns()[0].alias_info() != nullptr ||
      twin.returns()[0].type()->kind() != c10::TypeKind::TensorType) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i].alias_info() != nullptr || a[i].type()->str() != b[i].type()->str()) {
      return false;
    }
  }
  return true;
}

// Writes of a few elements (a KV cache's position, scattered indices): in place they cost
// what they write, as a new value and its write-back twice the whole tensor (a decoding
// step's cache update would cost more than its attention). Only small tensors' are
// rewritten.
bool writes_a_few_elements(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index_put_",   "aten::_index_put_impl_", "aten::index_copy_",
      "aten::index_add_",   "aten::index_fill_",      "aten::index_reduce_",
      "aten::scatter_",     "aten::scatter_add_",     "aten::scatter_reduce_",
      "aten::masked_scatter_", "aten::put_"};
  return ops.count(name) > 0;
}

// An in-place op on its first argument alone: that argument written, no other annotated
// (not an out= form, nothing else kept or written).
bool in_place_on_first(const c10::FunctionSchema* schema) {
  if (schema == nullptr || schema->arguments().empty() || schema->returns().size() != 1) {
    return false;
  }
  const c10::AliasInfo* self = schema->arguments()[0].alias_info();
  if (self == nullptr || !self->isWrite()) {
    return false;
  }
  for (size_t i = 1; i < schema->arguments().size(); ++i) {
    if (schema->arguments()[i].alias_info() != nullptr) {
      return false;
    }
  }
  return true;
}

// Whether a tensor of this type has known sizes and at most `limit` elements.
bool at_most(const c10::TypePtr& type, int64_t limit) {
  auto t = type->cast<c10::TensorType>();
  const auto sizes = t ? t->sizes().concrete_sizes() : std::nullopt;
  if (!t || !t->scalarType() || !sizes) {
    return false;
  }
  int64_t elements = 1;
  for (int64_t size : *sizes) {
    elements *= size;
  }
  return elements <= limit;
}

// The functional form of an in-place write into its first argument, if it has one. With
// `small_writes` > 0 (types known), only writes of a few elements into tensors of at most
// that many elements: their twins keep the tensor's dtype and sizes.
std::optional<Twin> functional_twin(const Node* write, int64_t small_writes) {
  if (write->kind() == write_back_kind() || write->outputs().size() != 1) {
    return std::nullopt;
  }
  if (view_writes::is_write(write)) {
    if (small_writes > 0) {
      return std::nullopt;
    }
    return Twin{Twin::Kind::kWrittenValue, c10::Symbol(), 0};
  }
  const c10::FunctionSchema* schema = write->maybeSchema();
  if (!in_place_on_first(schema)) {
    return std::nullopt;
  }
  const std::string& name = schema->name();
  // Twins that give a tensor of other sizes or storage: these writes change what the
  // tensor is, not only its values.
  if (name == "aten::resize_" || name == "aten::resize_as_" || name == "aten::set_" ||
      name == "aten::_resize_output_") {
    return std::nullopt;
  }
  // (before types are known, none of those; after, those only, into small tensors)
  const bool few = writes_a_few_elements(name);
  if (small_writes > 0 ? !few || !at_most(write->input(0)->type(), small_writes) : few) {
    return std::nullopt;
  }
  if (name == "aten::_index_put_impl_") {  // (`unsafe` only skips index checks)
    return Twin{Twin::Kind::kOp, c10::aten::index_put, 4};
  }
  if (name.size() < 2 || name.back() != '_' || name.compare(0, 6, "aten::") != 0) {
    return std::nullopt;
  }
  auto op = c10::Symbol::fromQualString(name.substr(0, name.size() - 1));
  for (const auto& candidate : torch::jit::getAllOperatorsFor(op)) {
    const c10::FunctionSchema& twin = candidate->schema();
    if (twin.overload_name() == schema->overload_name() && arguments_match(*schema, twin)) {
      return Twin{Twin::Kind::kOp, op, schema->arguments().size()};
    }
  }
  return std::nullopt;
}

// A tensor the caller sees after the call: a graph input, or a module attribute read in
// the top block.
bool is_external(Value* v) {
  Node* producer = v->node();
  Graph* graph = v->owningGraph();
  if (producer->owningBlock() != graph->block() ||
      v->type()->kind() != c10::TypeKind::TensorType) {
    return false;
  }
  return producer->kind() == c10::prim::Param || producer->kind() == c10::prim::GetAttr;
}

struct Candidate {
  Node* write = nullptr;
  Value* root = nullptr;  // the external tensor
  Twin twin;
};

// A write into an external tensor itself. (A write through a view of one, `x[:, t] = v`,
// stays: its functional form is the whole tensor, written back whole, where eager writes
// the view.)
std::optional<Candidate> as_candidate(Node* node, int64_t small_writes) {
  auto twin = functional_twin(node, small_writes);
  if (!twin || !is_external(node->input(0))) {
    return std::nullopt;
  }
  return Candidate{node, node->input(0), *twin};
}

std::optional<Candidate> first_candidate(Block* block, int64_t small_writes) {
  for (Node* node : block->nodes()) {
    if (auto c = as_candidate(node, small_writes)) {
      return c;
    }
  }
  return std::nullopt;
}

bool is_write_back_of(const Node* node, const Value* root) {
  return node->kind() == write_back_kind() && node->input(0) == root;
}

bool is_graph_input(const Value* v) {
  return v->node()->kind() == c10::prim::Param &&
         v->node()->owningBlock() == v->owningGraph()->block();
}

bool is_view_of_first_input(const Node* node) {
  const c10::FunctionSchema* schema = node->maybeSchema();
  return schema != nullptr && schema->returns().size() == 1 && !schema->arguments().empty() &&
         schema->returns()[0].alias_info() != nullptr &&
         !schema->returns()[0].alias_info()->isWrite() &&
         schema->arguments()[0].alias_info() != nullptr &&
         !schema->arguments()[0].alias_info()->isWrite();
}

// The value `v` is a view of, through views of views (and unchecked_cast, which is its
// input as it is), or `v` itself.
Value* viewed_base(Value* v) {
  while (is_view_of_first_input(v->node()) || v->node()->kind() == c10::prim::unchecked_cast) {
    v = v->node()->input(0);
  }
  return v;
}

// Graph inputs that the graph writes into share no memory with any other input: the
// guard admits no others (ral/guard.h), so AliasDb's "graph inputs may alias each other"
// does not hold between a written input and another input.
bool other_input(Value* v, Value* root) {
  Value* base = viewed_base(v);
  Value* written = viewed_base(root);  // (a view's write-back writes into its base)
  // (tensors only: the guard checks no tensor inside a list or an optional)
  return base != written && is_graph_input(base) && is_graph_input(written) &&
         base->type()->kind() == c10::TypeKind::TensorType;
}

bool may_hold(Value* v, Value* root, const AliasDb& db);

// Whether `n` may write into %root: AliasDb's answer, less the writes into other inputs.
bool may_write(Node* n, Value* root, const AliasDb& db) {
  if (!db.writesToAlias(n, {root})) {
    return false;
  }
  // An engine writes only into tensors of its list of inputs (engine_call.h).
  static const c10::Symbol execute_writing = c10::Symbol::fromQualString("blade::execute_writing");
  if (n->kind() == execute_writing) {
    return may_hold(n->input(1), root, db);
  }
  // A write-back or an in-place op (no block: nothing else inside) writes its first input.
  return !in_place_on_first(n->maybeSchema()) || !other_input(n->input(0), root);
}

// The value %root holds just before `before`: that of the last write-back into it when
// nothing may have written to %root since (then also that write-back), else %root.
std::pair<Value*, Node*> current_value(Value* root, Node* before, const AliasDb& db) {
  Block* block = before->owningBlock();
  for (Node* n = before->prev(); n != block->param_node() && n != root->node(); n = n->prev()) {
    if (is_write_back_of(n, root)) {
      return {n->input(1), n};
    }
    if (may_write(n, root, db)) {
      break;
    }
  }
  return {root, nullptr};
}

// Whether `v` may be or hold %root (a list of views of other inputs holds none of it).
bool may_hold(Value* v, Value* root, const AliasDb& db) {
  if (v == root || !db.mayContainAlias(v, root)) {
    return v == root;
  }
  if (v->node()->kind() == c10::prim::ListConstruct) {
    for (Value* item : v->node()->inputs()) {
      if (may_hold(item, root, db)) {
        return true;
      }
    }
    return false;
  }
  return !other_input(v, root);
}

// Whether `test` holds for `node` or a node of its blocks, however deep.
template <typename Test>
bool any_inside(Node* node, const Test& test) {
  if (test(node)) {
    return true;
  }
  for (Block* sub : node->blocks()) {
    for (Node* inner : sub->nodes()) {
      if (any_inside(inner, test)) {
        return true;
      }
    }
  }
  return false;
}

// Whether `node` (or a node of its blocks) reads a value that may alias `root`: as an
// input, or as a value its block returns.
bool may_read(Node* node, Value* root, const AliasDb& db) {
  const auto holds = [&](Value* v) { return may_hold(v, root, db); };
  return any_inside(node, [&](Node* n) {
    if (std::any_of(n->inputs().begin(), n->inputs().end(), holds)) {
      return true;
    }
    for (Block* sub : n->blocks()) {
      if (std::any_of(sub->outputs().begin(), sub->outputs().end(), holds)) {
        return true;
      }
    }
    return false;
  });
}

// Whether `user` only reads the value it takes at input `offset`, before `limit`: an op
// whose argument carries no alias annotation, or a list or a view (in the same block) that
// is only read in turn, by nodes before `limit` (a reference that outlives the next write
// would see what it writes).
bool reads_only(Node* user, size_t offset, Node* limit, int depth = 0) {
  if (depth > 8 || user->owningBlock() != limit->owningBlock() || !user->isBefore(limit)) {
    return false;
  }
  if (user->kind() == c10::prim::ListConstruct || (offset == 0 && is_view_of_first_input(user))) {
    for (const auto& use : user->output()->uses()) {
      bool read = user->kind() == c10::prim::ListConstruct
                      ? only_reads(use) && use.user->owningBlock() == limit->owningBlock() &&
                            use.user->isBefore(limit)
                      : reads_only(use.user, use.offset, limit, depth + 1);
      if (!read) {
        return false;
      }
    }
    return true;
  }
  return user->maybeSchema() != nullptr && only_reads(torch::jit::Use(user, offset));
}

// Whether `node` or a node of its blocks may write to %root.
bool may_write_inside(Node* node, Value* root, const AliasDb& db) {
  return any_inside(node, [&](Node* n) { return may_write(n, root, db); });
}

// Reads of %root after the write-back `written` read `value` instead, until a node that
// may write to %root.
void redirect_reads(Value* root, Value* value, Node* written, const AliasDb& db) {
  Block* block = written->owningBlock();
  // Where %root may change next: references to `value` must be read before it.
  Node* next_write = written->next();
  while (next_write != block->return_node() && !is_write_back_of(next_write, root) &&
         !may_write(next_write, root, db)) {
    next_write = next_write->next();
  }
  for (Node* n = written->next(); n != next_write; n = n->next()) {
    // Reads inside blocks are not redirected, nor those after a node with blocks that may
    // read or write %root; one that leaves it alone (a decomposition's branch on an
    // optional mask) is passed.
    if (!n->blocks().empty()) {
      if (!leaves_alone(n, root, db)) {
        break;
      }
      continue;
    }
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      if (n->input(i) == root && reads_only(n, i, next_write)) {
        n->replaceInput(i, value);
      }
    }
  }
}

// The value `written` holds after the write: a fresh tensor of its dtype.
Value* functional_value(Graph& graph, const Candidate& c, Value* written, bool typed) {
  if (c.twin.how == Twin::Kind::kWrittenValue) {
    // expand_as(type_as(src, ...)) may be `src` itself, which may change later: a copy.
    Value* value = view_writes::written_value(graph, c.write);
    return graph.insert(c10::aten::clone, {value});
  }
  std::vector<Value*> inputs{written};
  for (size_t i = 1; i < c.twin.arity; ++i) {
    inputs.push_back(c.write->input(i));
  }
  Node* node = graph.insertNode(graph.create(c.twin.op, inputs, 1));
  node->copyMetadata(c.write);
  if (typed) {  // (writes of a few elements: the twin keeps the tensor's type)
    node->output()->setType(written->type());
  }
  // The twin's dtype may differ (gt gives bool, add promotes): the in-place op's result
  // has the dtype of what it writes into. Eager raises where that cast is not allowed
  // (int_x.add_(0.5)): the cast names the op for check_in_place_casts.
  Value* cast = graph.insert(c10::aten::type_as, {node->output(), written});
  if (!typed) {
    cast->node()->s_(in_place_cast_attribute(), c.write->kind().toQualString());
  }
  return cast;
}

void rewrite(Graph& graph, const Candidate& c, const AliasDb& db, bool typed) {
  auto [current, previous] = current_value(c.root, c.write, db);
  // The write reads what %root holds now.
  c.write->replaceInput(0, current);
  // The write-back before is redundant when this one follows it with no read of %root
  // between, the write's own other operands included (asked before any node is added: the
  // new ones are unknown to `db`).
  bool keep_previous = false;
  if (previous != nullptr) {
    for (Node* n = previous->next(); !keep_previous; n = n->next()) {
      keep_previous = may_read(n, c.root, db);
      if (n == c.write) {
        break;
      }
    }
  }
  torch::jit::WithInsertPoint guard(c.write);
  Value* value = functional_value(graph, c, current, typed);
  value->setType(c.root->type());
  Node* write_back = graph.insertNode(graph.create(write_back_kind(), {c.root, value}, 1));
  write_back->output()->setType(c.root->type());
  write_back->copyMetadata(c.write);
  c.write->output()->replaceAllUsesWith(c.root);
  if (previous != nullptr && !keep_previous) {
    previous->destroy();
  }
  c.write->destroy();
  redirect_reads(c.root, value, write_back, db);
}

// Each write-back as late as it may go: past the nodes that neither read nor write its
// tensor, so that the computations between two write-backs can join one cluster.
void sink_write_backs(const std::shared_ptr<Graph>& graph) {
  std::vector<Node*> write_backs;
  for (Node* n : graph->nodes()) {
    if (n->kind() == write_back_kind()) {
      write_backs.push_back(n);
    }
  }
  if (write_backs.empty()) {
    return;
  }
  AliasDb db(graph);
  for (auto it = write_backs.rbegin(); it != write_backs.rend(); ++it) {
    Node* write_back = *it;
    Value* root = write_back->input(0);
    for (Node* next = write_back->next(); next != graph->return_node(); next = write_back->next()) {
      if (may_read(next, root, db) || may_write(next, root, db)) {
        break;
      }
      write_back->moveAfter(next);
    }
  }
}

}  // namespace

c10::Symbol in_place_cast_attribute() {
  static const c10::Symbol name = c10::Symbol::attr("blade_in_place_op");
  return name;
}

void check_in_place_casts(const std::shared_ptr<Graph>& graph) {
  for (Node* n : graph->nodes()) {
    if (n->kind() != c10::aten::type_as || !n->hasAttribute(in_place_cast_attribute())) {
      continue;
    }
    auto from = n->input(0)->type()->cast<c10::TensorType>();
    auto to = n->input(1)->type()->cast<c10::TensorType>();
    if (from && to && from->scalarType() && to->scalarType()) {
      TORCH_CHECK(at::canCast(*from->scalarType(), *to->scalarType()),
                  n->s(in_place_cast_attribute()), ": result type ", *from->scalarType(),
                  " can't be cast to the desired output type ", *to->scalarType());
    }
    n->removeAttribute(in_place_cast_attribute());
  }
}

bool leaves_alone(Node* node, Value* root, const AliasDb& db) {
  return !may_read(node, root, db) && !may_write_inside(node, root, db);
}

c10::Symbol write_back_kind() {
  static const c10::Symbol kind = c10::Symbol::fromQualString("blade::write_back");
  return kind;
}

int functionalize_input_writes(const std::shared_ptr<Graph>& graph, int64_t small_writes) {
  int rewritten = 0;
  // Alias information changes with every rewrite: recomputed each time.
  while (auto candidate = first_candidate(graph->block(), small_writes)) {
    AliasDb db(graph);
    rewrite(*graph, *candidate, db, small_writes > 0);
    ++rewritten;
  }
  sink_write_backs(graph);
  return rewritten;
}

}  // namespace blade::passes
