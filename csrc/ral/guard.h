// Guard: what the optimized graph as a whole assumes about its inputs
// (torch.classes.blade.Guard).
//
// blade.optimize specializes the model's graph to its example inputs: sizes of static
// dims become constants, reshapes and splits are computed with them, types carry them.
// An engine's own check protects its code, but not the TorchScript around it, nor its
// fallback subgraph, which were specialized too. So the optimized forward starts with a
// guard: inputs that match the specs (dtype, rank, device, static dims, and equal sizes
// for dims that share a symbol) run the optimized graph; anything else runs the model's
// graph as it was before specialization (or raises, in fallback mode "error").
//
// Inputs the optimized graph writes into (in-place ops on the caller's tensors, see
// passes/functionalize_input_writes.h) are marked `!` in the specs: the optimized graph
// computes their new values from the values the inputs held when it started, which is
// eager's result only when no other input shares their memory; the guard admits such
// inputs only when the bytes they span overlap no other input's. Counters
// are atomic and the reason is mutex-guarded, so one guard serves many threads.
#pragma once

#include "ral/slow_path.h"
#include "ral/tensor_spec.h"

#include <torch/custom_class.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace blade::ral {

class Guard : public torch::CustomClassHolder {
 public:
  // `input_specs`: one spec per tensor input of the graph, in order (see tensor_spec.h),
  // each that the graph writes into marked with a leading `!`.
  Guard(std::string input_specs, std::string fallback_mode);

  // Whether `inputs` may run the specialized graph; counts the call, and the fallback when
  // not. Raises instead, naming what differs, when built with fallback mode "error".
  bool admits(const std::vector<at::Tensor>& inputs);

  std::string input_specs() const;
  int64_t calls() const { return calls_.load(); }
  int64_t fallbacks() const { return fallbacks_.load(); }
  std::string last_fallback_reason() const;
  // The refused calls by kind of reason (the first reason of each kind), and whether the
  // latest call was admitted (true before any call).
  std::vector<std::pair<std::string, int64_t>> fallback_reasons() const {
    return slow_path_.counts();
  }
  bool last_call_admitted() const { return slow_path_.last_call_compiled(); }

  using State = std::tuple<int64_t, std::string, std::string>;  // (version, specs, mode)
  State serialize() const;
  static c10::intrusive_ptr<Guard> deserialize(State state);

 private:
  // Why `inputs` break the assumption of the `!` inputs (empty when they do not).
  std::string overlap(const std::vector<at::Tensor>& inputs) const;

  std::vector<TensorSpec> specs_;
  std::vector<bool> written_;  // per spec: marked `!`
  bool raise_ = false;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> fallbacks_{0};
  mutable std::mutex reason_mutex_;
  std::string last_fallback_reason_;
  SlowPathLog slow_path_;
};

}  // namespace blade::ral
