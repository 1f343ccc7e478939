// outline_branches: the large branches of a method's ifs become methods of its module, so
// that loading the saved model does not cost time and memory quadratic in its code.
//
//   %y = prim::If(%c)                          %y = prim::If(%c)
//     block0():                                  block0():
//       %a = aten::mul(%x, %x)          ==>        %r = prim::CallMethod[name="blade_branch_0"](%self, %x)
//       ...                                        -> (%r)
//       -> (%z)
//
// torch.jit.load compiles a saved model's code again from its source. For every variable
// one branch of an if defines and the other does not, TorchScript's frontend keeps an
// error message in case the variable is read later, with its own copy of the whole source
// file (torch/csrc/jit/frontend/ir_emitter.cpp, emitIfElseBlocks; files over 512 KB are
// spared). Model code keeps branches the example inputs never took (nn.MultiheadAttention's
// slow path, the unspecialized graph under the input guard): a 12-layer encoder's forward,
// 320 KB with about 5000 such variables, took 3.9 s and 1.5 GB of memory to compile at
// load. An outlined branch defines only its results, in both branches, so the frontend
// keeps nothing for it; TorchScript inlines the call again before running the graph.
//
// A branch is outlined when it holds more than `min_nodes` nodes (constants not counted)
// and no blade::execute: the engines' calls stay in the graph, where the report and the
// debug tools find them. Inner branches are outlined first. Values the branch reads from
// outside become the method's arguments (constants are copied in); its results are the
// method's result (a tuple when there are several).
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace blade::passes {

// The graph of a method of a module (input 0 is the module); returns how many branches
// became methods.
int64_t outline_branches(const std::shared_ptr<torch::jit::Graph>& graph, int64_t min_nodes);

}  // namespace blade::passes
