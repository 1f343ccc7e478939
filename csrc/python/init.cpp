// blade._C: the Python bindings of the graph passes. The runtime (libblade_ral) is linked
// in, so importing this module also registers the Engine class and the execute op.
#include "passes/cluster.h"
#include "passes/decompose.h"
#include "passes/detach_inlined_functions.h"
#include "passes/duplicate_shape_arithmetic.h"
#include "passes/engine_call.h"
#include "passes/fold_numel.h"
#include "passes/fold_sizes.h"
#include "passes/fold_structures.h"
#include "passes/functionalize_input_writes.h"
#include "passes/functionalize_view_writes.h"
#include "passes/guard_specialization.h"
#include "passes/keep_rank_checks.h"
#include "passes/materialize_types.h"
#include "passes/outline_branches.h"
#include "passes/split_to_slices.h"
#include "passes/graph_contents.h"
#include "python/tolerance.h"
#include "ral/call_profile.h"
#include "ral/conv_planes.h"
#include "ral/cpu_features.h"
#include "ral/depthwise_conv.h"
#include "ral/depthwise_int8.h"
#include "ral/blocked_gemm.h"
#include "ral/engine.h"
#include "ral/few_rows_gemm.h"
#include "ral/float_conv.h"
#include "ral/fused_attention.h"
#include "ral/int8_amx.h"
#include "ral/int8_conv.h"
#include "ral/int8_kernels.h"
#include "ral/kernel_calls.h"
#include "ral/kernel_trials.h"
#include "ral/offered_buffers.h"
#include "ral/ral_abi.h"
#include "ral/signing.h"
#include "ral/tensor_spec.h"
#include "ral/winograd.h"

#include <ATen/native/ConvUtils.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <map>
#include <string>

namespace py = pybind11;

namespace blade {
namespace {

std::vector<c10::IValue> to_ivalues(const std::shared_ptr<torch::jit::Graph>& graph,
                                    const py::tuple& inputs) {
  TORCH_CHECK(inputs.size() == graph->inputs().size(), "blade: the graph takes ",
              graph->inputs().size(), " inputs (the module first), but ", inputs.size(),
              " were given");
  std::vector<c10::IValue> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    values.push_back(torch::jit::toIValue(inputs[i], graph->inputs()[i]->type()));
  }
  return values;
}

ral::Digest to_digest(const py::bytes& bytes) {
  std::string text = bytes;
  ral::Digest digest{};
  TORCH_CHECK(text.size() == digest.size(), "blade: a digest is ", digest.size(),
              " bytes, got ", text.size());
  std::copy(text.begin(), text.end(), digest.begin());
  return digest;
}

// The test ops' activation flags as the kernels take them (hardswish, then SiLU, then ReLU
// where several are set).
ral::ConvActivation activation_of(bool relu, bool silu, bool hardswish = false) {
  return hardswish ? ral::ConvActivation::kHardswish
         : silu    ? ral::ConvActivation::kSilu
         : relu    ? ral::ConvActivation::kRelu
                   : ral::ConvActivation::kNone;
}

// A float convolution by one of the runtime's tile kernels (float_conv.h), NCHW in and
// out, its weight packed by `pack` for this call; checked as an op would check it.
using FloatConv = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const at::Tensor&,
                           int64_t, int64_t, int64_t, at::IntArrayRef, at::IntArrayRef,
                           const float*, ral::ConvActivation, float*, const float*,
                           const float*);
at::Tensor float_conv2d(const char* what, at::Tensor (*pack)(const at::Tensor&),
                        FloatConv conv, const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, const std::vector<int64_t>& stride,
                        const std::vector<int64_t>& padding, bool relu, bool silu,
                        bool hardswish, const std::optional<at::Tensor>& added,
                        const std::optional<at::Tensor>& input_scale) {
  TORCH_CHECK(x.dim() == 4 && weight.dim() == 4 && x.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat && weight.size(1) == x.size(1),
              what, ": float32 x [N, C, H, W] and weight [O, C, kh, kw] are needed, got ",
              x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(!bias.has_value() ||
                  (bias->scalar_type() == at::kFloat && bias->numel() == weight.size(0)),
              what, ": the bias needs ", weight.size(0), " float32 values");
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && stride[0] > 0 && stride[1] > 0 &&
                  padding[0] >= 0 && padding[1] >= 0,
              what, ": two positive strides and two paddings are needed");
  TORCH_CHECK(x.size(2) + 2 * padding[0] >= weight.size(2) &&
                  x.size(3) + 2 * padding[1] >= weight.size(3),
              what, ": the filter ", weight.sizes(), " does not fit the padded input ",
              x.sizes());
  const int64_t out_h = (x.size(2) + 2 * padding[0] - weight.size(2)) / stride[0] + 1;
  const int64_t out_w = (x.size(3) + 2 * padding[1] - weight.size(3)) / stride[1] + 1;
  const at::Tensor nhwc = x.permute({0, 2, 3, 1}).contiguous();
  const at::Tensor packed = pack(weight);
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({x.size(0), out_h, out_w, weight.size(0)}, x.options());
  const std::vector<int64_t> result_sizes{x.size(0), weight.size(0), out_h, out_w};
  TORCH_CHECK(!added.has_value() ||
                  (added->scalar_type() == at::kFloat && added->sizes() == result_sizes),
              what, ": the tensor added must be float32 of the result's shape ", result_sizes);
  const at::Tensor added_nhwc =
      added.has_value() ? added->permute({0, 2, 3, 1}).contiguous() : at::Tensor();
  TORCH_CHECK(!input_scale.has_value() ||
                  (input_scale->scalar_type() == at::kFloat &&
                   input_scale->sizes() == at::IntArrayRef{x.size(0), x.size(1)}),
              what, ": the input scale must be float32 [", x.size(0), ", ", x.size(1), "]");
  const at::Tensor scale =
      input_scale.has_value() ? input_scale->contiguous() : at::Tensor();
  conv(nhwc.const_data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1), packed,
       weight.size(0), weight.size(2), weight.size(3), stride, padding,
       b.defined() ? b.const_data_ptr<float>() : nullptr, activation_of(relu, silu, hardswish),
       out.data_ptr<float>(), added_nhwc.defined() ? added_nhwc.const_data_ptr<float>() : nullptr,
       scale.defined() ? scale.const_data_ptr<float>() : nullptr);
  return out.permute({0, 3, 1, 2});
}

}  // namespace
}  // namespace blade

PYBIND11_MODULE(_C, m) {
  using namespace blade;
  m.doc() = "Blade's TorchScript graph passes and runtime bindings";

  m.def(
      "materialize_types",
      [](const std::shared_ptr<torch::jit::Graph>& graph, const py::tuple& inputs,
         bool static_shapes, const py::list& more_inputs) {
        std::vector<std::vector<c10::IValue>> runs{to_ivalues(graph, inputs)};
        for (const auto& more : more_inputs) {
          runs.push_back(to_ivalues(graph, more.cast<py::tuple>()));
        }
        std::vector<c10::IValue> outputs;
        int64_t typed = 0;
        {
          py::gil_scoped_release no_gil;
          typed = passes::materialize_types(graph, runs, static_shapes, &outputs);
        }
        py::list returned;
        for (const auto& output : outputs) {
          returned.append(torch::jit::toPyObject(output));
        }
        return py::make_tuple(typed, returned);
      },
      py::arg("graph"), py::arg("inputs"), py::arg("static_shapes"),
      py::arg("more_inputs") = py::list(),
      "Types every tensor value as it was seen running on `inputs` (and on each tuple of "
      "`more_inputs`: dimensions whose sizes differ become shape symbols). Returns the "
      "number of values typed and the list of what the graph returned on `inputs`.");

  py::class_<passes::DissolvedCluster>(m, "DissolvedCluster")
      .def_readonly("node_kinds", &passes::DissolvedCluster::node_kinds)
      .def_readonly("reason", &passes::DissolvedCluster::reason);

  m.def(
      "cluster_supported_nodes",
      [](const std::shared_ptr<torch::jit::Graph>& graph,
         const std::vector<torch::jit::Node*>& supported,
         const std::vector<torch::jit::Node*>& compute, int64_t min_compute_ops) {
        passes::ClusterOptions options;
        options.supported.insert(supported.begin(), supported.end());
        options.compute.insert(compute.begin(), compute.end());
        options.min_compute_ops = min_compute_ops;
        auto result = passes::cluster_supported_nodes(graph, options);
        return std::make_pair(result.clusters, result.dissolved);
      },
      py::arg("graph"), py::arg("supported"), py::arg("compute"), py::arg("min_compute_ops"),
      py::return_value_policy::reference);

  m.def("dissolve_cluster", &passes::dissolve_cluster, py::arg("cluster"),
        py::return_value_policy::reference,
        "Inlines a cluster back into its graph; returns its nodes in subgraph order.");
  m.def("split_to_slices", &passes::split_to_slices, py::arg("graph"),
        "Splits unpacked right away become slices; returns how many were rewritten.");
  m.def("decompose", &passes::decompose, py::arg("graph"), py::arg("overload"), py::arg("body"),
        py::arg("unused_results") = std::vector<int64_t>{},
        "Inlines `body` in place of every call of `overload` whose `unused_results` have no "
        "uses; returns how many were rewritten.");
  m.def("detach_inlined_functions", &passes::detach_inlined_functions, py::arg("graph"),
        "Inlined call stacks point to placeholder functions of the same names that live as "
        "long as the process; returns how many nodes' stacks were rebuilt.");
  m.def("fold_numel", &passes::fold_numel, py::arg("graph"),
        "numel() of tensors with known sizes becomes a constant.");
  m.def("fold_sizes", &passes::fold_sizes, py::arg("graph"),
        "size() of static dims becomes a constant; x.size() of a partly dynamic x a list of "
        "per-dim sizes.");
  m.def("duplicate_shape_arithmetic", &passes::duplicate_shape_arithmetic, py::arg("graph"),
        "Each use of a size computed at run time gets its own copy of the computation.");
  m.def("is_shape_arithmetic", &passes::is_shape_arithmetic, py::arg("node"),
        "Whether the node computes an int from tensor sizes and constants only.");
  m.def("guard_specialization", &passes::guard_specialization, py::arg("graph"),
        py::arg("unspecialized"), py::arg("guard_attr"), py::arg("guarded"),
        "The optimized body runs under a guard of its inputs; other inputs run the "
        "unspecialized graph.");
  m.def("outline_branches", &passes::outline_branches, py::arg("graph"), py::arg("min_nodes"),
        "Large if-branches without engine calls become functions saved a few to a file "
        "(loading the saved model is then linear in its code); returns how many.");
  m.def("fold_structures", &passes::fold_structures, py::arg("graph"),
        "Folds dicts with constant keys and appended lists that never escape.");
  m.def("functionalize_input_writes", &passes::functionalize_input_writes, py::arg("graph"),
        py::arg("small_writes") = 0,
        "In-place writes into graph inputs and module attributes become functional values "
        "and blade::write_back nodes.");
  m.def(
      "keep_rank_checks",
      [](const std::shared_ptr<torch::jit::Graph>& graph) {
        auto counts = passes::keep_rank_checks(graph);
        return std::make_pair(counts.rank_reads, counts.barriers);
      },
      py::arg("graph"),
      "dim() of a convolution's result reads its input's rank, and BatchNorms whose fold "
      "would need a batched input get a fold barrier; returns both counts.");
  m.def("remove_fold_barriers", &passes::remove_fold_barriers, py::arg("graph"),
        "Removes keep_rank_checks' fold barriers; returns how many.");
  m.def(
      "copy_keeping_rank_checks",
      [](const py::object& module) {
        return passes::copy_keeping_rank_checks(py::cast<torch::jit::Module>(module));
      },
      py::arg("module"),
      "A copy of a script module (same tensors) whose inlined forward keeps rank checks "
      "through freezing.");
  m.def("check_in_place_casts", &passes::check_in_place_casts, py::arg("graph"),
        "Raises where an in-place op's value cannot be cast to its tensor's dtype.");
  m.def("functionalize_view_writes", &passes::functionalize_view_writes, py::arg("graph"),
        "Writes into slices/selects of fresh tensors become slice_scatter/select_scatter.");
  m.def("lift_tensor_constants", &passes::lift_tensor_constants, py::arg("subgraph"));
  m.def("fallback_ir", &passes::fallback_ir, py::arg("subgraph"));
  m.def("absorbable_write_backs", &passes::absorbable_write_backs, py::arg("cluster"),
        "The (output, input) pairs of the blade::write_back nodes an engine of the cluster "
        "can do itself, moved to right after it.");
  m.def("replace_cluster_with_engine", &passes::replace_cluster_with_engine, py::arg("cluster"),
        py::arg("attr_name"), py::arg("writes") = std::vector<std::pair<int64_t, int64_t>>());
  m.def("live_allocations", &blade_ral_live_allocations,
        "Buffers allocated by generated code and not yet freed, in this process.");
  m.def("cached_bytes", &blade_ral_cached_bytes,
        "Bytes of buffers that generated code freed, kept for its next allocations.");
  m.def("release_cached_memory", &blade_ral_release_cached_memory,
        "Gives every cached buffer back to PyTorch's allocator.");
  m.def("set_cached_memory_limit", &blade_ral_set_cached_memory_limit, py::arg("bytes"),
        "The most bytes of freed buffers the runtime keeps for reuse (0: none).");
  m.def("set_prepared_weights_limit", &ral::set_prepared_weights_limit, py::arg("bytes"),
        "The most bytes prepared weight copies may take, process-wide (negative: no limit).");
  m.def("set_kernel_trials", &ral::set_kernel_trials, py::arg("enabled"),
        "Whether engines time a second kernel against oneDNN's (off: oneDNN's always, a bf16 "
        "engine's convolutions in bfloat16).");
  m.def("kernel_trial_calls", &ral::kernel_trial_calls,
        "The calls of an engine by which each of its kernel trials has decided.");
  m.def("host_cpu_flags", &ral::host_cpu_flags,
        "This CPU's flags as /proc/cpuinfo names them, as the runtime reads them (the "
        "features an engine records are checked against these when it loads).");
  m.def("missing_cpu_features", &ral::missing_cpu_features, py::arg("required"),
        "The features `required` lists (comma-separated) that this CPU lacks: why the "
        "runtime would refuse code compiled for them.");
  m.def("has_int8_dot_product", &ral::has_int8_dot_product,
        "Whether the CPU has VNNI, AVX-VNNI or AMX-INT8 (Blade's own int8 kernels).");
  m.def("set_int8_dot_product_allowed", &ral::set_int8_dot_product_allowed,
        py::arg("allowed"),
        "False makes this CPU behave as one without int8 dot products (tests).");
  m.def("int8_weight_limit", &ral::int8_weight_limit,
        "The largest |weight| this CPU's int8 kernels multiply exactly: 127 with a dot "
        "product, 64 with AVX2 only, 0 without int8 kernels.");
  m.def("int8_float_path_calls", &ral::int8_float_path_calls,
        "Calls of Blade's int8 ops that ran in float32: this CPU's kernels did not take "
        "their weight.");
  m.def("set_int8_pair_sums_allowed", &ral::set_int8_pair_sums_allowed, py::arg("allowed"),
        "False makes an AVX2 CPU behave as one without int8 kernels (tests).");
  m.def("set_call_profiling", &ral::set_call_profiling, py::arg("enabled"),
        "Whether engine calls are timed by kernel (benchmarks: call_profile below).");
  m.def("call_profile", &ral::call_profile,
        "(name, calls, seconds) for every library and kernel call timed since the last "
        "reset, and the engines' whole calls under 'engine calls (whole)'.");
  m.def("reset_call_profile", &ral::reset_call_profile, "Forgets the times taken so far.");
  m.def("int8_conv_available", &ral::int8_conv_available,
        "Whether int8 convolutions run the runtime's own kernel here (its register tiles "
        "on AVX-512 VNNI or, for weights within 64, AVX2, its AMX-INT8 tiles, or oneDNN's "
        "u8 x s8 microkernel on VNNI or AMX where those tiles do not run).");
  m.def("int8_depthwise_available", &ral::depthwise_uint8_available,
        "Whether int8 depthwise convolutions run the runtime's own kernel here (AVX-512).");
  m.def("int8_conv_tiles_run", &ral::int8_conv_tiles_run,
        "Whether that kernel multiplies in its own register tiles (else in AMX tiles or "
        "oneDNN's microkernel).");
  m.def("amx_int8_runs", &ral::amx_int8_runs,
        "Whether that kernel's AMX-INT8 tiles run in this process (the CPU has them, Linux "
        "granted their state, and they gave a plain loop's sums).");
  m.def("int8_wide_tile_rows", &ral::int8_wide_tile_rows,
        "Rows of the int8 VNNI register tiles of 4 vectors: 5 on AMD's Zen 4, 6 elsewhere.");
  m.def("set_int8_wide_tile_rows", &ral::set_int8_wide_tile_rows, py::arg("rows"),
        "5 or 6 runs those tiles at that height on any CPU, 0 at this CPU's (tests).");
  m.def("set_int8_conv_serial_products", &ral::set_int8_conv_serial_products,
        py::arg("products"),
        "Int8 convolutions of fewer multiply-adds run on one thread; 0 splits any between "
        "the threads, a negative value restores the default (tests).");
  m.def("set_int8_conv_tiles", &ral::set_int8_conv_tiles, py::arg("enabled"),
        "False multiplies by oneDNN's microkernel where it answers (tests).");
  m.def("set_depthwise_int8_enabled", &ral::set_depthwise_int8_enabled, py::arg("enabled"),
        "False packs int8 depthwise weights for the float32 kernel from now on, as on CPUs "
        "without VBMI (tests).");
  m.def("set_int8_conv_enabled", &ral::set_int8_conv_enabled, py::arg("enabled"),
        "False runs every int8 convolution and linear layer by oneDNN's instead (tests).");
  m.def("int8_conv_calls", &ral::int8_conv_calls,
        "How many int8 convolutions (depthwise too) and linear layers the runtime's own "
        "kernels ran in this process.");
  m.def("bf16_attention_supported", &ral::bf16_attention_supported,
        "Whether this CPU can multiply attention's operands in bfloat16 (AVX512-BF16).");
  m.def("bf16_attention_faster", &ral::bf16_attention_faster,
        "Whether int8 engines multiply attention's operands in bfloat16 here: supported, "
        "and faster than float32 (AMX-BF16 tiles, or the dot products as timed once).");
  m.def(
      "fused_attention",
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const std::optional<at::Tensor>& mask, double scale, bool bf16_products) {
        // The kernel trusts its caller's shapes (attention_kernels.cpp checks them).
        TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
                        k.size(3) == q.size(3) && v.size(2) == k.size(2) &&
                        k.sizes().slice(0, 2) == q.sizes().slice(0, 2) &&
                        v.sizes().slice(0, 2) == q.sizes().slice(0, 2),
                    "fused_attention: q ", q.sizes(), ", k ", k.sizes(), " and v ", v.sizes(),
                    " are not [batch, heads, length, head dim] attention operands");
        TORCH_CHECK(!mask.has_value() ||
                        at::is_expandable_to(mask->sizes(),
                                             {q.size(0), q.size(1), q.size(2), k.size(2)}),
                    "fused_attention: the mask does not broadcast to the scores");
        ral::Bf16AttentionProducts products(bf16_products, /*even_if_slower=*/true);
        at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
        TORCH_CHECK(ral::fused_attention_f32(q, k, v, mask, scale, true, out),
                    "fused_attention: the kernel does not take these operands");
        return out;
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("scale"),
      py::arg("bf16_products"),
      "The runtime's fused attention with bfloat16 products where the CPU has them, faster "
      "or not (bf16_products), or float32 ones, masked rows zeroed (tests).");
  m.def("bf16_conv_available", &ral::bf16_conv_available,
        "Whether the runtime's own bfloat16 convolution runs here (AVX512-BF16, no AMX).");
  m.def("bf16_conv_calls", &ral::bf16_conv_calls,
        "How many convolutions the runtime's own bfloat16 kernel ran in this process.");
  m.def(
      "bf16_conv2d",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         std::vector<int64_t> stride, std::vector<int64_t> padding, bool relu, bool silu,
         bool hardswish, const std::optional<at::Tensor>& added,
         const std::optional<at::Tensor>& input_scale) {
        TORCH_CHECK(ral::bf16_conv_available(), "bf16_conv2d: this CPU lacks AVX512-BF16");
        return float_conv2d("bf16_conv2d", ral::pack_bf16_conv_weight, ral::bf16_conv, x,
                            weight, bias, stride, padding, relu, silu, hardswish, added,
                            input_scale);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("relu"), py::arg("silu") = false, py::arg("hardswish") = false,
      py::arg("added") = py::none(), py::arg("input_scale") = py::none(),
      "The runtime's own bfloat16 convolution (NCHW in and out, the weight packed per "
      "call; `added`: a tensor of the result's shape added before the activation; "
      "`input_scale`: [N, C] the input is multiplied by first; tests).");
  m.def(
      "conv_tasks",
      [](int64_t batch, int64_t rows, int64_t blocks, int64_t max_rows, int64_t whole,
         bool columns_outer, int64_t threads) {
        TORCH_CHECK(batch > 0 && rows > 0 && blocks > 0 && max_rows > 0 && whole > 0 &&
                        threads > 0,
                    "conv_tasks: every count must be positive");
        const ral::ConvTasks work(batch, rows, blocks, max_rows, whole, columns_outer,
                                  threads);
        std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> tasks;
        for (int64_t t = 0; t < work.count(); ++t) {
          const auto task = work.at(t);
          tasks.emplace_back(task.image, task.block, task.first, task.rows);
        }
        return std::make_pair(tasks, work.step);
      },
      py::arg("batch"), py::arg("rows"), py::arg("blocks"), py::arg("max_rows"),
      py::arg("whole"), py::arg("columns_outer"), py::arg("threads"),
      "How the convolution kernels split their work: (image, column block, first row, "
      "rows) for each task in order, and the most rows a task holds (tests).");
  m.def("f32_conv_available", &ral::f32_conv_available,
        "Whether the runtime's own float32 convolution runs here (AVX-512F/BW/VL, or AVX2 "
        "and FMA).");
  m.def("set_f32_conv_enabled", &ral::set_f32_conv_enabled, py::arg("enabled"),
        "False makes float32 engines try Winograd's, MKL's or no kernel against oneDNN's "
        "convolution, as on a CPU without AVX2 (tests).");
  m.def("set_winograd_4x4", &ral::set_winograd_4x4, py::arg("enabled"),
        "False keeps Winograd's convolutions F(2x2, 3x3) (blade.set_winograd_4x4).");
  m.def("winograd_4x4_enabled", &ral::winograd_4x4_enabled,
        "Whether Winograd's convolutions may take F(4x4, 3x3).");
  m.def("winograd_calls", &ral::winograd_calls, py::arg("tile"),
        "How many convolutions Winograd's F(tile x tile, 3x3) ran in this process (tile 2 "
        "or 4; tests).");
  m.def("f32_conv_calls", &ral::f32_conv_calls,
        "How many convolutions the runtime's own float32 kernel ran in this process.");
  m.def("depth_sliced_conv_calls", &ral::depth_sliced_conv_calls,
        "How many of the runtime's float32 and bfloat16 convolutions (and linear layers) "
        "ran in slices of their depth, a deep 1x1 layer's weight and rows too large for L2 "
        "together (tests).");
  m.def(
      "f32_conv2d",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         std::vector<int64_t> stride, std::vector<int64_t> padding, bool relu, bool silu,
         bool hardswish, const std::optional<at::Tensor>& added,
         const std::optional<at::Tensor>& input_scale) {
        TORCH_CHECK(ral::f32_conv_available(), "f32_conv2d: this CPU lacks AVX2 and FMA");
        return float_conv2d("f32_conv2d", ral::pack_f32_conv_weight, ral::f32_conv, x, weight,
                            bias, stride, padding, relu, silu, hardswish, added, input_scale);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("relu"), py::arg("silu") = false, py::arg("hardswish") = false,
      py::arg("added") = py::none(), py::arg("input_scale") = py::none(),
      "The runtime's own float32 convolution (NCHW in and out, the weight packed per call; "
      "`added`: a tensor of the result's shape added before the activation; `input_scale`: "
      "[N, C] the input is multiplied by first; tests).");
  m.def(
      "set_bf16_attention",
      [](const std::string& mode) {
        static const std::map<std::string, ral::Bf16Attention> modes = {
            {"when faster", ral::Bf16Attention::kWhenFaster},
            {"always", ral::Bf16Attention::kAlways},
            {"never", ral::Bf16Attention::kNever}};
        const auto found = modes.find(mode);
        TORCH_CHECK(found != modes.end(), "set_bf16_attention: mode '", mode,
                    "' is not 'when faster', 'always' or 'never'");
        ral::set_bf16_attention(found->second);
      },
      py::arg("mode"),
      "Whether int8 engines multiply attention's operands in bfloat16: 'when faster' "
      "(the default), 'always' (where supported) or 'never' (tests).");
  m.def("set_bf16_attention_amx", &ral::set_bf16_attention_amx, py::arg("allowed"),
        "False makes the bf16 attention products skip AMX tiles for AVX512-BF16's dot "
        "products (tests).");
  m.def("kernel_call_result_counts", &ral::kernel_call_result_counts,
        "(placed, copied): kernel call results in this process that the op made in the "
        "engine's buffer, and that were copied into it.");
  m.def("settled_result_counts", &ral::settled_result_counts,
        "(placed, copied): results of ops offered the engine's buffer (convolutions, int8 "
        "kernel calls) in this process that they made there, and that were copied into it.");
  m.def("depthwise_conv_available", &ral::depthwise_conv_available,
        "Whether the runtime's own float32 depthwise convolution runs here (AVX-512, or AVX2 "
        "and FMA).");
  m.def(
      "depthwise_conv2d",
      [](const at::Tensor& x, const at::Tensor& filters, const std::optional<at::Tensor>& bias,
         std::vector<int64_t> stride, std::vector<int64_t> padding,
         std::vector<int64_t> dilation, bool relu, std::optional<at::Tensor> out, bool silu,
         bool hardswish) {
        TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 4 &&
                        filters.scalar_type() == at::kFloat && filters.dim() == 3 &&
                        filters.size(2) == x.size(3) && stride.size() == 2 &&
                        padding.size() == 2 && dilation.size() == 2,
                    "depthwise_conv2d: x float32 NHWC [n, h, w, c], filters [kh, kw, c], "
                    "stride, padding and dilation of 2; got ", x.sizes(), " and ",
                    filters.sizes());
        TORCH_CHECK(stride[0] > 0 && stride[1] > 0 && dilation[0] > 0 && dilation[1] > 0 &&
                        padding[0] >= 0 && padding[1] >= 0,
                    "depthwise_conv2d: positive strides and dilations and paddings of 0 or "
                    "more are needed");
        TORCH_CHECK(!bias.has_value() ||
                        (bias->scalar_type() == at::kFloat && bias->numel() == x.size(3)),
                    "depthwise_conv2d: the bias needs ", x.size(3), " float32 values");
        const at::Tensor input = x.contiguous();
        const at::Tensor f = filters.contiguous();
        const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
        const int64_t kh = f.size(0), kw = f.size(1);
        const std::vector<int64_t> made = at::native::conv_output_size(
            {x.size(0), x.size(3), x.size(1), x.size(2)}, {x.size(3), 1, kh, kw}, padding,
            stride, dilation);
        const int64_t oh = made[2], ow = made[3];
        at::Tensor y = out.has_value() ? *out : at::empty({x.size(0), oh, ow, x.size(3)},
                                                           x.options());
        TORCH_CHECK(y.is_contiguous() && y.scalar_type() == at::kFloat &&
                        y.sizes() == at::IntArrayRef({x.size(0), oh, ow, x.size(3)}),
                    "depthwise_conv2d: out must be a dense float32 [", x.size(0), ", ", oh, ", ",
                    ow, ", ", x.size(3), "], got ", y.sizes());
        TORCH_CHECK(oh > 0 && ow > 0 &&
                        ral::depthwise_conv2d(
                            input.data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3),
                            f.data_ptr<float>(), kh, kw, stride[0], stride[1], padding[0],
                            padding[1], dilation[0], dilation[1],
                            b.defined() ? b.data_ptr<float>() : nullptr,
                            ral::depthwise_post_op(activation_of(relu, silu, hardswish)),
                            y.data_ptr<float>(), oh, ow),
                    "depthwise_conv2d: does not run here (AVX-512, or AVX2 and FMA) or for a ",
                    kh, "x", kw, " filter");
        return y;
      },
      py::arg("x"), py::arg("filters"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
      py::arg("dilation"), py::arg("relu"), py::arg("out") = py::none(),
      py::arg("silu") = false, py::arg("hardswish") = false,
      "The runtime's own depthwise convolution (NHWC in and out, into `out` when given; "
      "SiLU after the bias where `silu`, else ReLU where `relu`; tests and benchmarks).");
  m.def("few_rows_gemm_available", &ral::few_rows_gemm_available,
        "Whether GEMMs of a few rows by a weight run the runtime's own loop here (AVX-512F).");
  m.def(
      "few_rows_gemm",
      [](const at::Tensor& x, const at::Tensor& w) {
        TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
                        x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
                    "few_rows_gemm: x [rows, K] and w [N, K] float32, got ", x.sizes(), " and ",
                    w.sizes());
        const at::Tensor a = x.contiguous();
        const at::Tensor b = w.contiguous();
        at::Tensor out = at::empty({x.size(0), w.size(0)}, x.options());
        TORCH_CHECK(ral::few_rows_gemm(a.data_ptr<float>(), a.size(1), b.data_ptr<float>(),
                                       b.size(1), out.data_ptr<float>(), out.size(1),
                                       a.size(0), b.size(0), a.size(1)),
                    "few_rows_gemm: does not run here or for ", x.size(0),
                    " rows (it takes 1 to ", ral::kFewRows, ", with AVX-512F)");
        return out;
      },
      py::arg("x"), py::arg("w"),
      "x @ w.T by the runtime's loop for a few rows (tests).");
  m.def("blocked_gemm_available", &ral::blocked_gemm_available,
        "Whether GEMMs by a weight's [K, N] copy run oneDNN's microkernel here (AVX-512F).");
  m.def(
      "blocked_gemm",
      [](const at::Tensor& a, const at::Tensor& b, bool panels) {
        TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                        a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
                    "blocked_gemm: a [M, K] and b [K, N] float32, got ", a.sizes(), " and ",
                    b.sizes());
        const at::Tensor lhs = a.contiguous();
        const at::Tensor rhs = panels ? ral::column_panels(b) : b.contiguous();
        at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
        const bool ran =
            panels ? ral::blocked_gemm_panels(lhs.data_ptr<float>(), lhs.size(1),
                                              rhs.data_ptr<float>(), b.size(1),
                                              out.data_ptr<float>(), out.size(1),
                                              lhs.size(0), lhs.size(1))
                   : ral::blocked_gemm(lhs.data_ptr<float>(), lhs.size(1),
                                       rhs.data_ptr<float>(), rhs.size(1),
                                       out.data_ptr<float>(), out.size(1), lhs.size(0),
                                       lhs.size(1));
        TORCH_CHECK(ran, "blocked_gemm: does not run here (it needs AVX-512F) or for sizes ",
                    a.sizes(), " x ", b.sizes());
        return out;
      },
      py::arg("a"), py::arg("b"), py::arg("panels") = false,
      "a @ b by blocked_gemm, or with `panels` by blocked_gemm_panels on b's column panels "
      "(tests).");
  m.def("prepared_weights_bytes", &ral::prepared_weights_bytes,
        "Bytes the prepared weight copies of all engines hold.");
  m.attr("ENGINE_FORMAT_VERSION") = ral::kEngineFormatVersion;
  m.def("count_outside_tolerance", &count_outside_tolerance, py::arg("got"), py::arg("want"),
        py::arg("rtol"), py::arg("atol"), py::call_guard<py::gil_scoped_release>(),
        "How many elements differ by more than atol + rtol * |want| or hold a NaN or an "
        "infinity where the other does not (float32 or float64; the engine check's pass).");
  m.def("spec_dtypes", &ral::spec_dtypes,
        "The dtypes the runtime's tensor specs (float32[2,8]) name, in its table's order: "
        "(name, ScalarType name) pairs.");

  // Signing and trust (ral/signing.h): here and in C++ only, never reachable from TorchScript.
  m.def("sign_engine", &ral::sign_engine, py::arg("name"), py::arg("code"),
        py::arg("input_specs"), py::arg("output_specs"), py::arg("fallback_ir"),
        py::arg("params"), py::arg("fallback_mode"), py::arg("cpu_features"),
        py::arg("key_path"), py::arg("precision") = "float32", py::arg("writes") = "",
        py::call_guard<py::gil_scoped_release>(),
        "The signature an Engine with these fields verifies, made with the key at "
        "`key_path` (this machine's key when empty).");
  m.def(
      "create_signed_engine",
      [](std::string name, at::Tensor code, std::string input_specs, std::string output_specs,
         std::string fallback_ir, std::vector<at::Tensor> params, std::string fallback_mode,
         std::string cpu_features, std::string precision, const std::string& key_path,
         std::string writes, const std::optional<py::bytes>& digest) {
        const std::optional<ral::Digest> known =
            digest ? std::optional<ral::Digest>(to_digest(*digest)) : std::nullopt;
        c10::intrusive_ptr<ral::Engine> engine;
        {
          py::gil_scoped_release released;
          engine = known ? ral::Engine::create_with_digest(
                               std::move(name), std::move(code), std::move(input_specs),
                               std::move(output_specs), std::move(fallback_ir),
                               std::move(params), std::move(fallback_mode),
                               std::move(cpu_features), std::move(precision), key_path,
                               std::move(writes), *known)
                         : ral::Engine::create_signed(
                               std::move(name), std::move(code), std::move(input_specs),
                               std::move(output_specs), std::move(fallback_ir),
                               std::move(params), std::move(fallback_mode),
                               std::move(cpu_features), std::move(precision), key_path,
                               std::move(writes));
        }
        return torch::jit::toPyObject(c10::IValue(std::move(engine)));
      },
      py::arg("name"), py::arg("code"), py::arg("input_specs"), py::arg("output_specs"),
      py::arg("fallback_ir"), py::arg("params"), py::arg("fallback_mode"),
      py::arg("cpu_features"), py::arg("precision"), py::arg("key_path"), py::arg("writes") = "",
      py::arg("digest") = std::nullopt,
      "A torch.classes.blade.Engine of these fields, signed with the key at `key_path` (this "
      "machine's key when empty), its digest computed once for signing and verifying; or, "
      "given `digest` (Engine.digest() of an engine of the same fields, params and code, as "
      "bytes), signed over it without hashing anything.");
  m.def("signing_public_key", &ral::signing_public_key, py::arg("key_path"),
        "The public key (hex) of the signing key at `key_path` (this machine's key, created "
        "on first use, when empty).");
  m.def("default_signing_key_path", &ral::default_signing_key_path);
  m.def("node_kinds", &passes::node_kinds, py::arg("graph"),
        "The distinct kinds of the graph's nodes, in blocks and subgraphs too, sorted "
        "(csrc/passes/graph_contents.h).");
  m.def("tensors_in_containers", &passes::tensors_in_containers, py::arg("graph"),
        "How many tensors the graph's non-tensor constants (lists, tuples, ...) hold, in the "
        "functions it calls too.");
  m.def("tensor_constants", &passes::tensor_constants, py::arg("graph"),
        "The tensors of the graph's tensor constants and of the functions it calls "
        "(csrc/passes/graph_contents.h).");
  m.def("set_tensor_constants", &passes::set_tensor_constants, py::arg("graph"),
        py::arg("values"), py::arg("retype"),
        "Gives those constants these tensors, in the same order (with `retype`, their types "
        "too).");
  m.def(
      "remove_attribute",
      [](const std::vector<py::object>& instances, const std::string& name) {
        std::vector<torch::jit::Module> modules;
        for (const auto& instance : instances) {
          modules.push_back(py::cast<torch::jit::Module>(instance));
        }
        return passes::remove_attribute(modules, name);
      },
      py::arg("instances"), py::arg("name"),
      "Removes an attribute from every module of one class type and from the type "
      "(csrc/passes/graph_contents.h).");
  // The model cache (blade.model_cache) keys a model by the bytes of its weights.
  m.def(
      "storage_digest",
      [](const at::Tensor& tensor) {
        TORCH_CHECK(tensor.device().is_cpu() && tensor.has_storage(),
                    "blade: storage_digest takes a CPU tensor with storage, got ",
                    tensor.toString());
        const c10::Storage& storage = tensor.storage();
        const auto* data = static_cast<const uint8_t*>(storage.data());
        ral::Digest digest;
        {
          py::gil_scoped_release released;
          digest = ral::chunked_sha256(data, storage.nbytes());
        }
        return py::bytes(reinterpret_cast<const char*>(digest.data()), digest.size());
      },
      py::arg("tensor"),
      "The SHA-256 (hashed in chunks on the intra-op threads) of all the bytes of the "
      "storage under `tensor`, whatever part of it the tensor views.");
  // The compile cache (blade.codegen.cache) signs and verifies its entries' digests.
  m.def(
      "sign_digest",
      [](const py::bytes& digest, const std::string& key_path) {
        return ral::sign_digest(to_digest(digest), key_path);
      },
      py::arg("digest"), py::arg("key_path"),
      "The signature of a SHA-256 digest by the key at `key_path` (this machine's when "
      "empty).");
  m.def(
      "verify_digest",
      [](const py::bytes& digest, const std::string& signature) {
        return ral::verify_digest(to_digest(digest), signature, nullptr);
      },
      py::arg("digest"), py::arg("signature"),
      "Empty when `signature` signs the SHA-256 `digest` with a trusted key, else why not.");
  m.def("trust_public_key", &ral::trust_public_key, py::arg("public_key"),
        "Engines signed by this Ed25519 public key (64 hex digits) run their code here.");
  m.def("trusted_public_keys", &ral::trusted_public_keys);
}
