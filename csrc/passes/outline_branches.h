// outline_branches: the large branches of a method's ifs become functions, saved in files of
// a few functions each, so that loading the saved model costs time and memory linear in its
// code.
//
//   %y = prim::If(%c)                          %e = prim::GetAttr[name="blade_engine_0"](%self)
//     block0():                                %y = prim::If(%c)
//       %e = prim::GetAttr[...](%self)   ==>     block0():
//       %w = prim::CallMethod[name="param"](%e)    %r = prim::CallFunction(%branch, %x, %e)
//       %a = aten::mul(%x, %w)                     -> (%r)
//       ...
//       -> (%z)
//
// torch.jit.load compiles a saved model's code again from its source. For every variable
// one branch of an if defines and the other does not, TorchScript's frontend keeps an
// error message in case the variable is read later, with its own copy of the whole source
// file (torch/csrc/jit/frontend/ir_emitter.cpp, emitIfElseBlocks; files over 512 KB are
// spared). Model code keeps branches the example inputs never took (nn.MultiheadAttention's
// slow path, the unspecialized graph under the input guard): a 12-layer encoder's forward,
// with thousands of such variables, took seconds and gigabytes of memory to compile at
// load. An outlined branch defines only its results, in both branches, and its body is
// compiled from a small file; TorchScript inlines the call again before running.
//
// A branch is outlined when it holds more than `min_nodes` nodes (constants not counted),
// no blade::execute(_writing) (the engines' calls stay in the method's graph, where the
// report and
// the debug tools find them), and uses the module only to read attributes that are no
// modules (engines, the guard): those reads move before the if and their values, like
// every other value the branch reads from outside, become the function's arguments
// (constants are copied in). Its results are the function's result (a tuple when there are
// several). Inner branches are outlined first.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <memory>

namespace blade::passes {

// The graph of a method of a module (input 0 is the module); returns how many branches
// became functions.
int64_t outline_branches(const std::shared_ptr<torch::jit::Graph>& graph, int64_t min_nodes);

}  // namespace blade::passes
