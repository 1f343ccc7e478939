// Small questions about how a value is used, shared by the passes.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// The user reads the value through this use without writing it or keeping a reference to
// it: its schema argument carries no alias annotation. prim::ListUnpack, and
// aten::__getitem__ of a container (annotated because its result aliases an element, not
// because it keeps the container), only read too.
inline bool only_reads(const torch::jit::Use& use) {
  if (use.user->kind() == c10::prim::ListUnpack ||
      (use.user->kind() == c10::aten::__getitem__ && use.offset == 0)) {
    return true;
  }
  const c10::FunctionSchema* schema = use.user->maybeSchema();
  if (schema == nullptr || use.offset >= schema->arguments().size()) {
    return false;
  }
  return schema->arguments()[use.offset].alias_info() == nullptr;
}

}  // namespace blade::passes
