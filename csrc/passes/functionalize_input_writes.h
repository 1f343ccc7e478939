// In-place writes into tensors the graph does not own become functional values and
// explicit write-backs:
//
//   %r = aten::add_(%x, %y, %one)           %x1 = aten::add(%x, %y, %one)
//   %z = aten::mul(%r, %two)          ==>   %w = blade::write_back(%x, %x1)
//   return (%z, %x)                         %z = aten::mul(%x1, %two)
//                                           return (%z, %x)
//
// %x is a graph input or a module attribute read in the graph's top block (a KV cache, a
// running statistic): a value the caller sees after the call. The write may go through a
// chain of slices and selects of it (`x[:, 2:4] = v`, `x[0].fill_(0)`, `x[1:].mul_(2)`):
// the new value of %x is then the written view scattered back up the chain (the pieces
// of functionalize_view_writes). Any in-place aten op whose functional twin (the same
// name without the trailing underscore, same overload and arguments) returns a fresh
// tensor is rewritten; copy_/fill_ write their value cast and expanded to the destination,
// `_index_put_impl_` becomes `index_put`. Writes that change a tensor's metadata (resize_,
// unsqueeze_, ...) have no such twin and stay.
//
// The functional value is ordinary compute, which clusters take. `blade::write_back(self,
// value)` copies it into %x as the in-place op did (ral/register.cpp: it raises as eager
// does when the value's dtype cannot be cast to %x's or its shape differs), and an engine
// whose result is written back right after it does that write itself
// (engine_call.h: absorb_write_backs), so compiled code can update a caller's tensor.
//
// Reads of %x after the write-back read %x1 instead while nothing may have written to %x
// since (AliasDb, except that a graph input written into is taken to share no memory with
// other inputs: the input guard admits no inputs that do, ral/guard.h), so they join the
// computing cluster;
// reads that keep a reference (views of %x, the graph's results, containers) keep %x,
// which holds the new values once the write-back ran. A second write into %x reads %x1 as
// well, and the first write-back goes when nothing could have read %x between the two.
// Write-backs then move down past the nodes that neither read nor write their tensor, so
// that what is computed between them can join one cluster (a decoder step's KV-cache
// writes and its attention).
// Only writes in the graph's top block are rewritten; the rest stay TorchScript.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// The kind of the write-back nodes (the op is registered by the runtime, ral/register.cpp).
c10::Symbol write_back_kind();

// Returns how many writes were rewritten.
int functionalize_input_writes(const std::shared_ptr<torch::jit::Graph>& graph);

// Once types are known: raises, as the in-place op would have, where the functional value's
// dtype cannot be cast to the dtype of the tensor it is written into (int_x.add_(0.5)); the
// casts the rewrite made (aten::type_as, marked with the op's name) lose their mark.
void check_in_place_casts(const std::shared_ptr<torch::jit::Graph>& graph);

// The attribute that marks those casts.
c10::Symbol in_place_cast_attribute();

}  // namespace blade::passes
