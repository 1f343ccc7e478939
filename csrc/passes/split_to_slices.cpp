#include "passes/split_to_slices.h"

#include "passes/uses.h"

#include <torch/csrc/jit/ir/constants.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace blade::passes {
namespace {

using torch::jit::Block;
using torch::jit::Node;
using torch::jit::Value;

std::optional<int64_t> constant_int(Value* v) {
  auto ivalue = torch::jit::toIValue(v);
  if (!ivalue || !ivalue->isInt()) {
    return std::nullopt;
  }
  return ivalue->toInt();
}

// An int[] constant, or a prim::ListConstruct of int constants.
std::optional<std::vector<int64_t>> constant_ints(Value* v) {
  if (v->node()->kind() == c10::prim::ListConstruct) {
    std::vector<int64_t> values;
    for (Value* item : v->node()->inputs()) {
      auto x = constant_int(item);
      if (!x) return std::nullopt;
      values.push_back(*x);
    }
    return values;
  }
  auto ivalue = torch::jit::toIValue(v);
  if (!ivalue || !ivalue->isIntList()) {
    return std::nullopt;
  }
  return ivalue->toIntVector();
}

// The overload name of a node calling an aten op ("Tensor" for aten::split.Tensor).
std::optional<std::string> overload(Node* node) {
  const auto* schema = node->maybeSchema();
  if (schema == nullptr) return std::nullopt;
  return schema->overload_name();
}

// The split's input, dim (normalized) and the size of that dim, when all are known.
struct SplitSource {
  Value* self;
  int64_t dim;
  int64_t extent;
};

std::optional<SplitSource> source_of(Node* node, Value* dim_value) {
  Value* self = node->input(0);
  auto type = self->type()->cast<c10::TensorType>();
  auto dim = dim_value ? constant_int(dim_value) : std::optional<int64_t>(node->i(c10::attr::dim));
  if (!type || !dim || !type->sizes().size()) {
    return std::nullopt;
  }
  const int64_t rank = static_cast<int64_t>(*type->sizes().size());
  int64_t d = *dim < 0 ? *dim + rank : *dim;
  if (d < 0 || d >= rank) {
    return std::nullopt;
  }
  auto extent = type->sizes()[d];
  if (!extent) {
    return std::nullopt;
  }
  return SplitSource{self, d, *extent};
}

// `extent` cut into pieces of `size`, the last one shorter (aten::split's definition).
std::vector<int64_t> pieces_of(int64_t extent, int64_t size) {
  std::vector<int64_t> lengths;
  for (int64_t start = 0; start < extent; start += size) {
    lengths.push_back(std::min(size, extent - start));
  }
  return lengths;
}

// aten::chunk's definition: pieces of ceil(extent / chunks).
std::vector<int64_t> chunk_lengths(int64_t extent, int64_t chunks) {
  return pieces_of(extent, (extent + chunks - 1) / chunks);
}

constexpr size_t kAnyCount = static_cast<size_t>(-1);

// Piece lengths along the dim, following each op's definition; nullopt when unknown, or
// when `pieces` (unless kAnyCount) differs from their number.
std::optional<std::vector<int64_t>> piece_lengths(Node* node, SplitSource* source,
                                                  size_t pieces) {
  const auto kind = node->kind();
  std::optional<SplitSource> src;
  std::vector<int64_t> lengths;
  if (kind == c10::prim::ConstantChunk) {
    src = source_of(node, nullptr);
    if (!src) return std::nullopt;
    lengths = chunk_lengths(src->extent, node->i(c10::attr::chunks));
  } else if (kind == c10::aten::chunk && overload(node) == std::string("")) {
    src = source_of(node, node->input(2));
    auto chunks = constant_int(node->input(1));
    if (!src || !chunks || *chunks <= 0) return std::nullopt;
    lengths = chunk_lengths(src->extent, *chunks);
  } else if (kind == c10::aten::split && overload(node) == std::string("Tensor")) {
    src = source_of(node, node->input(2));
    auto size = constant_int(node->input(1));
    if (!src || !size || *size <= 0) return std::nullopt;
    lengths = pieces_of(src->extent, *size);
  } else if ((kind == c10::aten::split_with_sizes && overload(node) == std::string("")) ||
             (kind == c10::aten::split && overload(node) == std::string("sizes"))) {
    src = source_of(node, node->input(2));
    auto sizes = constant_ints(node->input(1));
    if (!src || !sizes) return std::nullopt;
    int64_t total = 0;
    for (int64_t s : *sizes) {
      if (s < 0) return std::nullopt;
      total += s;
    }
    if (total != src->extent) return std::nullopt;
    lengths = *sizes;
  } else {
    return std::nullopt;
  }
  if (pieces != kAnyCount && lengths.size() != pieces) {
    return std::nullopt;  // the unpack disagrees with the sizes: leave it to fail as before
  }
  *source = *src;
  return lengths;
}

bool rewrite_unbind(Node* node, Node* unpack) {
  if (overload(node) != std::string("int")) {
    return false;
  }
  auto src = source_of(node, node->input(1));
  if (!src || static_cast<size_t>(src->extent) != unpack->outputs().size()) {
    return false;
  }
  auto* graph = node->owningGraph();
  torch::jit::WithInsertPoint guard(node);
  for (size_t i = 0; i < unpack->outputs().size(); ++i) {
    Value* select = graph->insert(c10::aten::select,
                                  {src->self, src->dim, static_cast<int64_t>(i)});
    select->setType(unpack->output(i)->type());
    unpack->output(i)->replaceAllUsesWith(select);
  }
  unpack->destroy();
  node->destroy();
  return true;
}

// Replaces each piece with a slice of the source along the dim.
void replace_pieces(Node* node, const SplitSource& src, const std::vector<int64_t>& lengths,
                    at::ArrayRef<Value*> pieces) {
  auto* graph = node->owningGraph();
  torch::jit::WithInsertPoint guard(node);
  int64_t start = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t end = start + lengths[i];
    Value* slice = graph->insert(c10::aten::slice,
                                 {src.self, src.dim, start, end, static_cast<int64_t>(1)});
    slice->setType(pieces[i]->type());
    pieces[i]->replaceAllUsesWith(slice);
    start = end;
  }
}

bool rewrite_list(Node* node);

bool rewrite(Node* node) {
  SplitSource src{};
  if (node->kind() == c10::prim::ConstantChunk) {
    // Its pieces are its outputs; there is no list.
    auto lengths = piece_lengths(node, &src, node->outputs().size());
    if (!lengths) {
      return false;
    }
    replace_pieces(node, src, *lengths, node->outputs());
    node->destroy();
    return true;
  }
  if (node->outputs().size() != 1) {
    return false;
  }
  Node* unpack = node->output()->uses().size() == 1 ? node->output()->uses()[0].user : nullptr;
  if (unpack == nullptr || unpack->kind() != c10::prim::ListUnpack) {
    return rewrite_list(node);
  }
  if (node->kind() == c10::aten::unbind) {
    return rewrite_unbind(node, unpack);
  }
  auto lengths = piece_lengths(node, &src, unpack->outputs().size());
  if (!lengths) {
    return false;
  }
  replace_pieces(node, src, *lengths, unpack->outputs());
  unpack->destroy();
  node->destroy();
  return true;
}

// A split whose list is only read (indexed, measured, sliced, iterated, concatenated):
// the list becomes a prim::ListConstruct of the slices, which PyTorch's list peepholes and
// constant loop unrolling can see through.
bool rewrite_list(Node* node) {
  for (const auto& use : node->output()->uses()) {
    if (!only_reads(use)) {
      return false;
    }
  }
  auto* graph = node->owningGraph();
  std::vector<Value*> pieces;
  SplitSource src{};
  auto self_type = node->input(0)->type()->cast<c10::TensorType>();
  if (!self_type || !self_type->sizes().concrete_sizes()) {
    return false;  // every size is needed for the pieces' types
  }
  if (node->kind() == c10::aten::unbind) {
    if (overload(node) != std::string("int")) {
      return false;
    }
    auto unbound = source_of(node, node->input(1));
    if (!unbound || !self_type) {
      return false;
    }
    src = *unbound;
    torch::jit::WithInsertPoint guard(node);
    for (int64_t i = 0; i < src.extent; ++i) {
      pieces.push_back(graph->insert(c10::aten::select, {src.self, src.dim, i}));
    }
  } else {
    auto lengths = piece_lengths(node, &src, kAnyCount);
    if (!lengths || !self_type) {
      return false;
    }
    torch::jit::WithInsertPoint guard(node);
    int64_t start = 0;
    for (int64_t length : *lengths) {
      Value* slice = graph->insert(c10::aten::slice,
                                   {src.self, src.dim, start, start + length, int64_t{1}});
      auto sizes = *self_type->sizes().concrete_sizes();
      sizes[src.dim] = length;
      slice->setType(self_type->withSizes(sizes));
      pieces.push_back(slice);
      start += length;
    }
  }
  if (node->kind() == c10::aten::unbind) {
    auto sizes = *self_type->sizes().concrete_sizes();
    sizes.erase(sizes.begin() + src.dim);
    for (Value* piece : pieces) {
      piece->setType(self_type->withSizes(sizes));
    }
  }
  torch::jit::WithInsertPoint guard(node);
  Node* list = graph->insertNode(graph->create(c10::prim::ListConstruct, pieces));
  list->output()->setType(node->output()->type());
  node->output()->replaceAllUsesWith(list->output());
  node->destroy();
  return true;
}

void collect(Block* block, std::vector<Node*>* splits) {
  for (Node* node : block->nodes()) {
    for (Block* sub : node->blocks()) {
      collect(sub, splits);
    }
    const auto kind = node->kind();
    if (kind == c10::prim::ConstantChunk || kind == c10::aten::split ||
        kind == c10::aten::split_with_sizes || kind == c10::aten::chunk ||
        kind == c10::aten::unbind) {
      splits->push_back(node);
    }
  }
}

}  // namespace

int split_to_slices(const std::shared_ptr<torch::jit::Graph>& graph) {
  // Collected first: a rewrite destroys the split and its unpack, never another split.
  std::vector<Node*> splits;
  collect(graph->block(), &splits);
  int rewritten = 0;
  for (Node* node : splits) {
    rewritten += rewrite(node) ? 1 : 0;
  }
  return rewritten;
}

}  // namespace blade::passes
