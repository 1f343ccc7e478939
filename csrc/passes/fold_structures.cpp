#include "passes/fold_structures.h"

#include "passes/uses.h"

#include <optional>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Use;
using torch::jit::Value;

bool is_kind(const Node* node, const char* qualified) {
  return node->kind() == c10::Symbol::fromQualString(qualified);
}

std::optional<c10::IValue> constant_key(Value* v) {
  if (v->node()->kind() != c10::prim::Constant) {
    return std::nullopt;
  }
  auto value = torch::jit::toIValue(v);
  if (!value || !(value->isString() || value->isInt())) {
    return std::nullopt;
  }
  return value;
}

// --- dicts ---------------------------------------------------------------------------------

bool foldable_dict(Node* dict) {
  for (size_t i = 0; i < dict->inputs().size(); i += 2) {
    if (!constant_key(dict->input(i))) {
      return false;
    }
  }
  for (const Use& use : dict->output()->uses()) {
    Node* user = use.user;
    if (user->owningBlock() != dict->owningBlock() || use.offset != 0) {
      return false;
    }
    const bool get = is_kind(user, "aten::__getitem__");
    const bool set = is_kind(user, "aten::_set_item");
    if (!(get || set) || !constant_key(user->input(1))) {
      return false;
    }
  }
  // Every read must find its key (a missing key raises at run time: leave that alone).
  std::vector<c10::IValue> keys;
  for (size_t i = 0; i < dict->inputs().size(); i += 2) {
    keys.push_back(*constant_key(dict->input(i)));
  }
  for (Node* n = dict->next(); n != dict->owningBlock()->return_node(); n = n->next()) {
    if (n->inputs().empty() || n->input(0) != dict->output()) {
      continue;
    }
    c10::IValue key = *constant_key(n->input(1));
    bool known = false;
    for (const auto& k : keys) {
      known = known || k == key;
    }
    if (is_kind(n, "aten::_set_item")) {
      keys.push_back(key);
    } else if (!known) {
      return false;
    }
  }
  return true;
}

void fold_dict(Node* dict) {
  std::vector<std::pair<c10::IValue, Value*>> entries;
  auto lookup = [&](const c10::IValue& key) -> std::pair<c10::IValue, Value*>* {
    for (auto& entry : entries) {
      if (entry.first == key) {
        return &entry;
      }
    }
    return nullptr;
  };
  for (size_t i = 0; i < dict->inputs().size(); i += 2) {
    c10::IValue key = *constant_key(dict->input(i));
    if (auto* entry = lookup(key)) {
      entry->second = dict->input(i + 1);  // a repeated key: the last one wins, as in Python
    } else {
      entries.emplace_back(key, dict->input(i + 1));
    }
  }
  std::vector<Node*> done;
  for (Node* n = dict->next(); n != dict->owningBlock()->return_node(); n = n->next()) {
    if (n->inputs().empty() || n->input(0) != dict->output()) {
      continue;
    }
    c10::IValue key = *constant_key(n->input(1));
    if (is_kind(n, "aten::_set_item")) {
      if (auto* entry = lookup(key)) {
        entry->second = n->input(2);
      } else {
        entries.emplace_back(key, n->input(2));
      }
    } else {
      n->output()->replaceAllUsesWith(lookup(key)->second);
    }
    done.push_back(n);
  }
  for (Node* n : done) {
    n->destroy();
  }
  dict->destroy();
}

// --- lists grown by append -----------------------------------------------------------------

bool foldable_list(Node* list) {
  bool appended = false;
  for (const Use& use : list->output()->uses()) {
    if (use.user->owningBlock() != list->owningBlock()) {
      return false;
    }
    if (is_kind(use.user, "aten::append") && use.offset == 0) {
      appended = true;
      continue;
    }
    if (!only_reads(use)) {
      return false;
    }
  }
  return appended;
}

// Rewrites the first append of `list`; its later uses see a new, longer ListConstruct.
void fold_first_append(Graph& graph, Node* list) {
  Node* append = nullptr;
  for (Node* n = list->next(); n != list->owningBlock()->return_node(); n = n->next()) {
    if (is_kind(n, "aten::append") && n->input(0) == list->output()) {
      append = n;
      break;
    }
  }
  std::vector<Value*> elements(list->inputs().begin(), list->inputs().end());
  elements.push_back(append->input(1));
  torch::jit::WithInsertPoint guard(append);
  Node* longer = graph.insertNode(graph.create(c10::prim::ListConstruct, elements));
  longer->output()->setType(list->output()->type());
  longer->copyMetadata(list);
  append->output()->replaceAllUsesWith(longer->output());
  list->output()->replaceAllUsesAfterNodeWith(append, longer->output());
  append->destroy();
  if (!list->hasUses()) {
    list->destroy();
  }
}

bool fold_once(Graph& graph, Block* block) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      if (fold_once(graph, sub)) {
        return true;
      }
    }
    if (node->kind() == c10::prim::DictConstruct && foldable_dict(node)) {
      fold_dict(node);
      return true;
    }
    if (node->kind() == c10::prim::ListConstruct && foldable_list(node)) {
      fold_first_append(graph, node);
      return true;
    }
  }
  return false;
}

}  // namespace

int fold_structures(const std::shared_ptr<Graph>& graph) {
  int folded = 0;
  while (fold_once(*graph, graph->block())) {
    ++folded;
  }
  return folded;
}

}  // namespace blade::passes
