// The attention library calls (blade_ral_attention[_masked]_*, ral_kernels.h): float32
// attention in one parallel loop (fused_attention.h) where it takes the operands, else
// PyTorch's fused CPU attention, or its kernels one by one when v's head size is not q's.
#include "ral/fused_attention.h"
#include "ral/library_call.h"

#include <ATen/ExpandUtils.h>

#include <limits>
#include <optional>
#include <vector>

namespace blade::ral {
namespace {

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
    at::Tensor query = buffer_view(q, dtype);
    at::Tensor key = buffer_view(k, dtype);
    at::Tensor value = buffer_view(v, dtype);
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
    at::Tensor result = buffer_view(out, dtype);
    std::vector<int64_t> expected(query.sizes().begin(), query.sizes().end() - 1);
    expected.push_back(value.size(-1));
    check_result_shape("blade_ral_attention", result, expected);
    std::optional<at::Tensor> bias;
    if (mask != nullptr) {
      at::Tensor m = buffer_view(mask, dtype);
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
        fused_attention_f32(query, key, value, bias, scale, zero_masked_rows, target)) {
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
}  // namespace blade::ral

extern "C" {

#define BLADE_RAL_DEFINE_ATTENTION(suffix, scalar_type)                                      \
  void blade_ral_attention_##suffix(BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k),                \
                                    BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(out),              \
                                    int64_t transpose_k, int64_t transpose_v, double scale,  \
                                    int64_t zero_masked_rows) {                              \
    BladeUnrankedMemRef query = BLADE_RAL_UNRANKED(q), key = BLADE_RAL_UNRANKED(k),          \
                        value = BLADE_RAL_UNRANKED(v), result = BLADE_RAL_UNRANKED(out);     \
    blade::ral::attention(scalar_type, &query, &key, &value, nullptr, &result, transpose_k,  \
                          transpose_v, scale, zero_masked_rows != 0);                        \
  }                                                                                          \
  void blade_ral_attention_masked_##suffix(                                                  \
      BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k), BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(mask), \
      BLADE_RAL_MEMREF(out), int64_t transpose_k, int64_t transpose_v, double scale,         \
      int64_t zero_masked_rows) {                                                            \
    BladeUnrankedMemRef query = BLADE_RAL_UNRANKED(q), key = BLADE_RAL_UNRANKED(k),          \
                        value = BLADE_RAL_UNRANKED(v), bias = BLADE_RAL_UNRANKED(mask),      \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    blade::ral::attention(scalar_type, &query, &key, &value, &bias, &result, transpose_k,    \
                          transpose_v, scale, zero_masked_rows != 0);                        \
  }
BLADE_RAL_FOR_EACH_FLOAT_TYPE(BLADE_RAL_DEFINE_ATTENTION)
#undef BLADE_RAL_DEFINE_ATTENTION
}
