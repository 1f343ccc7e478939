// In-place writes into tensors the graph does not own become functional values and
// explicit write-backs:
//
//   %r = aten::add_(%x, %y, %one)           %x1 = aten::type_as(aten::add(%x, %y, %one), %x)
//   %z = aten::mul(%r, %two)          ==>   %w = blade::write_back(%x, %x1)
//   return (%z, %x)                         %z = aten::mul(%x1, %two)
//                                           return (%z, %x)
//
// %x is a graph input or a module attribute read in the graph's top block (a running
// statistic, a state updated in place): a value the caller sees after the call. Any
// in-place aten op whose functional twin (the same name without the trailing underscore,
// same overload and arguments) returns a fresh tensor is rewritten, its value cast to %x's
// dtype as the in-place op's is; copy_/fill_ write a copy of their value cast and expanded
// to the destination. Writes that change a tensor's sizes or storage (resize_, set_,
// unsqueeze_, ...) stay.
//
// Writes of a few elements (index_put_, index_copy_, scatter_, ... and writes through
// views, `cache[:, :, t:t+1] = k`): eager writes what they change in place, where a new value
// and its write-back would copy the whole tensor twice (a decoding step's KV-cache update
// would cost more than its attention). Writes through views stay; the others are rewritten
// only into tensors of at most `small_writes` elements, in a run once types are known
// (their twins keep the tensor's dtype and sizes, so the new values' types are known too).
//
// The functional value is ordinary compute, which clusters take. `blade::write_back(self,
// value)` copies it into `self` as the in-place op did (ral/register.cpp: it raises as
// eager does when the shape differs), and an engine whose result is written back right
// after it does that write itself (engine_call.h: absorbable_write_backs), so compiled code
// can update a caller's tensor.
//
// Reads of %x after a write into %x itself read %x1 instead while nothing may have written
// to %x since (AliasDb, except that a graph input written into is taken to share no memory
// with other inputs: the input guard admits no inputs that do, ral/guard.h), so they join
// the computing cluster; views and lists of %x read that way must be read before the next
// write, and reads that keep a reference (the graph's results, containers) keep %x, which
// holds the new values once the write-back ran. A second write into %x reads %x1 as well,
// and the first write-back goes when nothing could have read %x between the two.
// Write-backs then move down past the nodes that neither read nor write their tensor, so
// that what is computed between them can join one cluster. Only writes in the graph's top
// block are rewritten; the rest stay TorchScript.
#pragma once

#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>

namespace blade::passes {

// The kind of the write-back nodes (the op is registered by the runtime, ral/register.cpp).
c10::Symbol write_back_kind();

// Returns how many writes were rewritten. With `small_writes` 0, all but writes of a few
// elements (before types are known); with `small_writes` > 0, writes of a few elements
// into tensors of at most that many elements (types known).
int functionalize_input_writes(const std::shared_ptr<torch::jit::Graph>& graph,
                               int64_t small_writes = 0);

// Once types are known: raises, as the in-place op would have, where the functional value's
// dtype cannot be cast to the dtype of the tensor it is written into (int_x.add_(0.5)); the
// casts the rewrite made (aten::type_as, marked with the op's name) lose their mark.
void check_in_place_casts(const std::shared_ptr<torch::jit::Graph>& graph);

// The attribute that marks those casts.
c10::Symbol in_place_cast_attribute();

// Whether `node` (and its blocks) neither reads nor may write the tensor %root, a graph
// input or module attribute that the graph writes into: AliasDb's answer, except that a
// written graph input shares no memory with other inputs (the guard's promise, above) and
// an engine writes only into the tensors it is given.
bool leaves_alone(torch::jit::Node* node, torch::jit::Value* root,
                  const torch::jit::AliasDb& db);

}  // namespace blade::passes
