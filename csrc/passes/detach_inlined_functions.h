// Every inlined call stack of `graph` names its functions by pointers that outlive the
// functions' owners.
//
// A node inlined from a module method keeps a call stack (InlinedCallStack) of raw
// `Function*` to the methods it came from. Freezing removes those methods from their
// compilation unit, and TorchScript's interpreter reads the pointers again when an op of
// the graph raises, to print the TorchScript traceback: a frozen model whose op raises read
// freed memory there, and crashed the process once the memory had been reused (a 12-layer
// encoder probed with a resized feature dim, after another traced copy had run). This pass
// rebuilds each call stack with the same names, source ranges and module instances, over
// placeholder functions of those names that live as long as the process (one per name).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// Returns how many nodes' call stacks were rebuilt.
int detach_inlined_functions(const std::shared_ptr<torch::jit::Graph>& graph);

}  // namespace blade::passes
