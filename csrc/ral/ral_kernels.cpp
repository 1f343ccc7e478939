#include "ral/ral_kernels.h"

#include "ral/engine.h"
#include "ral/fused_attention.h"
#include "ral/kernel_calls.h"
#include "ral/kernel_trials.h"
#include "ral/mkl_functions.h"
#include "ral/prepared_weights.h"
#include "ral/winograd.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <vector>

namespace {

thread_local std::string kernel_error;
thread_local blade::ral::ErrorSink* error_sink = nullptr;

// A tensor viewing the memory a descriptor describes (no copy, not owned).
at::Tensor view_of(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type) {
  const auto* d = static_cast<const int64_t*>(memref->descriptor);
  const int64_t rank = memref->rank;
  auto* aligned = reinterpret_cast<char*>(d[1]);
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(scalar_type));
  std::vector<int64_t> sizes(d + 3, d + 3 + rank);
  std::vector<int64_t> strides(d + 3 + rank, d + 3 + 2 * rank);
  return at::from_blob(aligned + d[2] * element_size, sizes, strides,
                       at::TensorOptions().dtype(scalar_type));
}

template <typename Fn>
void guarded(const char* what, Fn&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    blade::ral::record_kernel_error(std::string(what) + ": " + e.what());
  } catch (...) {
    blade::ral::record_kernel_error(std::string(what) + ": unknown error");
  }
}

using blade::ral::Stopwatch;

// Copies `rank`-dimensional strided data (sizes/strides in elements) whose innermost
// elements form contiguous runs of `run_bytes` on both sides: one memcpy per run.
void copy_runs(const char* src, char* dst, const int64_t* sizes, const int64_t* src_strides,
               const int64_t* dst_strides, int64_t rank, int64_t element_size,
               size_t run_bytes) {
  if (rank == 0) {
    std::memcpy(dst, src, run_bytes);
    return;
  }
  for (int64_t i = 0; i < sizes[0]; ++i) {
    copy_runs(src + i * src_strides[0] * element_size, dst + i * dst_strides[0] * element_size,
              sizes + 1, src_strides + 1, dst_strides + 1, rank - 1, element_size, run_bytes);
  }
}

// Below this many bytes a copy runs on the calling thread: splitting it costs more than it
// saves.
constexpr int64_t kParallelCopyBytes = 256 * 1024;

// What memref.copy lowers to (a padded pooling input, a slice written into a
// concatenation). The innermost dims both sides store contiguously are merged into runs
// copied with memcpy, and a large copy is split over the intra-op threads along its
// outermost two dims (or, when all of it is one run, into equal chunks): the pad copy of a
// ResNet-18's max pooling, one element at a time on one thread, took 6% of the model.
void strided_copy(const char* src, char* dst, const int64_t* sizes, const int64_t* src_strides,
                  const int64_t* dst_strides, int64_t rank, int64_t element_size) {
  int64_t run = 1;  // elements per contiguous run
  int64_t outer_rank = rank;
  while (outer_rank > 0 && src_strides[outer_rank - 1] == run &&
         dst_strides[outer_rank - 1] == run) {
    run *= sizes[outer_rank - 1];
    --outer_rank;
  }
  int64_t total = run * element_size;
  for (int64_t d = 0; d < outer_rank; ++d) {
    total *= sizes[d];
  }
  const size_t run_bytes = static_cast<size_t>(run * element_size);
  if (total < kParallelCopyBytes || at::in_parallel_region()) {
    copy_runs(src, dst, sizes, src_strides, dst_strides, outer_rank, element_size, run_bytes);
    return;
  }
  if (outer_rank == 0) {  // one contiguous run: equal chunks
    const int64_t chunk = kParallelCopyBytes / 4;
    at::parallel_for(0, (total + chunk - 1) / chunk, 1, [&](int64_t begin, int64_t end) {
      const int64_t from = begin * chunk;
      const int64_t to = std::min(total, end * chunk);
      std::memcpy(dst + from, src + from, static_cast<size_t>(to - from));
    });
    return;
  }
  // Tasks over the outermost two dims, so that a batch of one still splits.
  const int64_t inner = outer_rank >= 2 ? sizes[1] : 1;
  const int64_t split_rank = outer_rank >= 2 ? 2 : 1;
  at::parallel_for(0, sizes[0] * inner, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t src_offset = (i / inner) * src_strides[0] +
                                 (split_rank == 2 ? (i % inner) * src_strides[1] : 0);
      const int64_t dst_offset = (i / inner) * dst_strides[0] +
                                 (split_rank == 2 ? (i % inner) * dst_strides[1] : 0);
      copy_runs(src + src_offset * element_size, dst + dst_offset * element_size,
                sizes + split_rank, src_strides + split_rank, dst_strides + split_rank,
                outer_rank - split_rank, element_size, run_bytes);
    }
  });
}

// ATen's out= variants resize an output of the wrong shape and copy_ broadcasts into one;
// the generated code's buffers must be written exactly, so shapes are checked first.
void check_result_shape(const char* what, const at::Tensor& out, at::IntArrayRef expected) {
  TORCH_CHECK(out.sizes() == expected, what, ": the output buffer has shape ", out.sizes(),
              ", the result has shape ", expected);
}

// A tensor of rank >= 2 read as rows of its last dim: the rows (all other dims folded) and
// the distance between consecutive rows, in elements. False when the rows are not evenly
// spaced with unit column stride, or overlap.
bool as_rows(const at::Tensor& t, int64_t* rows, int64_t* row_stride) {
  const int64_t rank = t.dim();
  const int64_t columns = t.size(rank - 1);
  if (rank < 2 || (t.stride(rank - 1) != 1 && columns != 1)) {
    return false;
  }
  int64_t count = 1;
  int64_t step = columns;
  int64_t expected = -1;  // the stride the next folded dim must have
  for (int64_t i = rank - 2; i >= 0; --i) {
    if (t.size(i) == 1) {
      continue;
    }
    if (expected < 0) {
      step = t.stride(i);
    } else if (t.stride(i) != expected) {
      return false;
    }
    expected = t.stride(i) * t.size(i);
    count *= t.size(i);
  }
  if (count > 1 && step < columns) {
    return false;
  }
  *rows = count;
  *row_stride = std::max(step, columns);
  return true;
}

// Whether PyTorch's oneDNN kernels take bfloat16 data on this CPU (elsewhere they raise, and
// a bfloat16 model's GEMMs and convolutions take ATen's own route).
bool onednn_takes_bf16() {
  static const bool takes =
      blade::ral::missing_cpu_features("avx512bw,avx512vl,avx512dq").empty() ||
      blade::ral::missing_cpu_features("avx_ne_convert").empty();
  return takes;
}

// oneDNN's convolution that adds its result into an existing channels_last tensor (what
// Inductor uses for conv + add): with `target` (already of the result's shape) zeroed it
// convolves straight into the engine's buffer, where at::conv2d would allocate a fresh
// output (page faults on every call) that then had to be copied. float32 data, or a
// bfloat16 model's. False when it does not apply or is unavailable, and the caller
// convolves as usual.
bool convolve_into(at::Tensor& target, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation, int64_t groups) {
  static const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(
      c10::OperatorName("mkldnn::_convolution_pointwise_", "binary"));
  const auto cl = at::MemoryFormat::ChannelsLast;
  // A oneDNN weight (PreparedWeights::onednn_weight) has no strides to check.
  const auto dtype = target.scalar_type();
  const bool takes_dtype =
      dtype == at::kFloat || (dtype == at::kBFloat16 && onednn_takes_bf16());
  if (!op.has_value() || !takes_dtype ||
      x.scalar_type() != dtype || !x.is_contiguous(cl) ||
      (!w.is_mkldnn() && !w.is_contiguous(cl)) || !target.is_contiguous(cl)) {
    return false;
  }
  // An error here (none is expected for these operands) propagates: the engine falls back
  // for the call and reports it.
  target.zero_();
  // out = conv(x, w) + bias + out: the bias as the convolution's own. The ReLU is not its
  // post-op: oneDNN's is a vmaxps that turns NaN into 0, where torch.relu keeps NaN. A pass
  // over the result just written (in cache) costs 2-3% of a 1x1 convolution of 64
  // channels on 56 x 56 and under 1% of a 3x3 one (2 threads).
  torch::jit::Stack stack{target,
                          x,
                          w,
                          bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                          padding,
                          stride,
                          dilation,
                          groups,
                          std::string("add"),
                          at::Scalar(1.0),
                          c10::IValue(),
                          c10::List<std::optional<at::Scalar>>(),
                          c10::IValue()};
  op->callBoxed(&stack);
  if (relu) {
    target.relu_();  // max(x, 0) keeping NaN, as eager
  }
  return true;
}

// `weight` as it is, for a kernel about to read it so: a weight the running engine released
// (its memory given back, prepared_weights.h) gets its values back first.
const at::Tensor& plain(const at::Tensor& weight) {
  if (blade::ral::PreparedWeights* prepared = blade::ral::active_prepared_weights()) {
    prepared->ensure_plain(weight);
  }
  return weight;
}

// lhs[M, K] @ op(weight) as oneDNN's 1x1 convolution of [1, K, 1, M] channels_last data
// (the rows as they lie) by the weight's oneDNN copy, written straight into the rows of
// `result`. False when the rows are not densely packed or the weight has no copy.
bool onednn_matmul(blade::ral::PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows,
                   int64_t lda, const at::Tensor& weight, bool transposed,
                   const at::Tensor& result, int64_t ldc) {
  const int64_t k = lhs.size(-1);
  const int64_t n = result.size(-1);
  if (lda != k || ldc != n || rows <= 0 || k <= 0 || n <= 0) {
    return false;
  }
  const std::vector<int64_t> input_size{1, k, 1, rows};
  at::Tensor w = prepared->onednn_weight(weight, transposed, input_size, {0, 0}, {1, 1},
                                         {1, 1}, 1);
  if (!w.defined()) {
    return false;
  }
  const at::Tensor x = at::from_blob(lhs.data_ptr(), input_size, {rows * k, 1, rows * k, k},
                                     lhs.options());
  at::Tensor target = at::from_blob(result.data_ptr(), {1, n, 1, rows},
                                    {rows * n, 1, rows * n, n}, result.options());
  return convolve_into(target, x, w, std::nullopt, false, {0, 0}, {1, 1}, {1, 1}, 1);
}

// out[m, n] = lhs[m, k] @ op(weight) + beta * out by MKL's sgemm, reading the 2-d weight as
// it is ([n, k] when `transposed`, else [k, n]; unit stride along its rows). False without
// MKL or when a size does not fit its int arguments.
bool gemm_by_weight(const float* lhs, int64_t lda, const at::Tensor& weight, bool transposed,
                    float* out, int64_t ldc, int64_t m, float beta) {
  const auto fits = [](int64_t v) { return v > 0 && v <= std::numeric_limits<int>::max(); };
  if (blade::ral::mkl_functions().sgemm == nullptr || weight.dim() != 2 ||
      weight.scalar_type() != at::kFloat || weight.stride(1) != 1 || !fits(m) ||
      !fits(weight.size(0)) || !fits(weight.size(1)) || !fits(weight.stride(0)) ||
      !fits(lda) || !fits(ldc)) {
    return false;
  }
  const int64_t n = transposed ? weight.size(0) : weight.size(1);
  const int64_t k = transposed ? weight.size(1) : weight.size(0);
  blade::ral::sgemm_row_major(false, transposed, m, n, k, 1.0F, lhs, lda,
                              weight.data_ptr<float>(), weight.stride(0), beta, out, ldc);
  return true;
}

// `result` (bfloat16) widened into `target` (float32, of the same shape and strides, both
// dense), then max(x, 0) keeping NaN where `relu`: one pass over the memory where a copy
// and a ReLU took two (ResNet-50's convolutions are mostly followed by one).
void widen_bf16(const at::Tensor& result, const at::Tensor& target, bool relu) {
  if (result.strides() != target.strides() || !result.is_non_overlapping_and_dense() ||
      result.sizes() != target.sizes()) {
    target.copy_(result);
    if (relu) {
      target.relu_();  // max(x, 0) keeping NaN, as eager
    }
    return;
  }
  const auto* source = static_cast<const uint16_t*>(result.data_ptr());
  auto* destination = static_cast<float*>(target.data_ptr());
  at::parallel_for(0, result.numel(), 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t bits = static_cast<uint32_t>(source[i]) << 16;  // bfloat16's bits
      float value = 0.0F;
      std::memcpy(&value, &bits, sizeof(value));
      // NaN < 0 is false: NaN stays, as torch.relu keeps it.
      destination[i] = relu && value < 0.0F ? 0.0F : value;
    }
  });
}

// The convolution in bfloat16 (a bf16 engine: prepared_weights.h) into `target`: the input
// rounded to bfloat16, convolved by the weight's bfloat16 oneDNN copy with the float32 bias
// (float32 accumulation), the result widened into `target`, then the ReLU keeping NaN. `w`
// is a convolution weight, or a GEMM's 2-d rhs convolved as 1x1 (`transposed` as for
// PreparedWeights::onednn_weight). False when oneDNN's convolution is unavailable or the
// weight has no copy.
bool convolve_bf16(blade::ral::PreparedWeights* prepared, const at::Tensor& x,
                   const at::Tensor& w, bool transposed, const at::Tensor& target,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation) {
  static const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(
      c10::OperatorName("mkldnn::_convolution_pointwise", ""));
  if (!op.has_value() || x.scalar_type() != at::kFloat || x.numel() == 0 ||
      target.numel() == 0) {
    return false;
  }
  const at::Tensor reordered = prepared->onednn_weight(w, transposed, x.sizes().vec(), padding,
                                                       stride, dilation, 1, /*bf16=*/true);
  if (!reordered.defined()) {
    return false;
  }
  torch::jit::Stack stack{x.to(at::kBFloat16),
                          reordered,
                          bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                          padding,
                          stride,
                          dilation,
                          int64_t{1},
                          std::string("none"),
                          c10::List<std::optional<at::Scalar>>(),
                          c10::IValue()};
  op->callBoxed(&stack);
  widen_bf16(stack.at(0).toTensor(), target, relu);
  return true;
}

// lhs[M, K] @ op(weight) in bfloat16 (a bf16 engine): oneDNN's 1x1 convolution of the rows
// as [1, K, 1, M] channels_last data (convolve_bf16), or, for a row count past the weight's
// reordered copies, its plain bfloat16 copy in oneDNN's matmul (which reorders it on every
// call: 10-20% slower at BERT's sizes), the result widened into the rows of `result`. False
// when the weight has neither copy.
bool bf16_matmul(blade::ral::PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows,
                 int64_t lda, const at::Tensor& weight, bool transposed,
                 const at::Tensor& result, int64_t ldc) {
  const int64_t k = lhs.size(-1);
  const int64_t n = result.size(-1);
  if (rows <= 0 || k <= 0 || n <= 0) {
    return false;
  }
  const at::Tensor x =
      at::from_blob(lhs.data_ptr(), {1, k, 1, rows}, {rows * lda, 1, rows * lda, lda},
                    lhs.options());
  const at::Tensor target =
      at::from_blob(result.data_ptr(), {1, n, 1, rows}, {rows * ldc, 1, rows * ldc, ldc},
                    result.options());
  if (convolve_bf16(prepared, x, weight, transposed, target, std::nullopt, false, {0, 0},
                    {1, 1}, {1, 1})) {
    return true;
  }
  const at::Tensor matrix = prepared->bf16_matrix(weight, transposed);  // [N, K]
  if (!matrix.defined()) {
    return false;
  }
  const at::Tensor a =
      at::from_blob(lhs.data_ptr(), {rows, k}, {lda, 1}, lhs.options()).to(at::kBFloat16);
  at::from_blob(result.data_ptr(), {rows, n}, {ldc, 1}, result.options())
      .copy_(at::linear(a, matrix));
  return true;
}

// lhs @ weight through the engine's packed copy of the weight, when `weight` is a param of
// the running engine and both row operands fold to 2-d (see prepared_weights.h).
bool packed_matmul(const at::Tensor& lhs, const at::Tensor& weight, bool transposed,
                   const at::Tensor& result) {
  blade::ral::PreparedWeights* prepared = blade::ral::active_prepared_weights();
  int64_t rows = 0;
  int64_t lda = 0;
  int64_t out_rows = 0;
  int64_t ldc = 0;
  if (prepared == nullptr || weight.dim() != 2 || !as_rows(lhs, &rows, &lda) ||
      !as_rows(result, &out_rows, &ldc) || rows != out_rows) {
    return false;
  }
  // A model in bfloat16 itself: oneDNN's 1x1 convolution by the weight's reordered copy.
  if (lhs.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16) {
    return onednn_takes_bf16() &&
           onednn_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc);
  }
  if (lhs.scalar_type() != at::kFloat) {
    return false;
  }
  if (prepared->bf16() && bf16_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc)) {
    return true;
  }
  // oneDNN's 1x1 convolution or MKL's sgemm on the weight as it is, whichever the
  // engine's first calls find faster (PreparedWeights::next_kernel); MKL's packed GEMM
  // where oneDNN's does not apply.
  using Kernel = blade::ral::PreparedWeights::Kernel;
  const std::vector<int64_t> input_size{1, lhs.size(-1), 1, rows};
  const Kernel kernel = prepared->next_kernel(weight, transposed, input_size, Kernel::kGemm);
  const Stopwatch stopwatch;
  if ((kernel == Kernel::kOneDnn &&
       onednn_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc)) ||
      (kernel == Kernel::kGemm &&
       gemm_by_weight(lhs.data_ptr<float>(), lda, plain(weight), transposed,
                      result.data_ptr<float>(), ldc, rows, 0.0F))) {
    prepared->record_kernel_time(weight, transposed, input_size, kernel, stopwatch.seconds());
    // A trial's first call runs oneDNN's too (its result the same within rounding).
    if (kernel == Kernel::kGemm && prepared->onednn_run_pending(weight, transposed, input_size)) {
      const Stopwatch again;
      if (onednn_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc)) {
        prepared->record_kernel_time(weight, transposed, input_size, Kernel::kOneDnn,
                                     again.seconds());
      }
    }
    return true;
  }
  return prepared->matmul_f32(lhs.data_ptr<float>(), lda, weight, transposed,
                              result.data_ptr<float>(), ldc, rows);
}

// A 1x1 convolution (stride 1, no padding, one group) of dense NHWC float32 data by a
// param, as MKL's sgemm of its [N*H*W, C] rows by the weight [O, C] transposed, written
// straight into the rows of `target` (after the bias, with beta 1), then the ReLU keeping
// NaN. False when MKL cannot take it.
bool convolve_1x1_by_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                          const std::optional<at::Tensor>& bias, bool relu) {
  const int64_t rows = x.size(0) * x.size(2) * x.size(3);
  const int64_t channels = x.size(1);
  const int64_t outputs = w.size(0);
  if (bias.has_value()) {
    at::from_blob(target.data_ptr(), {rows, outputs}, target.options())
        .copy_(bias->view({1, outputs}).expand({rows, outputs}));
  }
  if (!gemm_by_weight(x.data_ptr<float>(), channels, w.view({outputs, channels}), true,
                      target.data_ptr<float>(), outputs, rows,
                      bias.has_value() ? 1.0F : 0.0F)) {
    return false;
  }
  if (relu) {
    target.relu_();  // max(x, 0) keeping NaN, as eager
  }
  return true;
}

bool is_1x1_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                 const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                 const std::vector<int64_t>& dilation, int64_t groups) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && groups == 1 &&
         w.size(1) == x.size(1) && w.size(2) == 1 && w.size(3) == 1 && w.is_contiguous() &&
         padding == std::vector<int64_t>{0, 0} && stride == std::vector<int64_t>{1, 1} &&
         x.is_contiguous(cl) && target.is_contiguous(cl) && x.numel() > 0 &&
         target.numel() > 0;
}

void matmul(c10::ScalarType dtype, BladeUnrankedMemRef* a, BladeUnrankedMemRef* b,
            BladeUnrankedMemRef* out, int64_t transpose_b) noexcept {
  guarded("blade_ral_matmul", [&] {
    const at::Tensor weight = view_of(b, dtype);
    at::Tensor rhs = transpose_b != 0 ? weight.transpose(-1, -2) : weight;
    at::Tensor lhs = view_of(a, dtype);
    at::Tensor result = view_of(out, dtype);
    TORCH_CHECK(lhs.dim() >= 2 && rhs.dim() >= 2 && lhs.size(-1) == rhs.size(-2),
                "blade_ral_matmul: cannot multiply ", lhs.sizes(), " by ", rhs.sizes());
    std::vector<int64_t> expected = at::infer_size(lhs.sizes().slice(0, lhs.dim() - 2),
                                                   rhs.sizes().slice(0, rhs.dim() - 2));
    expected.push_back(lhs.size(-2));
    expected.push_back(rhs.size(-1));
    check_result_shape("blade_ral_matmul", result, expected);
    if (!packed_matmul(lhs, weight, transpose_b != 0, result)) {
      plain(weight);
      at::matmul_out(result, lhs, rhs);
    }
  });
}

void sort_along(c10::ScalarType dtype, BladeUnrankedMemRef* input, BladeUnrankedMemRef* values,
                BladeUnrankedMemRef* indices, int64_t dimension, bool descending,
                bool stable, int64_t k) noexcept {
  guarded("blade_ral_sort", [&] {
    const at::Tensor x = view_of(input, dtype);
    at::Tensor sorted = view_of(values, dtype);
    at::Tensor order = view_of(indices, at::kLong);
    TORCH_CHECK(x.dim() == 0 ? dimension == 0 : dimension >= 0 && dimension < x.dim(),
                "blade_ral_sort: dimension ", dimension, " of a tensor of rank ", x.dim());
    std::vector<int64_t> expected(x.sizes().begin(), x.sizes().end());
    if (k > 0) {
      TORCH_CHECK(x.dim() > 0 && k <= x.size(dimension), "blade_ral_sort: the first ", k,
                  " of ", x.sizes(), " along dim ", dimension);
      expected[static_cast<size_t>(dimension)] = k;
    }
    check_result_shape("blade_ral_sort", sorted, expected);
    check_result_shape("blade_ral_sort", order, expected);
    if (k > 0) {
      at::topk_out(sorted, order, x, k, dimension, /*largest=*/descending, /*sorted=*/true);
    } else {
      at::sort_out(sorted, order, x, stable, dimension, descending);
    }
  });
}

// The [N, O, H, W] sizes of conv2d(x, w) with symmetric `padding`.
std::vector<int64_t> conv_output_sizes(const at::Tensor& x, const at::Tensor& w,
                                       const std::vector<int64_t>& padding,
                                       const std::vector<int64_t>& stride,
                                       const std::vector<int64_t>& dilation) {
  std::vector<int64_t> sizes{x.size(0), w.size(0)};
  for (int64_t d = 0; d < 2; ++d) {
    const int64_t reach = x.size(2 + d) + 2 * padding[d] - dilation[d] * (w.size(2 + d) - 1) - 1;
    TORCH_CHECK(reach >= 0 && stride[d] > 0, "blade_ral_conv2d: input ", x.sizes(),
                " is smaller than the dilated kernel ", w.sizes());
    sizes.push_back(reach / stride[d] + 1);
  }
  return sizes;
}

// Winograd's F(2x2, 3x3) (winograd.h) where it can beat oneDNN's direct convolution (the
// engine's first calls then time both: PreparedWeights::next_kernel): float32
// NHWC data convolved by a 3x3 param with stride 1, no dilation, one group, padding 1 on
// every side, both buffers dense, and enough channels for the GEMMs to outweigh the
// transforms. Measured at 2 threads (Winograd / oneDNN, ms): C=K=64 on [4, 64, 56, 56]
// 3.3 / 4.2, C=96 K=32 on 96 x 96 4.4 / 4.9, C=K=256 on 14 x 14 0.68 / 1.06; but C=K=32
// 0.46 / 0.41, C=16 K=32 1.08 / 0.78, C=64 K=16 0.18 / 0.16.
constexpr int64_t kWinogradMinChannels = 32;        // C and K each
constexpr int64_t kWinogradMinChannelPairs = 3072;  // C * K

bool winograd_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                      const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                      const std::vector<int64_t>& dilation, int64_t groups) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && groups == 1 &&
         w.size(1) == x.size(1) && w.size(2) == 3 && w.size(3) == 3 &&
         padding == std::vector<int64_t>{1, 1} &&
         stride == std::vector<int64_t>{1, 1} && dilation == std::vector<int64_t>{1, 1} &&
         x.size(1) >= kWinogradMinChannels && w.size(0) >= kWinogradMinChannels &&
         x.size(1) * w.size(0) >= kWinogradMinChannelPairs && x.is_contiguous(cl) &&
         target.is_contiguous(cl);
}

// The convolution by Winograd's algorithm into `target` (an NCHW view of the NHWC buffer,
// its shape checked); false when the weight has no Winograd form (not a param), a size
// is empty, or too much of the input is inf or NaN (winograd.h).
bool convolve_winograd(blade::ral::PreparedWeights* prepared, const at::Tensor& x,
                       const at::Tensor& w, const at::Tensor& target,
                       const std::optional<at::Tensor>& bias, bool relu) {
  const at::Tensor transformed = prepared->winograd(w);
  if (!transformed.defined()) {
    return false;
  }
  const at::Tensor dense_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor dense_weight = w.contiguous();  // a param: already contiguous
  return blade::ral::winograd_conv3x3(
      x.data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1),
      transformed.data_ptr<float>(), dense_weight.data_ptr<float>(), w.size(0),
      dense_bias.defined() ? dense_bias.data_ptr<float>() : nullptr, relu,
      target.data_ptr<float>());
}

void conv2d(c10::ScalarType dtype, BladeUnrankedMemRef* input, BladeUnrankedMemRef* weight,
            BladeUnrankedMemRef* out, int64_t stride_h, int64_t stride_w, int64_t pad_top,
            int64_t pad_bottom, int64_t pad_left, int64_t pad_right, int64_t dilation_h,
            int64_t dilation_w, int64_t groups, bool channels_last,
            BladeUnrankedMemRef* bias_memref = nullptr, bool relu = false) noexcept {
  guarded(channels_last ? "blade_ral_conv2d_nhwc" : "blade_ral_conv2d", [&] {
    // NHWC buffers are viewed as NCHW tensors with channels_last strides: PyTorch (oneDNN)
    // convolves those without reordering them, and returns a channels_last result.
    const auto as_nchw = [&](at::Tensor t) { return channels_last ? t.permute({0, 3, 1, 2}) : t; };
    at::Tensor x = as_nchw(view_of(input, dtype));
    std::vector<int64_t> padding{pad_top, pad_left};
    if (pad_top != pad_bottom || pad_left != pad_right) {
      x = at::constant_pad_nd(x, {pad_left, pad_right, pad_top, pad_bottom}, 0);
      padding = {0, 0};
    }
    const std::vector<int64_t> stride{stride_h, stride_w};
    const std::vector<int64_t> dilation{dilation_h, dilation_w};
    at::Tensor w = view_of(weight, dtype);
    at::Tensor target = as_nchw(view_of(out, dtype));
    check_result_shape("blade_ral_conv2d", target,
                       conv_output_sizes(x, w, padding, stride, dilation));
    std::optional<at::Tensor> bias;
    if (bias_memref != nullptr) {
      bias = view_of(bias_memref, dtype).reshape({-1});
      TORCH_CHECK(bias->numel() == w.size(0), "blade_ral_conv2d: a bias of ", bias->numel(),
                  " values for ", w.size(0), " output channels");
    }
    blade::ral::PreparedWeights* prepared = blade::ral::active_prepared_weights();
    // A bf16 engine's convolutions by its params (depthwise and grouped ones excepted:
    // memory-bound, they ran slower in bfloat16 with the conversions) run in bfloat16.
    if (channels_last && prepared != nullptr && prepared->bf16() && groups == 1 &&
        convolve_bf16(prepared, x, w, false, target, bias, relu, padding, stride, dilation)) {
      return;
    }
    // A second kernel where one applies (Winograd's algorithm, MKL's sgemm), timed
    // against oneDNN's on the engine's first calls (PreparedWeights::next_kernel).
    using Kernel = blade::ral::PreparedWeights::Kernel;
    Kernel alternative = Kernel::kOneDnn;
    if (channels_last && prepared != nullptr) {
      if (winograd_applies(x, w, target, padding, stride, dilation, groups)) {
        alternative = Kernel::kWinograd;
      } else if (is_1x1_gemm(x, w, target, padding, stride, dilation, groups)) {
        alternative = Kernel::kGemm;
      }
    }
    const std::vector<int64_t> input_size = x.sizes().vec();
    const at::Tensor param = w;  // the trial's key (w may become a channels_last copy)
    const Kernel kernel =
        alternative == Kernel::kOneDnn
            ? Kernel::kOneDnn
            : prepared->next_kernel(w, false, input_size, alternative);
    Stopwatch stopwatch;
    bool done = false;
    if ((kernel == Kernel::kWinograd &&
         convolve_winograd(prepared, x, plain(w), target, bias, relu)) ||
        (kernel == Kernel::kGemm && convolve_1x1_by_gemm(x, plain(w), target, bias, relu))) {
      prepared->record_kernel_time(w, false, input_size, kernel, stopwatch.seconds());
      // A trial's first call runs oneDNN's too (below; the same result within rounding).
      if (!prepared->onednn_run_pending(w, false, input_size)) {
        return;
      }
      done = true;
      stopwatch = Stopwatch();
    }  // else declined (Winograd: inf or NaN in the input): oneDNN's, and not a sample
    at::Tensor reordered;  // oneDNN's copy, for convolve_into only
    if (channels_last && prepared != nullptr) {
      if (w.scalar_type() != at::kBFloat16 || onednn_takes_bf16()) {
        reordered = prepared->onednn_weight(w, false, input_size, padding, stride, dilation,
                                            groups);
      }
      // Without oneDNN's copy, a channels_last one (with it, no second copy is kept; the
      // plain weight serves the rare call convolve_into declines).
      if (!reordered.defined()) {
        w = prepared->channels_last(w);
      }
    }
    if (channels_last && convolve_into(target, x, reordered.defined() ? reordered : plain(w),
                                       bias, relu, padding, stride, dilation, groups)) {
      if ((kernel == Kernel::kOneDnn || done) && alternative != Kernel::kOneDnn) {
        prepared->record_kernel_time(param, false, input_size, Kernel::kOneDnn,
                                     stopwatch.seconds());
      }
      return;
    }
    if (done) {
      return;  // the alternative's result stands
    }
    at::Tensor result = at::conv2d(x, plain(w), bias, stride, padding, dilation, groups);
    target.copy_(relu ? at::relu(result) : result);
  });
}

// PyTorch's fused CPU attention reads q, k and v through their strides but assumes unit
// stride along the head dim; anything else is copied first.
at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.stride(-1) == 1 || t.size(-1) == 1 ? t : t.contiguous();
}

// Prepends unit dims up to rank 4, the only rank PyTorch's fused attention takes.
at::Tensor as_rank4(at::Tensor t) {
  while (t.dim() < 4) {
    t = t.unsqueeze(0);
  }
  return t;
}

void attention(c10::ScalarType dtype, BladeUnrankedMemRef* q, BladeUnrankedMemRef* k,
               BladeUnrankedMemRef* v, BladeUnrankedMemRef* mask, BladeUnrankedMemRef* out,
               int64_t transpose_k, int64_t transpose_v, double scale,
               bool zero_masked_rows) noexcept {
  guarded("blade_ral_attention", [&] {
    at::Tensor query = view_of(q, dtype);
    at::Tensor key = view_of(k, dtype);
    at::Tensor value = view_of(v, dtype);
    if (transpose_k != 0) {
      key = key.transpose(-1, -2);
    }
    if (transpose_v != 0) {
      value = value.transpose(-1, -2);
    }
    const int64_t rank = query.dim();
    TORCH_CHECK((rank == 3 || rank == 4) && key.dim() == rank && value.dim() == rank &&
                    key.size(-1) == query.size(-1) && value.size(-2) == key.size(-2) &&
                    key.sizes().slice(0, rank - 2) == query.sizes().slice(0, rank - 2) &&
                    value.sizes().slice(0, rank - 2) == query.sizes().slice(0, rank - 2),
                "blade_ral_attention: q ", query.sizes(), ", k ", key.sizes(), " and v ",
                value.sizes(), " are not [batch..., length, head dim] attention operands");
    at::Tensor result = view_of(out, dtype);
    std::vector<int64_t> expected(query.sizes().begin(), query.sizes().end() - 1);
    expected.push_back(value.size(-1));
    check_result_shape("blade_ral_attention", result, expected);
    std::optional<at::Tensor> bias;
    if (mask != nullptr) {
      at::Tensor m = view_of(mask, dtype);
      std::vector<int64_t> scores(expected.begin(), expected.end() - 1);
      scores.push_back(key.size(-2));
      TORCH_CHECK(at::is_expandable_to(m.sizes(), scores), "blade_ral_attention: the mask ",
                  m.sizes(), " does not broadcast to the scores ", at::IntArrayRef(scores));
      bias = as_rank4(unit_last_stride(m));
    }
    if (result.numel() == 0) {
      return;  // no query rows (or no batch, heads or value dims): nothing to write
    }
    if (key.size(-2) == 0) {
      // softmax over no keys is an empty row, and its product with v's zero rows is 0, as
      // eager gives; PyTorch's fused kernel divides by the key count.
      result.zero_();
      return;
    }
    // Every path below takes rank-4 operands.
    query = as_rank4(query);
    key = as_rank4(key);
    value = as_rank4(value);
    at::Tensor target = as_rank4(result);
    if (dtype == at::kFloat &&
        blade::ral::fused_attention_f32(query, key, value, bias, scale, zero_masked_rows,
                                        target)) {
      return;
    }
    if (query.size(-1) != value.size(-1)) {
      // PyTorch's fused kernel wants v's head size to be q's: its kernels one by one.
      at::Tensor logits = at::matmul(query, key.transpose(-1, -2)) * scale;
      if (bias.has_value()) {
        logits = logits + *bias;
      }
      at::Tensor probabilities = at::softmax(logits, -1);
      if (zero_masked_rows) {
        probabilities.masked_fill_(logits.isneginf().all(-1, true), 0);
      }
      target.copy_(at::matmul(probabilities, value));
      return;
    }
    const at::Tensor attended = std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
        unit_last_stride(query), unit_last_stride(key), unit_last_stride(value), 0.0, false,
        bias, scale));
    target.copy_(attended);
    if (bias.has_value() && !zero_masked_rows) {
      // softmax over a row the mask sets to -inf everywhere is 0/0, NaN, where PyTorch's
      // fused kernel returns 0: those rows are set to NaN, as the unfused computation gives.
      const at::Tensor masked_rows = bias->isneginf().all(-1, true);
      if (masked_rows.any().item<bool>()) {
        target.masked_fill_(masked_rows, std::numeric_limits<double>::quiet_NaN());
      }
    }
  });
}

}  // namespace

namespace blade::ral {

at::Tensor buffer_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type) {
  return view_of(memref, scalar_type);
}

std::string take_kernel_error() {
  std::string error;
  error.swap(kernel_error);
  return error;
}

ErrorSink* set_error_sink(ErrorSink* sink) {
  ErrorSink* previous = error_sink;
  error_sink = sink;
  return previous;
}

bool kernel_error_pending() {
  if (error_sink != nullptr) {
    std::lock_guard<std::mutex> lock(error_sink->mutex);
    return !error_sink->message.empty();
  }
  return !kernel_error.empty();
}

void record_kernel_error(const std::string& message) {
  if (error_sink != nullptr) {
    std::lock_guard<std::mutex> lock(error_sink->mutex);
    if (error_sink->message.empty()) {
      error_sink->message = message;
    }
  } else if (kernel_error.empty()) {
    kernel_error = message;
  }
}

}  // namespace blade::ral

extern "C" {

void blade_ral_index_out_of_range(int64_t index, int64_t size) {
  blade::ral::record_kernel_error("index " + std::to_string(index) +
                                  " is out of bounds for a dimension of size " +
                                  std::to_string(size));
}

void blade_ral_division_by_zero() {
  blade::ral::record_kernel_error("integer division by zero");
}

void memrefCopy(int64_t element_size, BladeUnrankedMemRef* source,
                BladeUnrankedMemRef* target) {
  const auto* s = static_cast<const int64_t*>(source->descriptor);
  const auto* t = static_cast<const int64_t*>(target->descriptor);
  const int64_t rank = source->rank;
  const char* src = reinterpret_cast<const char*>(s[1]) + s[2] * element_size;
  char* dst = reinterpret_cast<char*>(t[1]) + t[2] * element_size;
  for (int64_t k = 0; k < rank; ++k) {
    if (s[3 + k] == 0) {
      return;  // nothing to copy
    }
  }
  strided_copy(src, dst, s + 3, s + 3 + rank, t + 3 + rank, rank, element_size);
}

#define BLADE_RAL_UNRANKED(name) BladeUnrankedMemRef{name##_rank, name##_descriptor}
#define BLADE_RAL_DEFINE_KERNELS(suffix, scalar_type)                                        \
  void blade_ral_matmul_##suffix(BLADE_RAL_MEMREF(a), BLADE_RAL_MEMREF(b),                   \
                                 BLADE_RAL_MEMREF(out), int64_t transpose_b) {               \
    BladeUnrankedMemRef lhs = BLADE_RAL_UNRANKED(a), rhs = BLADE_RAL_UNRANKED(b),            \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    matmul(scalar_type, &lhs, &rhs, &result, transpose_b);                                   \
  }                                                                                          \
  void blade_ral_conv2d_##suffix(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight),          \
                                 BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w,  \
                                 int64_t pad_top, int64_t pad_bottom, int64_t pad_left,      \
                                 int64_t pad_right, int64_t dilation_h, int64_t dilation_w,  \
                                 int64_t groups) {                                           \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),       \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    conv2d(scalar_type, &x, &w, &result, stride_h, stride_w, pad_top, pad_bottom, pad_left,  \
           pad_right, dilation_h, dilation_w, groups, false);                                \
  }                                                                                          \
  void blade_ral_conv2d_nhwc_##suffix(                                                       \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(out),              \
      int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_bottom,               \
      int64_t pad_left, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,           \
      int64_t groups) {                                                                      \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),       \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    conv2d(scalar_type, &x, &w, &result, stride_h, stride_w, pad_top, pad_bottom, pad_left,  \
           pad_right, dilation_h, dilation_w, groups, true);                                 \
  }                                                                                          \
  void blade_ral_conv2d_nhwc_bias_##suffix(                                                  \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),             \
      BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w, int64_t pad_top,            \
      int64_t pad_bottom, int64_t pad_left, int64_t pad_right, int64_t dilation_h,           \
      int64_t dilation_w, int64_t groups, int64_t relu) {                                    \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),       \
                        b = BLADE_RAL_UNRANKED(bias), result = BLADE_RAL_UNRANKED(out);      \
    conv2d(scalar_type, &x, &w, &result, stride_h, stride_w, pad_top, pad_bottom, pad_left,  \
           pad_right, dilation_h, dilation_w, groups, true, &b, relu != 0);                  \
  }                                                                                          \
  void blade_ral_attention_##suffix(BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k),                \
                                    BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(out),              \
                                    int64_t transpose_k, int64_t transpose_v, double scale,  \
                                    int64_t zero_masked_rows) {                              \
    BladeUnrankedMemRef query = BLADE_RAL_UNRANKED(q), key = BLADE_RAL_UNRANKED(k),          \
                        value = BLADE_RAL_UNRANKED(v), result = BLADE_RAL_UNRANKED(out);     \
    attention(scalar_type, &query, &key, &value, nullptr, &result, transpose_k, transpose_v, \
              scale, zero_masked_rows != 0);                                                 \
  }                                                                                          \
  void blade_ral_attention_masked_##suffix(                                                  \
      BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k), BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(mask), \
      BLADE_RAL_MEMREF(out), int64_t transpose_k, int64_t transpose_v, double scale,         \
      int64_t zero_masked_rows) {                                                            \
    BladeUnrankedMemRef query = BLADE_RAL_UNRANKED(q), key = BLADE_RAL_UNRANKED(k),          \
                        value = BLADE_RAL_UNRANKED(v), bias = BLADE_RAL_UNRANKED(mask),      \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    attention(scalar_type, &query, &key, &value, &bias, &result, transpose_k, transpose_v,   \
              scale, zero_masked_rows != 0);                                                 \
  }

BLADE_RAL_DEFINE_KERNELS(f32, c10::ScalarType::Float)
BLADE_RAL_DEFINE_KERNELS(f64, c10::ScalarType::Double)
BLADE_RAL_DEFINE_KERNELS(f16, c10::ScalarType::Half)
BLADE_RAL_DEFINE_KERNELS(bf16, c10::ScalarType::BFloat16)
#undef BLADE_RAL_DEFINE_KERNELS

#define BLADE_RAL_DEFINE_SORT(suffix, scalar_type)                                           \
  void blade_ral_sort_##suffix(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(values),            \
                               BLADE_RAL_MEMREF(indices), int64_t dimension,                 \
                               int64_t descending, int64_t stable, int64_t k) {              \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), v = BLADE_RAL_UNRANKED(values),       \
                        i = BLADE_RAL_UNRANKED(indices);                                     \
    sort_along(scalar_type, &x, &v, &i, dimension, descending != 0, stable != 0, k);         \
  }
BLADE_RAL_DEFINE_SORT(f32, c10::ScalarType::Float)
BLADE_RAL_DEFINE_SORT(f64, c10::ScalarType::Double)
BLADE_RAL_DEFINE_SORT(f16, c10::ScalarType::Half)
BLADE_RAL_DEFINE_SORT(bf16, c10::ScalarType::BFloat16)
BLADE_RAL_DEFINE_SORT(i32, c10::ScalarType::Int)
BLADE_RAL_DEFINE_SORT(i64, c10::ScalarType::Long)
#undef BLADE_RAL_DEFINE_SORT
#undef BLADE_RAL_UNRANKED
}
