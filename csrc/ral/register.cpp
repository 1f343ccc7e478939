// Registers the runtime with TorchScript, in one place: the Engine class and the ops that
// execute one, the op that writes a computed value into a caller's tensor, the Guard class
// and the op that checks a model's inputs against it, and the int8 ops quantized models run.
// Loading libblade_ral (Python: `import blade`; C++: linking it with --no-as-needed) is
// what makes saved optimized models loadable.
#include "ral/engine.h"
#include "ral/guard.h"
#include "ral/int8_kernels.h"

#include <torch/library.h>

namespace blade::ral {
namespace {

std::vector<at::Tensor> execute_engine(const c10::intrusive_ptr<Engine>& engine,
                                       std::vector<at::Tensor> inputs) {
  return engine->execute(inputs);
}

bool guard_admits(const c10::intrusive_ptr<Guard>& guard,
                  const c10::List<std::optional<at::Tensor>>& inputs) {
  std::vector<at::Tensor> tensors;  // None becomes an undefined tensor
  tensors.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::optional<at::Tensor> t = inputs.get(i);
    tensors.push_back(t.has_value() ? *t : at::Tensor());
  }
  return guard->admits(tensors);
}

// A slow-path log's counts as TorchScript sees them: reason -> calls.
c10::Dict<std::string, int64_t> reasons_dict(
    const std::vector<std::pair<std::string, int64_t>>& counts) {
  c10::Dict<std::string, int64_t> result;
  for (const auto& [reason, calls] : counts) {
    result.insert_or_assign(reason, calls);
  }
  return result;
}

at::Tensor write_back_op(at::Tensor self, const at::Tensor& value) {
  write_back(self, value);
  return self;
}

}  // namespace

TORCH_LIBRARY(blade, m) {
  m.class_<Engine>("Engine")
      .def(torch::init<std::string, at::Tensor, std::string, std::string, std::string,
                       std::vector<at::Tensor>, std::string, std::string, std::string,
                       std::string>())
      .def("execute", &Engine::execute)
      .def("run_subgraph", &Engine::run_subgraph)
      .def("run_code", &Engine::run_code)
      .def("name", [](const c10::intrusive_ptr<Engine>& e) { return e->name(); })
      .def("input_specs", &Engine::input_specs)
      .def("output_specs", &Engine::output_specs)
      .def("fallback_ir", [](const c10::intrusive_ptr<Engine>& e) { return e->fallback_ir(); })
      .def("cpu_features", [](const c10::intrusive_ptr<Engine>& e) { return e->cpu_features(); })
      .def("signature", [](const c10::intrusive_ptr<Engine>& e) { return e->signature(); })
      .def("digest",
           [](const c10::intrusive_ptr<Engine>& e) {
             return e->digest() ? to_hex(e->digest()->data(), e->digest()->size())
                                : std::string();
           })
      .def("writes", &Engine::writes)
      .def("precision", [](const c10::intrusive_ptr<Engine>& e) { return e->precision(); })
      .def("is_compiled", &Engine::is_compiled)
      .def("load_error", [](const c10::intrusive_ptr<Engine>& e) { return e->load_error(); })
      .def("calls", [](const c10::intrusive_ptr<Engine>& e) { return e->stats().calls; })
      .def("fallbacks", [](const c10::intrusive_ptr<Engine>& e) { return e->stats().fallbacks; })
      .def("last_fallback_reason", &Engine::last_fallback_reason)
      .def("fallback_reasons",
           [](const c10::intrusive_ptr<Engine>& e) { return reasons_dict(e->fallback_reasons()); })
      .def("last_call_compiled", &Engine::last_call_compiled)
      .def("packed_weights", &Engine::packed_weights)
      .def("prepared_bytes", &Engine::prepared_bytes)
      .def("kernel_choices", &Engine::kernel_choices)
      .def("released_bytes", &Engine::released_bytes)
      .def("param", &Engine::param)
      .def("params", [](const c10::intrusive_ptr<Engine>& e) { return e->params(); })
      .def_pickle(
          [](const c10::intrusive_ptr<Engine>& e) { return e->serialize(); },
          [](Engine::State state) { return Engine::deserialize(std::move(state)); });

  m.def("execute(__torch__.torch.classes.blade.Engine engine, Tensor[] inputs) -> Tensor[]",
        execute_engine);
  // An engine that writes into some of its inputs (Engine::writes): AliasDb must see the
  // writes, so that no read of those tensors moves across the call, and DCE must keep it.
  m.def(torch::schema("execute_writing(__torch__.torch.classes.blade.Engine engine, "
                      "Tensor[] inputs) -> Tensor[]",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        execute_engine);

  // What an in-place op on a caller's tensor leaves in it, once its value was computed
  // functionally (passes/functionalize_input_writes.h).
  m.def("write_back(Tensor(a!) self, Tensor value) -> Tensor(a!)", write_back_op);

  m.class_<Guard>("Guard")
      .def(torch::init<std::string, std::string>())
      .def("input_specs", &Guard::input_specs)
      .def("calls", &Guard::calls)
      .def("fallbacks", &Guard::fallbacks)
      .def("last_fallback_reason", &Guard::last_fallback_reason)
      .def("fallback_reasons",
           [](const c10::intrusive_ptr<Guard>& g) { return reasons_dict(g->fallback_reasons()); })
      .def("last_call_admitted", &Guard::last_call_admitted)
      .def_pickle(
          [](const c10::intrusive_ptr<Guard>& g) { return g->serialize(); },
          [](Guard::State state) { return Guard::deserialize(std::move(state)); });

  // An int8 linear layer (int8_kernels.h); engines call it as a kernel call.
  m.def("quantized_linear(Tensor input, Tensor weight, Tensor weight_scale, Tensor? bias, "
        "Tensor input_range, Tensor? output_range, str post_op) -> Tensor",
        quantized_linear);
  m.def("quantized_conv2d(Tensor input, Tensor weight, Tensor weight_scale, Tensor? bias, "
        "int[] stride, int[] padding, int[] dilation, int groups, Tensor input_range, "
        "Tensor? output_range, str post_op) -> Tensor",
        quantized_conv2d);
  m.def("quantized_conv2d_add(Tensor input, Tensor weight, Tensor weight_scale, Tensor? bias, "
        "int[] stride, int[] padding, int[] dilation, int groups, Tensor input_range, "
        "Tensor accum, Tensor accum_range, Tensor? output_range, str post_op) -> Tensor",
        quantized_conv2d_add);
  m.def("quantized_max_pool2d(Tensor input, int[] kernel_size, int[] stride, int[] padding, "
        "int[] dilation, bool ceil_mode) -> Tensor",
        quantized_max_pool2d);

  m.def("guard_admits(__torch__.torch.classes.blade.Guard guard, Tensor?[] inputs) -> bool",
        guard_admits);
}

}  // namespace blade::ral
