// The matmul library calls (blade_ral_matmul_*, ral_kernels.h). A GEMM by one of the
// engine's weights takes one of four paths: oneDNN's 1x1 convolution over its rows by the
// weight's reordered copy, MKL's sgemm on the weight as it is, for a few rows
// few_rows_gemm, or for more rows of a linear layer Blade's float32 tiles (AVX-512 or
// AVX2; whichever the engine's kernel trials find faster), bfloat16 for a bf16
// engine, or, where oneDNN has no copy for the rows, blocked_gemm on AVX-512 CPUs or MKL's
// packed GEMM; anything else is ATen's matmul.
#include "ral/matmul_kernels.h"

#include "ral/float_conv.h"
#include "ral/bf16_rounding.h"
#include "ral/blocked_gemm.h"
#include "ral/conv_kernels.h"
#include "ral/few_rows_gemm.h"
#include "ral/kernel_trials.h"
#include "ral/library_call.h"
#include "ral/mkl_functions.h"
#include "ral/prepared_weights.h"

#include <ATen/ExpandUtils.h>

#include <algorithm>
#include <sstream>
#include <limits>
#include <optional>
#include <vector>

namespace blade::ral {
namespace {

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

// lhs[M, K] @ op(weight) as oneDNN's 1x1 convolution of [1, K, 1, M] channels_last data
// (the rows as they lie) by the weight's oneDNN copy, written straight into the rows of
// `result`. False when the rows are not densely packed or the weight has no copy.
bool onednn_matmul(PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows,
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

// lhs[M, K] @ op(weight) in bfloat16 (a bf16 engine): Blade's bfloat16 convolution of dense
// rows by the weight's pack where it runs, else oneDNN's 1x1 convolution of the rows
// as [1, K, 1, M] channels_last data (convolve_bf16), or, for a row count past the weight's
// reordered copies, its plain bfloat16 copy in oneDNN's matmul (which reorders it on every
// call, so slower), the result widened into the rows of `result`. False
// when the weight has neither copy.
bool bf16_matmul(PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows,
                 int64_t lda, const at::Tensor& weight, bool transposed,
                 const at::Tensor& result, int64_t ldc) {
  const int64_t k = lhs.size(-1);
  const int64_t n = result.size(-1);
  if (rows <= 0 || k <= 0 || n <= 0) {
    return false;
  }
  // Blade's bfloat16 convolution of the rows as a rows x 1 image (float_conv.h; its plane
  // rows are the matrix's, rounded on the threads): no library call, the rounding and the
  // float32 result in its own passes.
  if (bf16_conv_available() && lda == k && ldc == n) {
    const at::Tensor packed = prepared->bf16_linear(weight, transposed);
    if (packed.defined()) {
      bf16_conv(lhs.const_data_ptr<float>(), 1, rows, 1, k, packed, n, 1, 1, {1, 1}, {0, 0},
                nullptr, ConvActivation::kNone, result.data_ptr<float>());
      return true;
    }
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
      rounded_to_bf16(at::from_blob(lhs.data_ptr(), {rows, k}, {lda, 1}, lhs.options()));
  widen_bf16(at::linear(a, matrix),
             at::from_blob(result.data_ptr(), {rows, n}, {ldc, 1}, result.options()), false);
  return true;
}

// Whether Blade's float32 tiles (float_conv.h, the rows as a 1 x rows image convolved by
// the weight as a 1x1 filter) are the alternative to oneDNN's kernel: on AVX-512 or AVX2
// with FMA, for more rows than few_rows_gemm streams, a linear layer's [N, K] weight (a
// view of it is the filter) and dense rows.
bool f32_tiles_take(const at::Tensor& weight, bool transposed, int64_t rows, int64_t lda,
                    int64_t ldc, const at::Tensor& lhs, const at::Tensor& result) {
  return rows > kFewRows && transposed && f32_conv_available() && f32_conv_enabled() &&
         weight.is_contiguous() && lda == lhs.size(-1) && ldc == result.size(-1);
}

// lhs[rows, K] @ weight[N, K]^T by the float32 tiles and the param's pack; false when there
// is none (the pack would pass the limit, or the kernel was turned off).
bool matmul_by_f32_tiles(PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows,
                         const at::Tensor& weight, const at::Tensor& result) {
  if (!f32_conv_enabled()) {
    return false;
  }
  const at::Tensor packed = prepared->f32_linear(weight);
  if (!packed.defined()) {
    return false;
  }
  f32_conv(lhs.const_data_ptr<float>(), 1, 1, rows, weight.size(1), packed, weight.size(0), 1,
           1, {1, 1}, {0, 0}, nullptr, ConvActivation::kNone, result.data_ptr<float>());
  return true;
}

bool f32_matmul(PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows, int64_t lda,
                const at::Tensor& weight, bool transposed, const at::Tensor& result,
                int64_t ldc);

// lhs @ weight through the engine's packed copy of the weight, when `weight` is a param of
// the running engine and both row operands fold to 2-d (see prepared_weights.h).
bool packed_matmul(const at::Tensor& lhs, const at::Tensor& weight, bool transposed,
                   const at::Tensor& result) {
  PreparedWeights* prepared = active_prepared_weights();
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
  if (!prepared->bf16()) {
    return f32_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc);
  }
  // A bf16 engine's linear layers run in bfloat16 or by the float32 path, whichever their
  // precision trial finds faster (as its convolutions do): AVX512-BF16's dot products run
  // at twice the FMA rate on AMD's Zen 4/5 but at half of it on Intel's CPUs without AMX.
  // bfloat16 declines without a copy; on a trial's first call the float32 path runs after
  // it, and its result stands.
  const std::vector<int64_t> input_size{1, lhs.size(-1), 1, rows};
  prepared->run_trial(
      weight, transposed, matmul_precision_key(input_size), PreparedWeights::Kernel::kBf16,
      [&] { return bf16_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc); },
      [&] {
        if (!f32_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc)) {
          plain_weight(weight);
          at::Tensor out = result;
          at::matmul_out(out, lhs, transposed ? weight.transpose(-1, -2) : weight);
        }
      });
  return true;
}

// lhs[M, K] @ op(weight) in float32 by the running engine's copies (packed_matmul).
bool f32_matmul(PreparedWeights* prepared, const at::Tensor& lhs, int64_t rows, int64_t lda,
                const at::Tensor& weight, bool transposed, const at::Tensor& result,
                int64_t ldc) {
  // oneDNN's 1x1 convolution or the alternative (a GEMM on the weight as it is, or the
  // float32 tiles), whichever the engine's first calls find faster
  // (PreparedWeights::next_kernel); MKL's packed GEMM where neither applies.
  using Kernel = PreparedWeights::Kernel;
  const std::vector<int64_t> input_size{1, lhs.size(-1), 1, rows};
  const Kernel alternative = f32_tiles_take(weight, transposed, rows, lda, ldc, lhs, result)
                                 ? Kernel::kF32Tiles
                                 : Kernel::kGemm;
  bool timed = false;  // a running trial's call (a decided one's runs untimed)
  const Kernel kernel =
      prepared->next_kernel(weight, transposed, input_size, alternative, &timed);
  // oneDNN's kernel stands for its reordered copy for these rows or, once the weight has
  // all the copies it may have (a dynamic engine's), its one [K, N] copy through oneDNN's
  // microkernel on AVX-512 CPUs (blocked_gemm.h): the trial times whichever ran.
  const auto reordered = [&] {
    return onednn_matmul(prepared, lhs, rows, lda, weight, transposed, result, ldc) ||
           gemm_by_k_by_n(prepared, lhs.data_ptr<float>(), lda, weight, transposed,
                          result.data_ptr<float>(), ldc, rows);
  };
  const Stopwatch stopwatch;
  const bool ran =
      kernel == Kernel::kOneDnn ? reordered()
      : kernel == Kernel::kGemm ? trial_gemm(prepared, lhs.data_ptr<float>(), lda, weight,
                                             transposed, result.data_ptr<float>(), ldc, rows)
                                : matmul_by_f32_tiles(prepared, lhs, rows, weight, result);
  if (ran && timed) {
    prepared->record_kernel_time(weight, transposed, input_size, kernel, stopwatch.seconds());
  }
  // A trial's first call runs oneDNN's too (its result the same within rounding); an
  // alternative that declined (its copy refused by the limit, its kernel turned off) counts
  // as endless, so that the trial settles on oneDNN's, which runs instead.
  if (kernel != Kernel::kOneDnn &&
      (!ran || (timed && prepared->onednn_run_pending(weight, transposed, input_size)))) {
    if (!ran && timed) {
      prepared->record_kernel_time(weight, transposed, input_size, kernel,
                                   std::numeric_limits<double>::infinity());
    }
    const Stopwatch again;
    if (reordered()) {
      if (timed) {
        prepared->record_kernel_time(weight, transposed, input_size, Kernel::kOneDnn,
                                     again.seconds());
      }
      return true;
    }
  }
  return ran || prepared->matmul_f32(lhs.data_ptr<float>(), lda, weight, transposed,
                                     result.data_ptr<float>(), ldc, rows);
}

void matmul(c10::ScalarType dtype, BladeUnrankedMemRef* a, BladeUnrankedMemRef* b,
            BladeUnrankedMemRef* out, int64_t transpose_b) noexcept {
  const auto profile_name = [&] {
    std::ostringstream name;
    name << "blade_ral_matmul " << buffer_view(a, dtype).sizes() << " x "
         << buffer_view(b, dtype).sizes() << (transpose_b != 0 ? "^T" : "");
    return name.str();
  };
  guarded("blade_ral_matmul", profile_name, [&] {
    // The operands' views kept for the call (its b's address) between calls.
    const void* site = buffer_address(b);
    const at::Tensor weight = kept_view(site, 1, b, dtype, ViewShape::kAsIs);
    at::Tensor rhs = transpose_b != 0 ? weight.transpose(-1, -2) : weight;
    at::Tensor lhs = kept_view(site, 0, a, dtype, ViewShape::kAsIs);
    at::Tensor result = kept_view(site, 2, out, dtype, ViewShape::kAsIs);
    TORCH_CHECK(lhs.dim() >= 2 && rhs.dim() >= 2 && lhs.size(-1) == rhs.size(-2),
                "blade_ral_matmul: cannot multiply ", lhs.sizes(), " by ", rhs.sizes());
    std::vector<int64_t> expected = at::infer_size(lhs.sizes().slice(0, lhs.dim() - 2),
                                                   rhs.sizes().slice(0, rhs.dim() - 2));
    expected.push_back(lhs.size(-2));
    expected.push_back(rhs.size(-1));
    check_result_shape("blade_ral_matmul", result, expected);
    if (!packed_matmul(lhs, weight, transpose_b != 0, result)) {
      plain_weight(weight);
      at::matmul_out(result, lhs, rhs);
    }
  });
}

}  // namespace

bool gemm_by_k_by_n(PreparedWeights* prepared, const float* lhs, int64_t lda,
                    const at::Tensor& weight, bool transposed, float* out, int64_t ldc,
                    int64_t m) {
  if (prepared == nullptr || !blocked_gemm_available()) {
    return false;
  }
  const at::Tensor k_by_n = prepared->k_by_n(weight, transposed);
  if (!k_by_n.defined()) {
    return false;
  }
  if (k_by_n.dim() == 3) {  // column panels of op(weight) [K, N]
    const int64_t n = transposed ? weight.size(0) : weight.size(1);
    return blocked_gemm_panels(lhs, lda, k_by_n.data_ptr<float>(), n, out, ldc, m,
                               k_by_n.size(1));
  }
  return blocked_gemm(lhs, lda, k_by_n.data_ptr<float>(), k_by_n.size(1), out, ldc, m,
                      k_by_n.size(0));
}

bool trial_gemm(PreparedWeights* prepared, const float* lhs, int64_t lda,
                const at::Tensor& weight, bool transposed, float* out, int64_t ldc, int64_t m) {
  if (m > kFewRows && static_cast<int64_t>(weight.nbytes()) <= kSmallWeightBytes &&
      gemm_by_k_by_n(prepared, lhs, lda, weight, transposed, out, ldc, m)) {
    return true;
  }
  const at::Tensor plain = plain_weight(weight);
  return gemm_by_weight(lhs, lda, plain.dim() == 4 ? plain.view({plain.size(0), plain.size(1)})
                                                   : plain,
                        transposed, out, ldc, m, 0.0F);
}

bool gemm_by_weight(const float* lhs, int64_t lda, const at::Tensor& weight, bool transposed,
                    float* out, int64_t ldc, int64_t m, float beta) {
  if (transposed && beta == 0.0F && m <= kFewRows && weight.dim() == 2 &&
      weight.scalar_type() == at::kFloat && weight.stride(1) == 1 &&
      few_rows_gemm(lhs, lda, weight.data_ptr<float>(), weight.stride(0), out, ldc, m,
                    weight.size(0), weight.size(1))) {
    return true;
  }
  const auto fits = [](int64_t v) { return v > 0 && v <= std::numeric_limits<int>::max(); };
  if (mkl_functions().sgemm == nullptr || weight.dim() != 2 ||
      weight.scalar_type() != at::kFloat || weight.stride(1) != 1 || !fits(m) ||
      !fits(weight.size(0)) || !fits(weight.size(1)) || !fits(weight.stride(0)) ||
      !fits(lda) || !fits(ldc)) {
    return false;
  }
  const int64_t n = transposed ? weight.size(0) : weight.size(1);
  const int64_t k = transposed ? weight.size(1) : weight.size(0);
  sgemm_row_major(false, transposed, m, n, k, 1.0F, lhs, lda, weight.data_ptr<float>(),
                  weight.stride(0), beta, out, ldc);
  return true;
}

}  // namespace blade::ral

extern "C" {

#define BLADE_RAL_DEFINE_MATMUL(suffix, scalar_type)                                         \
  void blade_ral_matmul_##suffix(BLADE_RAL_MEMREF(a), BLADE_RAL_MEMREF(b),                   \
                                 BLADE_RAL_MEMREF(out), int64_t transpose_b) {               \
    BladeUnrankedMemRef lhs = BLADE_RAL_UNRANKED(a), rhs = BLADE_RAL_UNRANKED(b),            \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    blade::ral::matmul(scalar_type, &lhs, &rhs, &result, transpose_b);                       \
  }
BLADE_RAL_FOR_EACH_FLOAT_TYPE(BLADE_RAL_DEFINE_MATMUL)
#undef BLADE_RAL_DEFINE_MATMUL
}
