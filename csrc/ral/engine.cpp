#include "ral/engine.h"

#include <ATen/CPUGeneratorImpl.h>
#include <optional>

#include "ral/call_profile.h"
#include "ral/cpu_features.h"
#include "ral/fused_attention.h"
#include "ral/int8_kernels.h"
#include "ral/kernel_trials.h"
#include "ral/ral_abi.h"
#include "ral/kernel_errors.h"
#include "ral/text.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/irparser.h>

#include <map>
#include <sstream>

#ifndef BLADE_VERSION
#define BLADE_VERSION "unknown"
#endif

namespace blade::ral {
namespace {

bool is_identifier(const std::string& name) {
  return !name.empty() && name.size() <= 128 && !(name[0] >= '0' && name[0] <= '9') &&
         name.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
             std::string::npos;
}

// A decimal index below `bound`, and nothing else.
bool parse_index(const std::string& text, size_t bound, size_t* index) {
  if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *index = static_cast<size_t>(std::stoul(text));
  return *index < bound;
}

// The subgraph, typed only as far as any input would be, returning its outputs as one list
// so that the engine can run it whatever the number of outputs.
std::shared_ptr<torch::jit::GraphFunction> make_fallback_function(const std::string& name,
                                                                  const std::string& ir) {
  auto graph = std::make_shared<torch::jit::Graph>();
  torch::jit::parseIR(ir, graph.get());
  std::vector<torch::jit::Value*> outputs(graph->outputs().begin(), graph->outputs().end());
  auto* list = graph->insertNode(graph->createList(c10::TensorType::get(), outputs));
  while (!graph->outputs().empty()) {
    graph->eraseOutput(0);
  }
  graph->registerOutput(list->output());
  return std::make_shared<torch::jit::GraphFunction>(name + "_fallback", graph, nullptr);
}

// PyTorch's Allocator interface over the RAL's allocator, for the outputs of static size:
// when the caller frees such a tensor its block goes back to the buffer cache, and the
// engine's next call reuses it instead of paging in fresh memory (a 16 MB output from
// PyTorch's own allocator was faulted in on every call, as long as the compiled code's
// whole pass over it). The tensors are ordinary CPU tensors (resizable, and so on).
class CachedBlockAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* data = _mlir_memref_to_llvm_alloc(bytes);
    TORCH_CHECK(data != nullptr, "blade: out of memory for ", bytes, " bytes");
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release(void* data) { _mlir_memref_to_llvm_free(data); }
};

at::Tensor cached_output(const TensorSpec& spec) {
  static CachedBlockAllocator allocator;
  return at::detail::empty_generic(spec.sizes, &allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::CPU), spec.dtype,
                                   std::nullopt);
}

}  // namespace

FallbackMode parse_fallback_mode(const std::string& mode) {
  if (mode == "fallback") {
    return FallbackMode::kFallback;
  }
  TORCH_CHECK(mode == "error", "blade: fallback mode must be 'fallback' or 'error', got '", mode,
              "'");
  return FallbackMode::kError;
}

Engine::Engine(std::string name, at::Tensor code, std::string input_specs,
               std::string output_specs, std::string fallback_ir, std::vector<at::Tensor> params,
               std::string fallback_mode, std::string cpu_features, std::string signature,
               std::string precision, std::string writes, const Digest* computed_digest)
    : name_(std::move(name)),
      code_bytes_(code.defined() ? code.contiguous() : at::empty({0}, at::kByte)),
      fallback_ir_(std::move(fallback_ir)),
      fallback_mode_(parse_fallback_mode(fallback_mode)),
      cpu_features_(std::move(cpu_features)),
      signature_(std::move(signature)),
      precision_(std::move(precision)) {
  // Malformed specs make the code unusable, not the engine: its subgraph still runs.
  try {
    input_specs_ = parse_specs(input_specs);
    output_specs_ = parse_specs(output_specs);
  } catch (const c10::Error& e) {
    input_specs_.clear();
    output_specs_.clear();
    load_error_ = e.what_without_backtrace();
  }
  for (const auto& spec : output_specs_) {
    returns_outputs_ = returns_outputs_ || !spec.is_static();
  }
  params_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(params[i].defined() && params[i].device().is_cpu() &&
                    params[i].layout() == at::kStrided,
                "blade: engine '", name_, "': param ", i, " is ",
                params[i].defined() ? params[i].toString() : std::string("undefined"),
                ", expected a dense CPU tensor (the saved file is corrupted)");
    params_.push_back(params[i].contiguous());
  }
  prepared_weights_ = std::make_unique<PreparedWeights>(params_, precision_ == "bf16");
  try {
    // A name that is no identifier is refused by validation_error; the subgraph still runs.
    fallback_fn_ = make_fallback_function(is_identifier(name_) ? name_ : "blade_engine",
                                          fallback_ir_);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "blade: engine '", name_.substr(0, 128), "': its TorchScript subgraph "
                "does not parse, so neither it nor the compiled code can run (the saved file "
                "is corrupted): ", e.what());
  }
  writes_ = parse_writes(writes);
  load_code(computed_digest);
}

Engine::~Engine() = default;

std::vector<std::pair<size_t, size_t>> Engine::parse_writes(const std::string& text) const {
  // What the subgraph takes and returns bounds the indices: the specs may not have parsed.
  const size_t num_values = fallback_fn_->num_inputs();
  const size_t num_inputs = num_values > params_.size() ? num_values - params_.size() : 0;
  // (the function returns the subgraph's outputs as one list)
  const size_t num_outputs = fallback_fn_->graph()->outputs()[0]->node()->inputs().size();
  std::vector<std::pair<size_t, size_t>> writes;
  for (const std::string& item : text.empty() ? std::vector<std::string>() : split(text, ';')) {
    const auto colon = item.find(':');
    size_t output = 0;
    size_t input = 0;
    const bool parsed = colon != std::string::npos &&
                        parse_index(item.substr(0, colon), num_outputs, &output) &&
                        parse_index(item.substr(colon + 1), num_inputs, &input);
    // The writes are what the subgraph's caller relies on, like the subgraph itself.
    TORCH_CHECK(parsed, "blade: engine '", name_.substr(0, 128), "': its write '",
                item.substr(0, 40), "' is not 'output:input' for one of its ", num_outputs,
                " outputs and ", num_inputs, " inputs (the saved file is corrupted)");
    writes.emplace_back(output, input);
  }
  return writes;
}

std::string Engine::writes() const {
  std::string text;
  for (const auto& [output, input] : writes_) {
    text += (text.empty() ? "" : ";") + std::to_string(output) + ":" + std::to_string(input);
  }
  return text;
}

std::string Engine::validation_error() const {
  if (!is_identifier(name_)) {
    return "the engine's name is not an identifier of at most 128 characters";
  }
  if (code_bytes_.scalar_type() != at::kByte || code_bytes_.dim() != 1 ||
      !code_bytes_.device().is_cpu()) {
    return "the engine's code is " + code_bytes_.toString() + ", expected a 1-D uint8 tensor";
  }
  if (code_bytes_.numel() == 0) {
    return "the engine has no compiled code";
  }
  if (cpu_features_.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_,") !=
      std::string::npos) {
    return "the engine's CPU features are not a list of feature names";
  }
  if (precision_ != "float32" && precision_ != "bf16" && precision_ != "int8") {
    return "the engine's precision '" + precision_.substr(0, 40) +
           "' is not 'float32', 'bf16' or 'int8'";
  }
  // No inputs is fine: a cluster that draws random numbers may take none.
  if (output_specs_.empty()) {
    return "the engine's signature has no outputs";
  }
  if (input_specs_.size() + params_.size() != fallback_fn_->num_inputs()) {
    return "the engine's signature has " + std::to_string(input_specs_.size()) +
           " inputs and " + std::to_string(params_.size()) + " params, but its subgraph takes " +
           std::to_string(fallback_fn_->num_inputs()) + " values";
  }
  for (const auto& [output, input] : writes_) {
    if (output >= output_specs_.size() || input >= input_specs_.size()) {
      return "the engine writes output " + std::to_string(output) + " into input " +
             std::to_string(input) + ", which its signature does not have";
    }
    const TensorSpec& from = output_specs_[output];
    const TensorSpec& to = input_specs_[input];
    if (!at::canCast(from.dtype, to.dtype) || from.sizes != to.sizes ||
        from.symbols != to.symbols) {
      return "the engine writes output " + std::to_string(output) + " (" + from.str() +
             ") into input " + std::to_string(input) + " (" + to.str() +
             "), which cannot hold it";
    }
  }
  for (const auto* specs : {&input_specs_, &output_specs_}) {
    for (const auto& spec : *specs) {
      if (spec.any || spec.none) {
        return "the engine's signature holds '" + spec.str() +
               "', which compiled code cannot take";
      }
    }
  }
  return "";
}

c10::intrusive_ptr<Engine> Engine::create_signed(
    std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
    std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
    std::string cpu_features, std::string precision, const std::string& key_path,
    std::string writes) {
  const Digest digest = digest_to_sign(name, code, input_specs, output_specs, fallback_ir,
                                       params, fallback_mode, cpu_features, precision, writes);
  return create_with_digest(std::move(name), std::move(code), std::move(input_specs),
                            std::move(output_specs), std::move(fallback_ir), std::move(params),
                            std::move(fallback_mode), std::move(cpu_features),
                            std::move(precision), key_path, std::move(writes), digest);
}

c10::intrusive_ptr<Engine> Engine::create_with_digest(
    std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
    std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
    std::string cpu_features, std::string precision, const std::string& key_path,
    std::string writes, const Digest& digest) {
  std::string signature = sign_digest(digest, key_path);
  return c10::make_intrusive<Engine>(std::move(name), std::move(code), std::move(input_specs),
                                     std::move(output_specs), std::move(fallback_ir),
                                     std::move(params), std::move(fallback_mode),
                                     std::move(cpu_features), std::move(signature),
                                     std::move(precision), std::move(writes), &digest);
}

void Engine::load_code(const Digest* computed_digest) {
  if (load_error_.empty()) {
    load_error_ = validation_error();
  }
  std::string untrusted_key;
  if (load_error_.empty()) {
    const Digest code = code_digest(code_bytes_);
    const Digest digest = computed_digest != nullptr ? *computed_digest : signed_digest(code);
    load_error_ = verify_digest(digest, signature_, &untrusted_key);
    if (load_error_.empty()) {
      digest_ = digest;
      load_error_ = load_verified_code(code);
    }
  }
  if (!load_error_.empty() && !untrusted_key.empty()) {
    untrusted_key_ = untrusted_key;
    trust_version_seen_ = trust_version();
    load_error_ += "; " + trust_advice(untrusted_key);
    warn_untrusted_once(untrusted_key, name_);
  }
  code_ready_.store(code_ != nullptr, std::memory_order_release);
  TORCH_CHECK(load_error_.empty() || fallback_mode_ != FallbackMode::kError, "blade: engine '",
              name_, "' cannot run its compiled code: ", load_error_,
              ". It was built with fallback='error'; rebuild the model with blade.optimize on "
              "this machine, or with Config(fallback='fallback') to run its TorchScript "
              "subgraph instead.");
}

std::string Engine::load_verified_code(const Digest& code) {
  if (auto missing = missing_cpu_features(cpu_features_); !missing.empty()) {
    return "the compiled code needs CPU features this machine lacks: " + missing;
  }
  if (precision_ == "bf16" && !missing_cpu_features("avx512_bf16").empty()) {
    return "the engine runs its GEMMs and convolutions in bfloat16 (precision='bf16'), "
           "which needs a CPU with avx512_bf16; this one lacks it";
  }
  if (precision_ == "int8" && int8_weight_limit() == 0) {
    return std::string("the engine runs int8 GEMMs (precision='int8'), which need a CPU "
                       "with ") +
           int8_features_needed() + "; this one has none of them";
  }
  if (precision_ == "int8" && !has_int8_dot_product()) {
    // Without a dot product, int8 products are exact only for weights within the limit.
    if (const auto [param, value] = int8_params_exceeding(params_); param >= 0) {
      return "the engine's int8 weights need a CPU with avx512_vnni, avx_vnni or amx_int8: "
             "param " + std::to_string(param) + " holds " + std::to_string(value) +
             ", and this CPU's int8 products (AVX2) take weights within +-" +
             std::to_string(int8_weight_limit()) + " only (Config(precision='int8') on "
             "this CPU quantizes within that)";
    }
  }
  try {
    code_ = CompiledCode::load_shared(code_bytes_.data_ptr<uint8_t>(),
                                      static_cast<size_t>(code_bytes_.numel()), code, name_);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  // The code's weight-only buffers that are params (its buffers are inputs, params,
  // outputs; an input multiplied by is no param, and is never released).
  std::vector<size_t> weight_only;
  for (size_t index : code_->weight_arguments()) {
    if (index >= input_specs_.size() && index < input_specs_.size() + params_.size()) {
      weight_only.push_back(index - input_specs_.size());
    }
  }
  prepared_weights_->set_weight_only(weight_only);
  return "";
}

bool Engine::load_now_trusted() {
  if (untrusted_key_.empty() || trust_version() == trust_version_seen_.load()) {
    return false;  // the common case: one atomic read
  }
  std::lock_guard<std::mutex> lock(late_load_mutex_);
  if (code_ready_.load(std::memory_order_acquire)) {
    return true;
  }
  trust_version_seen_ = trust_version();
  std::string untrusted;
  const Digest code = code_digest(code_bytes_);
  if (!verify_digest(signed_digest(code), signature_, &untrusted).empty()) {
    return false;  // still untrusted (another key was trusted)
  }
  std::string error = load_verified_code(code);
  {
    std::lock_guard<std::mutex> reason(reason_mutex_);
    load_error_ = error;
  }
  code_ready_.store(code_ != nullptr, std::memory_order_release);
  return code_ != nullptr;
}

std::string Engine::load_error() const {
  std::lock_guard<std::mutex> lock(reason_mutex_);
  return load_error_;
}

void write_back(const at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(at::canCast(value.scalar_type(), self.scalar_type()), "result type ",
              value.scalar_type(), " can't be cast to the desired output type ",
              self.scalar_type());
  TORCH_CHECK(value.sizes() == self.sizes(), "output with shape ", self.sizes(),
              " doesn't match the broadcast shape ", value.sizes());
  self.copy_(value);
}

std::vector<at::Tensor> Engine::execute(const std::vector<at::Tensor>& inputs) {
  auto outputs = compute(inputs);
  for (const auto& [output, input] : writes_) {
    TORCH_CHECK(input < inputs.size() && output < outputs.size(), "blade: engine '", name_,
                "' was given ", inputs.size(), " inputs, but writes into input ", input);
    write_back(inputs[input], outputs[output]);
  }
  return outputs;
}

std::vector<at::Tensor> Engine::compute(const std::vector<at::Tensor>& inputs) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  if (!code_ready_.load(std::memory_order_acquire) && !load_now_trusted()) {
    return run_fallback(inputs, load_error(), SlowPathKind::kNotLoaded);
  }
  auto mismatch = check_signature(input_specs_, inputs);
  if (!mismatch.why.empty()) {
    return run_fallback(inputs, mismatch.why, mismatch.kind, mismatch.input);
  }
  // The compiled code records nothing for autograd: its outputs would come back silently
  // detached. The subgraph's ops, run through the dispatcher, are what autograd follows.
  if (at::GradMode::is_enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        return run_fallback(inputs,
                            "input " + std::to_string(i) +
                                " requires grad under grad mode, and the compiled code "
                                "computes no gradients (run inference under "
                                "torch.no_grad() or torch.inference_mode())",
                            SlowPathKind::kGradMode, static_cast<int64_t>(i));
      }
    }
  }
  return run_compiled(inputs);
}

std::vector<at::Tensor> Engine::run_code(const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(code_ready_.load(std::memory_order_acquire), "blade: engine '", name_,
              "' has no compiled code: ", load_error());
  const auto why = signature_mismatch(input_specs_, inputs);
  TORCH_CHECK(why.empty(), "blade: engine '", name_, "' cannot run these inputs: ", why);
  std::string kernel_error;
  const OneKernelPerCall once;  // the check needs results, not kernel timings
  auto outputs = call_code(inputs, &kernel_error);
  TORCH_CHECK(kernel_error.empty(), "blade: engine '", name_,
              "': the compiled code reported an error: ", kernel_error);
  return outputs;
}

std::vector<at::Tensor> Engine::run_compiled(const std::vector<at::Tensor>& inputs) {
  std::string kernel_error;
  // Kernel calls that draw random numbers advance PyTorch's generator: a fallback after a
  // failed call starts from where the call started, so it draws what eager would.
  const KernelCallTable* calls = code_->kernel_calls();
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::optional<at::Tensor> generator_state;
  if (calls != nullptr && calls->draws_random_numbers()) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator_state = generator.get_state();
  }
  auto outputs = call_code(inputs, &kernel_error);
  if (prepared_weights_->release_due()) {
    // Not while another call runs (its kernels may be reading a weight as it is).
    std::unique_lock<std::shared_mutex> alone(code_mutex_, std::try_to_lock);
    if (alone.owns_lock()) {
      prepared_weights_->release_plain_weights();
    }
  }
  // A library call that failed (see kernel_errors.h) left the outputs unspecified.
  if (!kernel_error.empty()) {
    if (generator_state.has_value()) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(*generator_state);
    }
    return run_fallback(inputs, "the compiled code reported an error: " + kernel_error,
                        SlowPathKind::kCodeError);
  }
  slow_path_.note_compiled();
  return outputs;
}

std::vector<at::Tensor> Engine::call_code(const std::vector<at::Tensor>& inputs,
                                          std::string* kernel_error) {
  // Held from before `args` holds the params until after it is gone: releasing plain
  // weights counts their holders (prepared_weights.h).
  std::shared_lock<std::shared_mutex> running(code_mutex_);
  // Contiguous views of the inputs: the code reads identity-layout buffers. `contiguous`
  // returns the tensor itself when it already is, so no copy is made in the common case.
  std::vector<at::Tensor> args;
  args.reserve(inputs.size() + params_.size() + output_specs_.size());
  for (const auto& t : inputs) {
    args.push_back(t.contiguous());
  }
  args.insert(args.end(), params_.begin(), params_.end());
  std::vector<at::Tensor> outputs;
  if (!returns_outputs_) {
    outputs.reserve(output_specs_.size());
    for (const auto& spec : output_specs_) {
      outputs.push_back(cached_output(spec));
      args.push_back(outputs.back());
    }
  }

  // One memref descriptor per argument: {allocated, aligned, offset, sizes..., strides...}.
  // A dynamic engine's code takes, first, where to write the descriptors of its outputs.
  size_t words = 0;
  for (const auto& t : args) {
    words += 3 + 2 * static_cast<size_t>(t.dim());
  }
  size_t result_words = 0;
  if (returns_outputs_) {
    for (const auto& spec : output_specs_) {
      result_words += 3 + 2 * spec.sizes.size();
    }
  }
  std::vector<int64_t> results(result_words, 0);
  std::vector<int64_t> descriptors(words);
  std::vector<void*> pointers;
  pointers.reserve(args.size() + 1);
  if (returns_outputs_) {
    pointers.push_back(results.data());
  }
  size_t at = 0;
  for (const auto& t : args) {
    int64_t* d = descriptors.data() + at;
    auto* data = static_cast<char*>(t.data_ptr());
    d[0] = reinterpret_cast<int64_t>(data);
    d[1] = reinterpret_cast<int64_t>(data);
    d[2] = 0;
    const int64_t rank = t.dim();
    for (int64_t k = 0; k < rank; ++k) {
      d[3 + k] = t.size(k);
      d[3 + rank + k] = t.stride(k);
    }
    pointers.push_back(d);
    at += 3 + 2 * static_cast<size_t>(rank);
  }
  {
    ActivePreparedWeights weights(prepared_weights_.get());
    ActiveKernelCalls calls(code_->kernel_calls());
    Bf16AttentionProducts attention(precision_ == "int8");
    const ProfiledCall profiled([] { return std::string(kEngineCalls); });
    code_->entry()(pointers.data());
  }
  prepared_weights_->return_freed_memory();
  if (returns_outputs_) {
    outputs = adopt_results(results);
  }
  *kernel_error = take_kernel_error();
  return outputs;
}

std::vector<at::Tensor> Engine::adopt_results(const std::vector<int64_t>& results) const {
  // Each returned buffer is owned by the caller (MLIR's deallocation pipeline guarantees it
  // for results of a public function) and came from _mlir_memref_to_llvm_alloc; the tensor
  // made from it frees it the same way. If adopting one throws, it and the ones after it
  // are freed here, so none leaks.
  std::vector<at::Tensor> outputs;
  outputs.reserve(output_specs_.size());
  size_t i = 0;
  size_t at = 0;
  try {
    for (; i < output_specs_.size(); ++i) {
      const auto& spec = output_specs_[i];
      const auto rank = static_cast<int64_t>(spec.sizes.size());
      const int64_t* d = results.data() + at;
      void* allocated = reinterpret_cast<void*>(d[0]);
      auto* data = reinterpret_cast<char*>(d[1]) + d[2] * c10::elementSize(spec.dtype);
      outputs.push_back(at::from_blob(
          data, at::IntArrayRef(d + 3, rank), at::IntArrayRef(d + 3 + rank, rank),
          [allocated](void*) { _mlir_memref_to_llvm_free(allocated); },
          at::TensorOptions().dtype(spec.dtype)));
      at += 3 + 2 * static_cast<size_t>(rank);
    }
  } catch (...) {
    for (; i < output_specs_.size(); ++i) {
      _mlir_memref_to_llvm_free(reinterpret_cast<void*>(results[at]));
      at += 3 + 2 * output_specs_[i].sizes.size();
    }
    throw;
  }
  return outputs;
}

std::vector<at::Tensor> Engine::run_fallback(const std::vector<at::Tensor>& inputs,
                                             const std::string& reason, SlowPathKind kind,
                                             int64_t input) {
  TORCH_CHECK(fallback_mode_ != FallbackMode::kError, "blade: engine '", name_,
              "' cannot run these inputs: ", reason, ". Expected signature (",
              format_specs(input_specs_), "), got (", describe_tensors(inputs),
              "). Call it with inputs of the expected signature, or build the model with "
              "Config(fallback='fallback') to run the TorchScript subgraph for such inputs.");
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> guard(reason_mutex_);
    last_fallback_reason_ = reason;
  }
  slow_path_.note("engine '" + name_ + "'", "its TorchScript subgraph", kind, input, reason);
  return run_subgraph(inputs);
}

std::vector<at::Tensor> Engine::run_subgraph(const std::vector<at::Tensor>& inputs) {
  // The interpreter would take the last values of a longer stack as the inputs.
  TORCH_CHECK(inputs.size() + params_.size() == fallback_fn_->num_inputs(), "blade: engine '",
              name_, "': its TorchScript subgraph takes ", fallback_fn_->num_inputs(),
              " values, but it was given ", inputs.size(), " inputs and ", params_.size(),
              " params (the saved file is corrupted, or the engine was called with the wrong "
              "number of inputs)");
  prepared_weights_->keep_plain();  // the subgraph reads every param as it is
  torch::jit::Stack stack(inputs.begin(), inputs.end());
  stack.insert(stack.end(), params_.begin(), params_.end());
  fallback_fn_->run(stack);
  auto outputs = stack.back().toTensorVector();
  // The op's schema promises fresh outputs; a subgraph that returns a view of an input
  // would break that promise, so such outputs are copied.
  for (auto& out : outputs) {
    for (const auto& in : inputs) {
      if (in.defined() && out.defined() && out.is_alias_of(in)) {
        out = out.clone();
        break;
      }
    }
  }
  return outputs;
}

const std::vector<at::Tensor>& Engine::params() const {
  prepared_weights_->keep_plain();
  return params_;
}

at::Tensor Engine::param(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(params_.size()), "blade: engine '",
              name_, "' has ", params_.size(), " params, none at index ", index,
              " (the saved file is corrupted)");
  prepared_weights_->keep_plain(params_[static_cast<size_t>(index)]);
  return params_[static_cast<size_t>(index)];
}

EngineStats Engine::stats() const {
  return EngineStats{calls_.load(), fallbacks_.load()};
}

std::string Engine::last_fallback_reason() const {
  std::lock_guard<std::mutex> guard(reason_mutex_);
  return last_fallback_reason_;
}

Engine::State Engine::serialize() const {
  prepared_weights_->keep_plain();  // saved as they are
  std::ostringstream meta;
  meta << "blade_version=" << BLADE_VERSION << "\n"
       << "cpu_features=" << cpu_features_ << "\n"
       << "signature=" << signature_ << "\n";
  if (precision_ != "float32") {
    meta << "precision=" << precision_ << "\n";
  }
  if (!writes_.empty()) {
    meta << "writes=" << writes() << "\n";
  }
  return State(kEngineFormatVersion, name_,
               fallback_mode_ == FallbackMode::kError ? "error" : "fallback", fallback_ir_, params_,
               format_specs(input_specs_), format_specs(output_specs_), meta.str(), code_bytes_);
}

c10::intrusive_ptr<Engine> Engine::deserialize(State state) {
  auto& [version, name, mode, fallback_ir, params, input_specs, output_specs, meta, code] = state;
  // Everything below comes from a file: a field this runtime cannot use makes the engine
  // refuse its code (and run its subgraph), never the process fail.
  std::string problem;
  if (version != kEngineFormatVersion) {
    problem = "the engine's format version " + std::to_string(version) +
              " is not the one this Blade runtime reads (" +
              std::to_string(kEngineFormatVersion) + ")";
  }
  std::map<std::string, std::string> fields;
  std::istringstream lines(meta);
  std::string line;
  while (problem.empty() && std::getline(lines, line)) {
    auto equals = line.find('=');
    if (equals == std::string::npos || equals == 0 ||
        !fields.emplace(line.substr(0, equals), line.substr(equals + 1)).second) {
      problem = "the engine's metadata line '" + line.substr(0, 80) +
                "' is not a new key=value pair";
    }
  }
  const bool known_mode = mode == "fallback" || mode == "error";
  if (problem.empty() && !known_mode) {
    problem = "the engine's fallback mode '" + mode.substr(0, 40) +
              "' is neither 'fallback' nor 'error'";
  }
  if (!problem.empty()) {
    // The code and its ABI are unknown: keep only what every format has. Built in fallback
    // mode, which does not raise on the missing code; the saved mode applies from here.
    // Its writes still hold: the subgraph computes what they write.
    const auto writes = fields.find("writes");
    auto engine = c10::make_intrusive<Engine>(name, at::Tensor(), "", "", fallback_ir, params,
                                              "fallback", "", "", "float32",
                                              writes == fields.end() ? "" : writes->second);
    engine->load_error_ = problem;
    engine->fallback_mode_ = known_mode ? parse_fallback_mode(mode) : FallbackMode::kFallback;
    TORCH_CHECK(engine->fallback_mode_ != FallbackMode::kError, "blade: engine '", name,
                "' cannot be loaded: ", problem,
                ". Rebuild the model with this version of Blade.");
    return engine;
  }
  const auto precision = fields.find("precision");
  return c10::make_intrusive<Engine>(name, code, input_specs, output_specs, fallback_ir,
                                     params, mode, fields["cpu_features"], fields["signature"],
                                     precision == fields.end() ? "float32" : precision->second,
                                     fields["writes"]);
}

}  // namespace blade::ral
