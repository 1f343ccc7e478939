// Engine: one compiled cluster, as a TorchScript custom class (torch.classes.blade.Engine).
//
// An engine holds the cluster's native code, its input and output specs, the constant
// tensors the code reads (params), and the cluster's original TorchScript subgraph. The code
// is mapped only after every field was validated and the engine's Ed25519 signature, over
// the code and everything the runtime trusts about it (see signed_digest), verified against
// a key this process trusts (ral/signing.h). `execute` runs the code when the inputs match
// the specs and autograd need not follow them; otherwise it runs the subgraph (or raises,
// when the engine was built with fallback mode "error"). The engine
// keeps no per-call state in shared fields except atomic counters and a mutex-guarded
// reason, so one engine can serve many threads at once.
#pragma once

#include "ral/compiled_code.h"
#include "ral/prepared_weights.h"
#include "ral/signing.h"
#include "ral/slow_path.h"
#include "ral/tensor_spec.h"

#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::jit {
struct GraphFunction;
}

namespace blade::ral {

// Bumped whenever the pickled layout, what is signed or the generated code's ABI changes.
// Version 2: engines with dynamic output sizes get their outputs from the code (see
// run_compiled). Version 3: engines are signed (the FNV checksum is gone).
constexpr int64_t kEngineFormatVersion = 3;

enum class FallbackMode { kFallback, kError };

struct EngineStats {
  int64_t calls = 0;
  int64_t fallbacks = 0;
};

class Engine : public torch::CustomClassHolder {
 public:
  Engine(std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
         std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
         std::string cpu_features, std::string signature, std::string precision,
         std::string writes = "", const Digest* computed_digest = nullptr);
  // What the compiler makes (blade._C, never TorchScript): the engine signed with the key at
  // `key_path` (this machine's, created on first use, when empty). Its digest is computed
  // once, for the signature and the verification both: hashing a large model's weights
  // takes a noticeable time.
  static c10::intrusive_ptr<Engine> create_signed(
      std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
      std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
      std::string cpu_features, std::string precision, const std::string& key_path,
      std::string writes = "");
  // The same, for fields, params and code whose digest (`digest()` of an engine made of the
  // same ones) the caller already has: nothing is hashed again. The model cache
  // (python/blade/model_cache.py) knows it for the engines of a model whose weights it
  // found unchanged; a wrong digest gives an engine whose saved form does not verify.
  static c10::intrusive_ptr<Engine> create_with_digest(
      std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
      std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
      std::string cpu_features, std::string precision, const std::string& key_path,
      std::string writes, const Digest& digest);
  ~Engine() override;

  // The outputs on `inputs` (by the code, or by the subgraph when the code cannot take
  // them), after the write-backs (`writes`) copied outputs into inputs.
  std::vector<at::Tensor> execute(const std::vector<at::Tensor>& inputs);
  // The cluster's TorchScript subgraph on `inputs`, whatever the fallback mode, without
  // counting a call: what the compiled code is compared with (`blade bisect`).
  std::vector<at::Tensor> run_subgraph(const std::vector<at::Tensor>& inputs);
  // The compiled code alone on `inputs`, without counting a call: raises where `execute`
  // would fall back (no code, inputs of another signature, a kernel error). What the
  // compile-time check compares with `run_subgraph`.
  std::vector<at::Tensor> run_code(const std::vector<at::Tensor>& inputs);

  const std::string& name() const { return name_; }
  std::string input_specs() const { return format_specs(input_specs_); }
  std::string output_specs() const { return format_specs(output_specs_); }
  const std::string& fallback_ir() const { return fallback_ir_; }
  const std::string& cpu_features() const { return cpu_features_; }
  // "float32", or "bf16": GEMMs and convolutions by the engine's weights run in bfloat16
  // with float32 accumulation (convolutions where their precision trials find it faster:
  // prepared_weights.h); needs avx512_bf16.
  const std::string& precision() const { return precision_; }
  // "ed25519:<public key>:<signature>", as saved (empty when unsigned).
  const std::string& signature() const { return signature_; }
  // The digest the signature verified against (signed_digest); nullopt when it did not
  // verify (or the fields were invalid).
  const std::optional<Digest>& digest() const { return digest_; }
  // "o:i;o:i...": after each call, output o is written into input i (a caller's tensor that
  // an in-place op updated; passes/functionalize_input_writes.h), in this order; empty
  // when the engine writes into none.
  std::string writes() const;
  bool is_compiled() const { return code_ready_.load(std::memory_order_acquire); }
  // Why the compiled code is not in use (empty when it is).
  std::string load_error() const;
  EngineStats stats() const;
  // The constant tensors the code reads; the graph around the engine reads its weights
  // from here too, so that a saved model holds each weight once.
  // Reading them puts back any weight the engine released (prepared_weights.h) and keeps
  // them all plain from then on.
  const std::vector<at::Tensor>& params() const;
  at::Tensor param(int64_t index) const;
  // The bytes of param memory given back because only the weights' oneDNN copies are read
  // (prepared_weights.h).
  int64_t released_bytes() const { return prepared_weights_->released_bytes(); }
  // Weights the code multiplies by through a packed copy (one per weight and row count).
  int64_t packed_weights() const { return prepared_weights_->packed_count(); }
  // The bytes of those copies (and of channels_last weight copies).
  int64_t prepared_bytes() const { return prepared_weights_->prepared_bytes(); }
  // Which kernel each of its kernel trials kept, one line per weight and input size
  // (PreparedWeights::kernel_choices).
  std::vector<std::string> kernel_choices() const {
    return prepared_weights_->kernel_choices();
  }
  std::string last_fallback_reason() const;
  // The calls that ran the subgraph, by kind of reason (the first reason of each kind).
  std::vector<std::pair<std::string, int64_t>> fallback_reasons() const {
    return slow_path_.counts();
  }
  // Whether the latest call ran the compiled code (true before any call).
  bool last_call_compiled() const { return is_compiled() && slow_path_.last_call_compiled(); }

  // The pickled form. Its shape never changes between format versions, so that a model saved
  // by a newer Blade still loads here and can fall back to its subgraph: (format version,
  // name, fallback mode, fallback IR, params, input specs, output specs, meta, code), where
  // meta is "key=value" lines (blade_version, cpu_features, signature, precision when not
  // float32, writes when any) that versions may extend.
  using State = std::tuple<int64_t, std::string, std::string, std::string, std::vector<at::Tensor>,
                           std::string, std::string, std::string, at::Tensor>;
  State serialize() const;
  static c10::intrusive_ptr<Engine> deserialize(State state);

 private:
  // What the signature covers: a SHA-256 over the format version, name, fallback mode,
  // fallback IR, specs (as formatted), CPU features, the precision when not float32, the
  // writes when any, each
  // param's dtype, sizes and bytes, and `code`, the code's own digest (see sign_engine;
  // defined with it, in signing.cpp).
  Digest signed_digest(const Digest& code) const;
  // Validates everything the code will rely on, verifies the signature (over
  // `computed_digest` when the caller computed it over these same fields, else over one
  // computed here), checks the CPU, and only then maps the code; records why not in
  // load_error_.
  void load_code(const Digest* computed_digest);
  // Checks the CPU and maps the code (of digest `code`) whose signature verified; why
  // not, or empty.
  std::string load_verified_code(const Digest& code);
  // An engine whose key was not trusted when it loaded loads its code on the first call
  // after the key is trusted (blade.trust_key, blade::ral::trust_public_key): whether the
  // code is now in use. One atomic read while the key set has not changed.
  bool load_now_trusted();
  std::string validation_error() const;
  // The writes of the text `writes()` gives, checked against the subgraph's arity (raises:
  // an engine whose writes cannot hold cannot run its subgraph either).
  std::vector<std::pair<size_t, size_t>> parse_writes(const std::string& text) const;
  std::vector<at::Tensor> run_compiled(const std::vector<at::Tensor>& inputs);
  // The code's outputs on `inputs`; a kernel's error (the outputs then unspecified) in
  // `kernel_error`.
  std::vector<at::Tensor> call_code(const std::vector<at::Tensor>& inputs,
                                    std::string* kernel_error);
  // The outputs the code returned (dynamic engines), as tensors that own their memory.
  std::vector<at::Tensor> adopt_results(const std::vector<int64_t>& results) const;
  // Runs the subgraph (or raises, in fallback mode "error"), counting the call and saying
  // it once per kind of reason (slow_path.h).
  std::vector<at::Tensor> run_fallback(const std::vector<at::Tensor>& inputs,
                                       const std::string& reason, SlowPathKind kind,
                                       int64_t input = -1);
  std::vector<at::Tensor> compute(const std::vector<at::Tensor>& inputs);

  std::string name_;
  at::Tensor code_bytes_;  // uint8, the shared library's bytes
  std::vector<TensorSpec> input_specs_;
  std::vector<TensorSpec> output_specs_;
  // Some output size is only known once the code has run: the code allocates the outputs
  // (through the RAL, from PyTorch's allocator) and returns them.
  bool returns_outputs_ = false;
  std::string fallback_ir_;
  std::vector<at::Tensor> params_;
  // Weights packed for MKL's GEMM on first use (see prepared_weights.h).
  std::unique_ptr<PreparedWeights> prepared_weights_;
  FallbackMode fallback_mode_;
  std::string cpu_features_;
  std::string signature_;
  std::optional<Digest> digest_;
  std::string precision_;
  std::vector<std::pair<size_t, size_t>> writes_;  // (output, input)

  // Shared by the engines whose code is byte-identical (see CompiledCode::load_shared).
  std::shared_ptr<CompiledCode> code_;
  // Set (release) once code_ is in place; code_ never changes after. Calls read this
  // first, so that code loaded late, on another thread, is seen whole.
  std::atomic<bool> code_ready_{false};
  std::string load_error_;  // guarded by reason_mutex_ once the engine is shared
  std::string untrusted_key_;  // the signing key, when that alone kept the code out
  std::atomic<uint64_t> trust_version_seen_{0};
  std::mutex late_load_mutex_;
  std::shared_ptr<torch::jit::GraphFunction> fallback_fn_;

  // Calls of the code hold it shared; releasing plain weights holds it alone, so that no
  // kernel is reading a weight as its memory is given back.
  mutable std::shared_mutex code_mutex_;

  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> fallbacks_{0};
  mutable std::mutex reason_mutex_;
  std::string last_fallback_reason_;
  SlowPathLog slow_path_;
};

// The fallback mode `mode` names: "fallback" or "error"; raises on anything else.
FallbackMode parse_fallback_mode(const std::string& mode);

// What blade::write_back does, and an engine's write of an output into an input: `value`
// copied into `self`, raising as eager's in-place ops do when its dtype cannot be cast to
// self's or its shape is not self's.
void write_back(const at::Tensor& self, const at::Tensor& value);

}  // namespace blade::ral
