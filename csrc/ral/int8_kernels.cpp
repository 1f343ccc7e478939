#include "ral/int8_kernels.h"

#include "ral/cpu_features.h"
#include "ral/depthwise_conv.h"
#include "ral/depthwise_int8.h"
#include "ral/int8_conv.h"
#include "ral/int8_gemv.h"
#include "ral/lane_masks.h"
#include "ral/offered_buffers.h"
#include "ral/layout_kernels.h"
#include "ral/prepared_weights.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/Pool.h>
#include <c10/util/Exception.h>
#include <c10/util/FunctionRef.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <tuple>
#include <cmath>

namespace blade::ral {
namespace {

c10::OperatorHandle onednn_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The activation's (scale, zero point) from the op's `input_range` operand.
std::pair<double, int64_t> read_input_range(const at::Tensor& input_range,
                                            const char* op = "blade::quantized_linear",
                                            const char* name = "input_range") {
  TORCH_CHECK(input_range.scalar_type() == at::kFloat && input_range.dim() == 1 &&
                  input_range.size(0) == 2,
              op, ": ", name, " must be float32 [2] (scale, zero point), got ",
              input_range.scalar_type(), input_range.sizes());
  const at::Tensor values = input_range.contiguous();
  const double scale = values.data_ptr<float>()[0];
  const double zero_point = values.data_ptr<float>()[1];
  TORCH_CHECK(zero_point >= 0 && zero_point <= 255 && zero_point == std::floor(zero_point), op,
              ": ", name, "'s zero point must be an integer in [0, 255] (uint8), got ",
              zero_point);
  TORCH_CHECK(std::isfinite(scale), op, ": ", name, "'s scale must be finite, got ", scale);
  return {scale, static_cast<int64_t>(zero_point)};
}

void check_operands(const at::Tensor& input, const at::Tensor& weight,
                    const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "blade::quantized_linear";
  TORCH_CHECK((input.scalar_type() == at::kFloat || input.scalar_type() == at::kChar) &&
                  input.dim() >= 1,
              op, ": the input must be a float32 tensor (or the uint8 activation of another "
              "int8 layer, as int8) of at least 1 dim, got ", input.scalar_type(), " of ",
              input.dim(), " dims");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2, op,
              ": the weight must be a 2-d int8 tensor [out_features, in_features], got ",
              weight.scalar_type(), weight.sizes());
  const int64_t n = weight.size(0);
  TORCH_CHECK(input.size(-1) == weight.size(1), op, ": the input's last dim is ",
              input.size(-1), ", the weight takes ", weight.size(1), " features");
  TORCH_CHECK(weight_scale.scalar_type() == at::kFloat && weight_scale.dim() == 1 &&
                  weight_scale.size(0) == n,
              op, ": weight_scale must be float32 [", n, "], got ",
              weight_scale.scalar_type(), weight_scale.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n,
                op, ": the bias must be float32 [", n, "], got ", bias->scalar_type(),
                bias->sizes());
  }
}

std::atomic<bool> int8_dot_product_allowed{true};
std::atomic<bool> int8_pair_sums_allowed{true};
// Calls of the int8 ops that ran in float32 (int8_float_path_calls).
std::atomic<int64_t> in_float_calls{0};
// outside_pack's key for whether a weight lies within int8_weight_limit (not a pack).
constexpr int64_t kWeightRangeKey = -7;

// oneDNN's packed copies of the weights quantized_linear ran on outside an engine (in
// TorchScript: a fallback, a layer left out of every cluster), so that such a call does not
// pack its weight each time. Keyed by the weight's storage, which the entry's weak
// reference keeps from being reused for another; an entry serves while that storage lives
// and the weight's version is unchanged.
struct OutsidePack {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  uint32_t version;
  at::Tensor packed;
};
using OutsideKey = std::tuple<const c10::StorageImpl*, int64_t, std::vector<int64_t>>;
std::mutex outside_mutex;
std::map<OutsideKey, OutsidePack> outside_packs;
// Entries kept before the ones of freed weights are dropped.
constexpr size_t kOutsidePacksSwept = 64;

// `pack` run with this thread's offered buffer withdrawn (offered_buffers.h): a pack is
// never the result, and oneDNN's packing allocates raw memory, which fails on an offered
// buffer of its size. (On VNNI CPUs Blade's kernel usually ran first and took the offer; on
// AVX2 oneDNN's is the only one.)
at::Tensor unoffered(const std::function<at::Tensor()>& pack) {
  const SuspendedOffer suspended;
  return pack();
}

at::Tensor outside_pack(const at::Tensor& weight, const std::vector<int64_t>& key,
                        const std::function<at::Tensor()>& pack) {
  c10::StorageImpl* storage = weight.storage().unsafeGetStorageImpl();
  std::vector<int64_t> full_key = weight.sizes().vec();
  full_key.insert(full_key.end(), key.begin(), key.end());
  const OutsideKey entry_key(storage, weight.storage_offset(), full_key);
  const uint32_t version = weight.unsafeGetTensorImpl()->version_counter().current_version();
  std::lock_guard<std::mutex> lock(outside_mutex);
  auto it = outside_packs.find(entry_key);
  if (it != outside_packs.end() && it->second.storage.lock().get() == storage &&
      it->second.version == version) {
    return it->second.packed;
  }
  if (outside_packs.size() >= kOutsidePacksSwept) {
    for (auto entry = outside_packs.begin(); entry != outside_packs.end();) {
      entry = entry->second.storage.expired() ? outside_packs.erase(entry) : std::next(entry);
    }
  }
  OutsidePack entry{c10::weak_intrusive_ptr<c10::StorageImpl>(
                        weight.storage().getWeakStorageImpl()),
                    version, unoffered(pack)};
  return outside_packs.insert_or_assign(entry_key, std::move(entry)).first->second.packed;
}

// oneDNN's packed copy of `weight`: the engine's, made once (PreparedWeights), or outside
// an engine the one kept for the weight's storage.
at::Tensor packed_weight(const at::Tensor& weight, const std::vector<int64_t>& key,
                         const std::function<at::Tensor()>& pack) {
  if (PreparedWeights* prepared = active_prepared_weights()) {
    at::Tensor packed = prepared->int8_weight(weight, key, [&] { return unoffered(pack); });
    if (packed.defined()) {
      return packed;
    }
  }
  return outside_pack(weight, key, pack);
}

// The weights' zero points: n zeros (symmetric weights), made once per n rather than per
// call. The ops only read them.
at::Tensor zero_points(int64_t n) {
  static std::mutex mutex;
  static auto* made = new std::map<int64_t, at::Tensor>();  // never destroyed, as cache()
  std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& zeros = (*made)[n];
  if (!zeros.defined()) {
    zeros = at::zeros({n}, at::kInt);
  }
  return zeros;
}

at::Tensor pack_linear(const at::Tensor& weight) {
  static const auto prepack = onednn_op("onednn::qlinear_prepack");
  torch::jit::Stack stack{weight.contiguous(), c10::IValue()};
  prepack.callBoxed(stack);
  return stack.at(0).toTensor();
}

// A float's bits as an int64, for keys.
int64_t bits_of(double value) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// A convolution or linear layer by Blade's kernel (int8_conv.h) where it takes it, else by
// oneDNN's. In an engine the two are kernel trials (PreparedWeights::next_kernel): its
// first calls time both and keep the faster for the weight and input `size` (Blade's wins
// the small convolutions of a batch-1 network, which oneDNN's per-call cost outweighs;
// oneDNN's some larger ones). Outside an engine (TorchScript, tests), Blade's.
at::Tensor blade_or_onednn(const std::vector<int64_t>& size, const at::Tensor& weight,
                           bool blade_takes, c10::function_ref<at::Tensor()> blade,
                           c10::function_ref<at::Tensor()> onednn) {
  PreparedWeights* prepared = active_prepared_weights();
  if (!blade_takes) {
    return onednn();
  }
  if (prepared == nullptr) {
    return blade();
  }
  // A trial's first call runs oneDNN's after Blade's, for its pack and primitive: Blade's
  // result stands.
  at::Tensor result;
  prepared->run_trial(
      weight, false, size, PreparedWeights::Kernel::kInt8Conv,
      [&] {
        result = blade();
        return true;
      },
      [&] {
        at::Tensor onednn_result = onednn();
        if (!result.defined()) {
          result = std::move(onednn_result);
        }
      });
  return result;
}

}  // namespace

bool has_int8_dot_product() {
  static const bool has = missing_cpu_features("avx512_vnni").empty() ||
                          missing_cpu_features("avx_vnni").empty() ||
                          missing_cpu_features("amx_int8").empty();
  return has && int8_dot_product_allowed.load(std::memory_order_relaxed);
}

void set_int8_dot_product_allowed(bool allowed) {
  int8_dot_product_allowed.store(allowed, std::memory_order_relaxed);
}

int64_t int8_weight_limit() {
  if (has_int8_dot_product()) {
    return 127;
  }
  static const bool avx2 = has_cpu_feature("avx2");
  return avx2 && int8_pair_sums_allowed.load(std::memory_order_relaxed) ? 64 : 0;
}

void set_int8_pair_sums_allowed(bool allowed) {
  int8_pair_sums_allowed.store(allowed, std::memory_order_relaxed);
}

const char* int8_features_needed() { return "avx512_vnni, avx_vnni, amx_int8 or avx2"; }

namespace {

// The largest magnitude of int8 `values` (0 when there are none).
int64_t largest_magnitude(const at::Tensor& values) {
  if (values.numel() == 0) {
    return 0;
  }
  const auto [low, high] = at::aminmax(values);
  return std::max(-static_cast<int64_t>(low.item<int8_t>()),
                  static_cast<int64_t>(high.item<int8_t>()));
}

}  // namespace

bool int8_kernels_take(const at::Tensor& weight) {
  const int64_t limit = int8_weight_limit();
  if (limit >= 127 || limit == 0) {
    return limit > 0;  // -128 included: a dot product's sums do not saturate
  }
  if (PreparedWeights* prepared = active_prepared_weights();
      prepared != nullptr && prepared->is_param(weight)) {
    return true;  // checked when its engine was loaded
  }
  const at::Tensor fits = outside_pack(weight, {kWeightRangeKey, limit}, [&] {
    return at::scalar_tensor(largest_magnitude(weight) <= limit, at::kBool);
  });
  return fits.item<bool>();
}

int64_t int8_float_path_calls() { return in_float_calls.load(std::memory_order_relaxed); }

std::pair<int64_t, int64_t> int8_params_exceeding(const std::vector<at::Tensor>& params) {
  const int64_t limit = int8_weight_limit();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].scalar_type() != at::kChar) {
      continue;
    }
    if (const int64_t worst = largest_magnitude(params[i]); worst > limit) {
      return {static_cast<int64_t>(i), worst};
    }
  }
  return {-1, 0};
}

std::pair<double, int64_t> uint8_range(double low, double high) {
  low = std::min(low, 0.0);
  high = std::max(high, 0.0);
  if (!(high > low) || !std::isfinite(high - low)) {
    return {1.0, 0};  // all zeros (any scale serves), or a range no scale holds
  }
  const double scale = (high - low) / 255.0;
  const int64_t zero_point =
      std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(-low / scale)), 0, 255);
  return {scale, zero_point};
}

namespace {

// src * inverse + zero, clamped to [0, 255] and rounded to the nearest integer, ties to even
// (NaN gives 0).
void quantize_scalar(const float* src, uint8_t* dst, int64_t n, float inverse, float zero) {
  // Adding and subtracting 1.5 * 2^23 rounds a float below 2^22 in magnitude to an
  // integer, ties to even, under the default rounding mode.
  constexpr float kRound = 12582912.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v = src[i] * inverse + zero;
    v = v > 0.0f ? v : 0.0f;
    v = v < 255.0f ? v : 255.0f;
    dst[i] = static_cast<uint8_t>((v + kRound) - kRound);
  }
}

// The same, 16 values at a time (the runtime is compiled for any x86-64, so the AVX-512
// path is chosen at run time). GCC 12 warns inside its own intrinsics' headers here
// (`__Y` may be used uninitialized: their _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void quantize_avx512(const float* src, uint8_t* dst,
                                                         int64_t n, float inverse, float zero) {
  const __m512 scale = _mm512_set1_ps(inverse);
  const __m512 offset = _mm512_set1_ps(zero);
  const __m512 low = _mm512_setzero_ps();
  const __m512 high = _mm512_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // max(v, 0) gives 0 for NaN (its second operand), as the scalar loop does.
    __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(src + i), scale), offset);
    v = _mm512_min_ps(_mm512_max_ps(v, low), high);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  quantize_scalar(src + i, dst + i, n - i, inverse, zero);
}
#pragma GCC diagnostic pop

// The same on AVX2, 32 values at a time: the packs to 16 and 8 bits work within 128-bit
// lanes, so a permutation of dwords puts the four vectors' bytes back in order.
__attribute__((target("avx2"))) void quantize_avx2(const float* src, uint8_t* dst, int64_t n,
                                                   float inverse, float zero) {
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256 offset = _mm256_set1_ps(zero);
  const __m256 low = _mm256_setzero_ps();
  const __m256 high = _mm256_set1_ps(255.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      // max(v, 0) gives 0 for NaN (its second operand), as the scalar loop does.
      __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8 * j), scale), offset);
      q[j] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, low), high));
    }
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]),
                                              _mm256_packus_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
  quantize_scalar(src + i, dst + i, n - i, inverse, zero);
}

// The linear layer by oneDNN's qlinear_pointwise on the uint8 rows, its weight packed
// once; the result [sizes], uint8 as int8 bytes with an output range, else float32.
at::Tensor onednn_linear(const at::Tensor& quantized, double scale, int64_t zero_point,
                         const at::Tensor& weight, const at::Tensor& weight_scale,
                         const std::optional<at::Tensor>& bias, double out_scale,
                         int64_t out_zero_point, bool quantized_out, c10::string_view post_op,
                         const std::vector<int64_t>& sizes) {
  const int64_t n = weight.size(0);
  const at::Tensor packed = packed_weight(weight, {}, [&] { return pack_linear(weight); });
  static const auto linear = onednn_op("onednn::qlinear_pointwise");
  torch::jit::Stack stack;
  stack.reserve(13);
  stack.emplace_back(quantized);
  stack.emplace_back(scale);
  stack.emplace_back(zero_point);
  stack.emplace_back(packed);
  stack.emplace_back(weight_scale.contiguous());
  stack.emplace_back(zero_points(n));
  stack.emplace_back(bias.has_value() ? c10::IValue(bias->contiguous()) : c10::IValue());
  // uint8 out: rounded by oneDNN with the next layer's range.
  stack.emplace_back(out_scale);
  stack.emplace_back(out_zero_point);
  stack.emplace_back(static_cast<int64_t>(quantized_out ? at::kByte : at::kFloat));
  stack.emplace_back(std::string(post_op == "gelu_tanh" ? "gelu" : post_op));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(std::string(post_op == "gelu_tanh" ? "tanh" : "none"));
  linear.callBoxed(stack);
  const at::Tensor result = stack.at(0).toTensor().reshape(sizes);
  return quantized_out ? result.view(at::kChar) : result;
}

}  // namespace

at::Tensor quantize_uint8(const at::Tensor& input, double scale, int64_t zero_point) {
  TORCH_CHECK(scale > 0 && std::isfinite(scale),
              "quantize_uint8: the scale must be positive, got ", scale);
  const at::Tensor x = input.contiguous();
  at::Tensor q = at::empty(x.sizes(), x.options().dtype(at::kByte));
  const float* src = x.data_ptr<float>();
  uint8_t* dst = q.data_ptr<uint8_t>();
  const float inverse = static_cast<float>(1.0 / scale);
  const float zero = static_cast<float>(zero_point);
  static const bool avx512 = has_cpu_feature("avx512f");
  static const bool avx2 = has_cpu_feature("avx2");
  at::parallel_for(0, x.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    (avx512 ? quantize_avx512 : avx2 ? quantize_avx2 : quantize_scalar)(
        src + begin, dst + begin, end - begin, inverse, zero);
  });
  return q;
}

at::Tensor quantized_linear(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            const at::Tensor& input_range,
                            const std::optional<at::Tensor>& output_range,
                            c10::string_view post_op) {
  constexpr const char* op = "blade::quantized_linear";
  // A uint8 activation handed on by the layer before, as its bytes (int8).
  const bool carried = input.scalar_type() == at::kChar;
  check_operands(input, weight, weight_scale, bias);
  TORCH_CHECK(post_op == "none" || post_op == "relu" || post_op == "gelu" ||
                  post_op == "gelu_tanh",
              op, ": post_op must be 'none', 'relu', 'gelu' or 'gelu_tanh', got '", post_op,
              "'");
  auto [scale, zero_point] = read_input_range(input_range);
  TORCH_CHECK(!carried || scale > 0, op, ": a uint8 input needs its scale, got ", scale);
  const int64_t k = weight.size(1);
  const int64_t n = weight.size(0);
  const at::Tensor rows = input.reshape({-1, k}).contiguous();
  if (!(scale > 0)) {  // dynamic: this input's own range
    if (rows.numel() == 0) {
      std::tie(scale, zero_point) = uint8_range(0.0, 0.0);
    } else {
      const auto [low, high] = at::aminmax(rows);
      std::tie(scale, zero_point) =
          uint8_range(low.item<float>(), high.item<float>());
    }
  }
  double out_scale = 1.0;
  int64_t out_zero_point = 0;
  if (output_range.has_value()) {
    std::tie(out_scale, out_zero_point) = read_input_range(*output_range, op, "output_range");
    TORCH_CHECK(out_scale > 0, op, ": output_range needs a positive scale, got ", out_scale);
  }
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = n;
  const at::ScalarType out_dtype = output_range.has_value() ? at::kChar : at::kFloat;
  if (rows.size(0) == 0) {
    return at::empty(sizes, input.options().dtype(out_dtype));
  }
  const at::Tensor quantized =
      carried ? rows.view(at::kByte) : quantize_uint8(rows, scale, zero_point);
  if (!int8_kernels_take(weight)) {
    in_float_calls.fetch_add(1, std::memory_order_relaxed);
    at::Tensor y = at::linear((quantized.to(at::kFloat) - zero_point) * scale,
                              weight.to(at::kFloat) * weight_scale.unsqueeze(1), bias);
    if (post_op == "relu") {
      y = at::relu(y);
    } else if (post_op != "none") {
      y = at::gelu(y, post_op == "gelu_tanh" ? "tanh" : "none");
    }
    if (output_range.has_value()) {
      y = quantize_uint8(y, out_scale, out_zero_point).view(at::kChar);
    }
    return y.reshape(sizes);
  }
  // Blade's kernels: the result made first (an engine's offered buffer goes to the first
  // allocation of its size), then the epilogue's fields both kernels have, then `run`.
  const auto by_blade = [&](auto e, const auto& run) {
    at::Tensor result = at::empty(sizes, input.options().dtype(out_dtype));
    const at::Tensor scales = weight_scale.contiguous();
    const at::Tensor bias_values = bias.has_value() ? bias->contiguous() : at::Tensor();
    e.input_scale = static_cast<float>(scale);
    e.input_zero_point = static_cast<int32_t>(zero_point);
    e.weight_scale = scales.const_data_ptr<float>();
    e.bias = bias_values.defined() ? bias_values.const_data_ptr<float>() : nullptr;
    e.relu = post_op == "relu";
    if (output_range.has_value()) {
      e.out_u8 = reinterpret_cast<uint8_t*>(result.data_ptr<int8_t>());
      e.out_scale = static_cast<float>(out_scale);
      e.out_zero_point = static_cast<int32_t>(out_zero_point);
    } else {
      e.out_f32 = result.data_ptr<float>();
    }
    run(e);
    return result;
  };
  const auto* rows_u8 = static_cast<const uint8_t*>(quantized.const_data_ptr());
  if (rows.size(0) <= kGemvMaxRows && (post_op == "none" || post_op == "relu") &&
      int8_conv_enabled() && int8_gemv_available()) {
    // A few rows: Blade's matrix-vector product (int8_gemv.h), which streams the weight.
    return by_blade(Int8GemvEpilogue{}, [&](const Int8GemvEpilogue& e) {
      const at::Tensor packed = packed_weight(weight, kInt8GemvKey, [&] {
        return pack_int8_gemv_weight(weight);
      });
      int8_gemv(rows_u8, rows.size(0), k, packed, n, e);
      note_int8_conv_call();
    });
  }
  // Many rows: Blade's convolution kernel, the rows as pixels of a 1x1 convolution, or
  // oneDNN's, whichever an engine's trials find faster.
  const auto blade = [&] {
    return by_blade(Int8ConvEpilogue{}, [&](Int8ConvEpilogue& e) {
      e.activation = post_op == "gelu"        ? Int8Activation::kGelu
                     : post_op == "gelu_tanh" ? Int8Activation::kGeluTanh
                                              : Int8Activation::kNone;
      const at::Tensor packed = packed_weight(weight, kInt8ConvKey, [&] {
        return pack_int8_conv_weight(weight.reshape({n, k, 1, 1}));
      });
      int8_conv(rows_u8, 1, rows.size(0), 1, k, packed, n, 1, 1, {1, 1}, {0, 0}, e);
    });
  };
  return blade_or_onednn(rows.sizes().vec(), weight,
                         int8_conv_enabled() && int8_conv_available(), blade,
                         [&] { return onednn_linear(quantized, scale, zero_point, weight,
                                                    weight_scale, bias, out_scale,
                                                    out_zero_point, output_range.has_value(),
                                                    post_op, sizes); });
}

namespace {

// A convolution's operands, checked, and the ranges it runs with.
struct ConvCall {
  at::Tensor image;  // [N, C, H, W]: float32, or uint8 in channels_last layout (carried)
  bool carried = false;
  double scale = 0;
  int64_t zero_point = 0;
  bool quantized_out = false;
  double out_scale = 1.0;
  int64_t out_zero_point = 0;
};

ConvCall check_conv(const char* op, const at::Tensor& input, const at::Tensor& weight,
                    const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                    int64_t groups, const at::Tensor& input_range,
                    const std::optional<at::Tensor>& output_range, c10::string_view post_op) {
  ConvCall call;
  // A uint8 activation handed on by the layer before: [N, H, W, C] int8 (its bytes).
  call.carried = input.scalar_type() == at::kChar;
  TORCH_CHECK((input.scalar_type() == at::kFloat || call.carried) && input.dim() == 4, op,
              ": the input must be a float32 [N, C, H, W] tensor or the uint8 [N, H, W, C] "
              "activation of another int8 layer (as int8), got ",
              input.scalar_type(), input.sizes());
  TORCH_CHECK(post_op == "none" || post_op == "relu" || post_op == "hardswish", op,
              ": post_op must be 'none', 'relu' or 'hardswish', got '", post_op, "'");
  call.image = call.carried ? input.contiguous().view(at::kByte).permute({0, 3, 1, 2}) : input;
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 4, op,
              ": the weight must be an int8 [O, C / groups, kH, kW] tensor, got ",
              weight.scalar_type(), weight.sizes());
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2 && groups > 0,
              op, ": stride, padding and dilation must have 2 values and groups be positive");
  TORCH_CHECK(call.image.size(1) == weight.size(1) * groups && weight.size(0) % groups == 0,
              op, ": the input has ", call.image.size(1), " channels, the weight takes ",
              weight.size(1), " x ", groups, " groups");
  // As aten::conv2d: every path (oneDNN's too, which returned an empty result) refuses a
  // window that does not fit the padded input.
  for (int64_t d = 0; d < 2; ++d) {
    const int64_t padded = call.image.size(2 + d) + 2 * padding[d];
    const int64_t window = dilation[d] * (weight.size(2 + d) - 1) + 1;
    TORCH_CHECK(stride[d] > 0 && padding[d] >= 0 && dilation[d] > 0 && window <= padded, op,
                ": the ", weight.size(2), " x ", weight.size(3), " filter (dilation ",
                dilation, ") does not fit the ", call.image.size(2), " x ",
                call.image.size(3), " input padded by ", padding,
                "; strides and dilations must be positive and padding not negative, got ",
                stride, ", ", dilation, " and ", padding);
  }
  const int64_t out_channels = weight.size(0);
  TORCH_CHECK(weight_scale.scalar_type() == at::kFloat && weight_scale.dim() == 1 &&
                  weight_scale.size(0) == out_channels,
              op, ": weight_scale must be float32 [", out_channels, "], got ",
              weight_scale.scalar_type(), weight_scale.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 &&
                    bias->size(0) == out_channels,
                op, ": the bias must be float32 [", out_channels, "], got ",
                bias->scalar_type(), bias->sizes());
  }
  std::tie(call.scale, call.zero_point) = read_input_range(input_range, op);
  TORCH_CHECK(!call.carried || call.scale > 0, op, ": a uint8 input needs its scale, got ",
              call.scale);
  if (!(call.scale > 0)) {
    const auto [low, high] = at::aminmax(input);
    std::tie(call.scale, call.zero_point) =
        uint8_range(input.numel() ? low.item<float>() : 0.0,
                    input.numel() ? high.item<float>() : 0.0);
  }
  if (output_range.has_value()) {
    call.quantized_out = true;
    std::tie(call.out_scale, call.out_zero_point) =
        read_input_range(*output_range, op, "output_range");
    TORCH_CHECK(call.out_scale > 0, op, ": output_range needs a positive scale, got ",
                call.out_scale);
  }
  return call;
}

// The convolution in float32 on the dequantized operands, plus `accum` (float32
// [N, O, H, W]) where given: CPUs without int8 dot products, and empty inputs.
at::Tensor conv_in_float(const ConvCall& call, const at::Tensor& weight,
                         const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding,
                         at::IntArrayRef dilation, int64_t groups,
                         const std::optional<at::Tensor>& accum, c10::string_view post_op) {
  const at::Tensor x =
      ((call.carried ? call.image : quantize_uint8(call.image, call.scale, call.zero_point))
           .to(at::kFloat) - call.zero_point) * call.scale;
  const at::Tensor w = weight.to(at::kFloat) * weight_scale.view({-1, 1, 1, 1});
  at::Tensor y = at::conv2d(x, w, bias, stride, padding, dilation, groups);
  if (accum.has_value()) {
    y = y + *accum;
  }
  if (post_op == "relu") {
    y = at::relu(y);
  } else if (post_op == "hardswish") {
    y = at::hardswish(y);
  }
  if (!call.quantized_out) {
    return y;
  }
  return quantize_uint8(y, call.out_scale, call.out_zero_point)
      .permute({0, 2, 3, 1}).contiguous().view(at::kChar);
}

// The weight's oneDNN packing for this input size and range.
at::Tensor packed_conv_weight(const ConvCall& call, const at::Tensor& weight,
                              const at::Tensor& weight_scale, at::IntArrayRef stride,
                              at::IntArrayRef padding, at::IntArrayRef dilation,
                              int64_t groups) {
  std::vector<int64_t> key = call.image.sizes().vec();
  for (auto list : {stride, padding, dilation}) {
    key.insert(key.end(), list.begin(), list.end());
  }
  key.insert(key.end(), {groups, bits_of(call.scale), call.zero_point});
  return packed_weight(weight, key, [&] {
    static const auto prepack = onednn_op("onednn::qconv_prepack");
    torch::jit::Stack stack{weight.contiguous(), weight_scale.contiguous(), call.scale,
                            call.zero_point, stride.vec(), padding.vec(), dilation.vec(),
                            groups, call.image.sizes().vec()};
    prepack.callBoxed(stack);
    return stack.at(0).toTensor();
  });
}

// The operands oneDNN's qconv2d ops take first: the uint8 input and its range, the packed
// weight, its scales and (zero) zero points.
void push_source(torch::jit::Stack& stack, const ConvCall& call, const at::Tensor& quantized,
                 const at::Tensor& packed, const at::Tensor& weight_scale) {
  stack.emplace_back(quantized);
  stack.emplace_back(call.scale);
  stack.emplace_back(call.zero_point);
  stack.emplace_back(packed);
  stack.emplace_back(weight_scale.contiguous());
  stack.emplace_back(zero_points(weight_scale.size(0)));
}

// Then the bias, the convolution's geometry, and the result's range and dtype (uint8 out:
// rounded by oneDNN with the next layer's range).
void push_geometry(torch::jit::Stack& stack, const ConvCall& call,
                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                   at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  stack.emplace_back(bias.has_value() ? c10::IValue(bias->contiguous()) : c10::IValue());
  stack.emplace_back(stride.vec());
  stack.emplace_back(padding.vec());
  stack.emplace_back(dilation.vec());
  stack.emplace_back(groups);
  stack.emplace_back(call.out_scale);
  stack.emplace_back(call.out_zero_point);
  stack.emplace_back(static_cast<int64_t>(call.quantized_out ? at::kByte : at::kFloat));
}

// oneDNN's result as the op returns it: float32 channels_last [N, C, H, W], or uint8
// [N, H, W, C] (channels_last [N, C, H, W] contiguous) handed on as its bytes.
at::Tensor conv_result(const ConvCall& call, const at::Tensor& result) {
  return call.quantized_out ? result.permute({0, 2, 3, 1}).contiguous().view(at::kChar)
                            : result;
}

// The convolution's input as channels_last uint8: the carried bytes, or the float input
// rounded with its range.
at::Tensor uint8_image(const ConvCall& call) {
  return call.carried ? call.image
                      : quantize_uint8_channels_last(call.image, call.scale, call.zero_point);
}

// A convolution's result of sizes `made` ([N, O, H, W]) as oneDNN's path returns it: uint8
// as int8 [N, H, W, O], or float32 channels_last. Blade's kernels make it before anything
// else: an engine's offered buffer goes to the first allocation of its size.
at::Tensor conv_result_tensor(const ConvCall& call, const std::vector<int64_t>& made) {
  return call.quantized_out
             ? at::empty({made[0], made[2], made[3], made[1]},
                         call.image.options().dtype(at::kChar))
             : at::empty(made, call.image.options().dtype(at::kFloat)
                                   .memory_format(at::MemoryFormat::ChannelsLast));
}

// The convolution by Blade's own kernel (int8_conv.h), returned as oneDNN's path returns
// it. The result is made first (an engine's offered buffer goes to the
// first allocation of its size), then the operands: the uint8 input (channels_last) and the
// tensor added (null: none), its values lying in NHWC order, uint8 (either dtype) with
// add_scale and add_zero_point, or float32.
at::Tensor blade_conv(const ConvCall& call, const at::Tensor& weight,
                                     const at::Tensor& weight_scale,
                                     const std::optional<at::Tensor>& bias,
                                     at::IntArrayRef stride, at::IntArrayRef padding,
                                     at::IntArrayRef dilation, int64_t groups,
                                     c10::string_view post_op,
                                     c10::function_ref<at::Tensor()> quantized_input,
                                     c10::function_ref<at::Tensor()> added_input,
                                     double add_scale, int64_t add_zero_point) {
  const std::vector<int64_t> made = at::native::conv_output_size(
      call.image.sizes(), weight.sizes(), padding, stride, dilation);
  at::Tensor result = conv_result_tensor(call, made);
  const at::Tensor quantized = quantized_input().contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor added = added_input ? added_input() : at::Tensor();
  const at::Tensor packed = packed_weight(weight, kInt8ConvKey, [&] {
    return pack_int8_conv_weight(weight);
  });
  const at::Tensor scales = weight_scale.contiguous();
  const at::Tensor bias_values = bias.has_value() ? bias->contiguous() : at::Tensor();
  Int8ConvEpilogue e;
  e.input_scale = static_cast<float>(call.scale);
  e.input_zero_point = static_cast<int32_t>(call.zero_point);
  e.weight_scale = scales.const_data_ptr<float>();
  e.bias = bias_values.defined() ? bias_values.const_data_ptr<float>() : nullptr;
  if (added.defined()) {
    if (added.scalar_type() == at::kFloat) {
      e.add_f32 = added.const_data_ptr<float>();
    } else {
      e.add_u8 = static_cast<const uint8_t*>(added.const_data_ptr());
    }
  }
  e.add_scale = static_cast<float>(add_scale);
  e.add_zero_point = static_cast<int32_t>(add_zero_point);
  e.relu = post_op == "relu";
  e.activation = post_op == "hardswish" ? Int8Activation::kHardswish : Int8Activation::kNone;
  if (call.quantized_out) {
    e.out_u8 = reinterpret_cast<uint8_t*>(result.data_ptr<int8_t>());
    e.out_scale = static_cast<float>(call.out_scale);
    e.out_zero_point = static_cast<int32_t>(call.out_zero_point);
  } else {
    e.out_f32 = result.data_ptr<float>();
  }
  int8_conv(quantized.const_data_ptr<uint8_t>(), call.image.size(0), call.image.size(2),
            call.image.size(3), call.image.size(1), packed, weight.size(0), weight.size(2),
            weight.size(3), stride, padding, e);
  return result;
}

// Whether Blade's depthwise kernel (depthwise_conv.h) takes the convolution: one filter
// per channel, 3x3 or 5x5, no dilation.
bool depthwise_takes(const ConvCall& call, const at::Tensor& weight, at::IntArrayRef dilation,
                     int64_t groups) {
  return int8_conv_enabled() && groups > 1 && groups == call.image.size(1) &&
         weight.size(0) == groups &&
         weight.size(1) == 1 && dilation[0] == 1 && dilation[1] == 1 &&
         depthwise_uint8_available() && depthwise_conv_takes(weight.size(2), weight.size(3));
}

// The depthwise convolution by Blade's kernel on the uint8 input, in float32 with the
// int8 weight as filters ([kH, kW, C], made once, as the packs are; its scales applied
// after the sums), returned as oneDNN's path returns it. The result is made first, as
// blade_conv's.
at::Tensor blade_depthwise(const ConvCall& call, const at::Tensor& weight,
                           const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef stride, at::IntArrayRef padding,
                           c10::string_view post_op,
                           c10::function_ref<at::Tensor()> quantized_input) {
  const std::vector<int64_t> made = at::native::conv_output_size(
      call.image.sizes(), weight.sizes(), padding, stride, {1, 1});
  at::Tensor result = conv_result_tensor(call, made);
  const at::Tensor quantized = quantized_input().contiguous(at::MemoryFormat::ChannelsLast);
  // VNNI's dot products where they take the weight (an int8 pack), else the float
  // kernel's float32 filters.
  const at::Tensor filters = packed_weight(weight, kInt8ConvKey, [&] {
    if (depthwise_int8_chosen(weight.size(0))) {
      return pack_depthwise_int8(weight);
    }
    return weight.to(at::kFloat)
        .view({weight.size(0), weight.size(2), weight.size(3)})
        .permute({1, 2, 0})
        .contiguous();
  });
  const bool dot_products = filters.scalar_type() == at::kChar;
  const at::Tensor bias_values = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor scales = weight_scale.contiguous();
  DepthwiseRanges ranges;
  ranges.scale = static_cast<float>(call.scale);
  ranges.zero_point = static_cast<int32_t>(call.zero_point);
  ranges.channel_scale = scales.const_data_ptr<float>();
  if (call.quantized_out) {
    ranges.out_u8 = reinterpret_cast<uint8_t*>(result.data_ptr<int8_t>());
    ranges.out_scale = static_cast<float>(call.out_scale);
    ranges.out_zero_point = static_cast<int32_t>(call.out_zero_point);
  }
  const uint8_t* x = static_cast<const uint8_t*>(quantized.const_data_ptr());
  const float* bias_data = bias_values.defined() ? bias_values.const_data_ptr<float>() : nullptr;
  const DepthwisePostOp post = post_op == "relu"        ? DepthwisePostOp::kRelu
                               : post_op == "hardswish" ? DepthwisePostOp::kHardswish
                                                        : DepthwisePostOp::kNone;
  float* y = call.quantized_out ? nullptr : result.data_ptr<float>();
  const at::IntArrayRef size = call.image.sizes();
  const bool ran =
      dot_products
          ? depthwise_conv2d_int8(x, size[0], size[2], size[3], size[1], filters,
                                  weight.size(2), weight.size(3), stride[0], stride[1],
                                  padding[0], padding[1], bias_data, post, ranges, y, made[2],
                                  made[3])
          : depthwise_conv2d_uint8(x, size[0], size[2], size[3], size[1],
                                   filters.const_data_ptr<float>(), weight.size(2),
                                   weight.size(3), stride[0], stride[1], padding[0],
                                   padding[1], bias_data, post, ranges, y, made[2], made[3]);
  TORCH_CHECK(ran, "blade::quantized_conv2d: the depthwise kernel refused ", weight.sizes(),
              " on ", call.image.sizes());
  note_int8_conv_call();
  return result;
}

// Whether onednn::qconv2d_pointwise.binary writes its result into its accum operand (its
// schema marks it as written). PyTorch 2.13's writes oneDNN's sum there and returns a copy
// of it, so the result is already in the accum. Found out once, on a 1x1 convolution of
// 2 x 2 pixels; otherwise (an error, other values) the op's returned result is used.
bool binary_conv_writes_accum() {
  static const bool writes = [] {
    try {
      const auto cl = at::MemoryFormat::ChannelsLast;
      const at::Tensor x = at::full({1, 4, 2, 2}, 3, at::kByte).contiguous(cl);
      const at::Tensor weight = at::ones({4, 4, 1, 1}, at::kChar);
      const at::Tensor scale = at::ones({4}, at::kFloat);
      static const auto prepack = onednn_op("onednn::qconv_prepack");
      torch::jit::Stack packing{weight, scale, 1.0, int64_t{0}, std::vector<int64_t>{1, 1},
                                std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1},
                                int64_t{1}, x.sizes().vec()};
      prepack.callBoxed(packing);
      const at::Tensor accum = at::full({1, 4, 2, 2}, 7, at::kByte).contiguous(cl);
      static const auto conv = onednn_op("onednn::qconv2d_pointwise", "binary");
      torch::jit::Stack stack{x, 1.0, int64_t{0}, packing.at(0).toTensor(), scale,
                              zero_points(4), accum, c10::IValue(),
                              std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0},
                              std::vector<int64_t>{1, 1}, int64_t{1}, 1.0, int64_t{0},
                              static_cast<int64_t>(at::kByte), 1.0, int64_t{0},
                              std::string("sum"), at::Scalar(1.0), std::string("none"),
                              c10::List<std::optional<at::Scalar>>(), c10::IValue()};
      conv.callBoxed(stack);
      const at::Tensor result = stack.at(0).toTensor();
      // 4 channels of 3 plus the 7 added: 19 everywhere, in both.
      return result.eq(19).all().item<bool>() && accum.eq(19).all().item<bool>();
    } catch (const std::exception&) {
      return false;
    }
  }();
  return writes;
}

}  // namespace

at::Tensor quantized_conv2d(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef dilation, int64_t groups,
                            const at::Tensor& input_range,
                            const std::optional<at::Tensor>& output_range,
                            c10::string_view post_op) {
  const ConvCall call = check_conv("blade::quantized_conv2d", input, weight, weight_scale, bias,
                                   stride, padding, dilation, groups, input_range,
                                   output_range, post_op);
  if (!int8_kernels_take(weight) || input.numel() == 0) {
    in_float_calls.fetch_add(input.numel() > 0 ? 1 : 0, std::memory_order_relaxed);
    return conv_in_float(call, weight, weight_scale, bias, stride, padding, dilation, groups,
                         std::nullopt, post_op);
  }
  // oneDNN reads channels_last activations without a reorder.
  const auto quantize_input = [&] { return uint8_image(call); };
  const bool depthwise = depthwise_takes(call, weight, dilation, groups);
  return blade_or_onednn(
      call.image.sizes().vec(), weight,
      depthwise || int8_conv_takes(call.image.size(1), weight, dilation, groups),
      [&] {
        if (depthwise) {
          return blade_depthwise(call, weight, weight_scale, bias, stride, padding, post_op,
                                 quantize_input);
        }
        return blade_conv(call, weight, weight_scale, bias, stride, padding, dilation, groups,
                          post_op, quantize_input, nullptr, 1.0, 0);
      },
      [&] {
        const at::Tensor quantized = quantize_input();
        const at::Tensor packed =
            packed_conv_weight(call, weight, weight_scale, stride, padding, dilation, groups);
        static const auto conv = onednn_op("onednn::qconv2d_pointwise");
        torch::jit::Stack stack;
        stack.reserve(17);
        push_source(stack, call, quantized, packed, weight_scale);
        push_geometry(stack, call, bias, stride, padding, dilation, groups);
        stack.emplace_back(std::string(post_op));
        stack.emplace_back(c10::List<std::optional<at::Scalar>>());
        stack.emplace_back(c10::IValue());
        conv.callBoxed(stack);
        return conv_result(call, stack.at(0).toTensor());
      });
}

at::Tensor quantized_conv2d_add(const at::Tensor& input, const at::Tensor& weight,
                                const at::Tensor& weight_scale,
                                const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                at::IntArrayRef padding, at::IntArrayRef dilation,
                                int64_t groups, const at::Tensor& input_range,
                                const at::Tensor& accum, const at::Tensor& accum_range,
                                const std::optional<at::Tensor>& output_range,
                                c10::string_view post_op) {
  constexpr const char* op = "blade::quantized_conv2d_add";
  // oneDNN's sum takes ReLU after it, not hardswish.
  TORCH_CHECK(post_op == "none" || post_op == "relu", op, ": post_op must be 'none' or "
              "'relu', got '", post_op, "'");
  const ConvCall call = check_conv(op, input, weight, weight_scale, bias, stride, padding,
                                   dilation, groups, input_range, output_range, post_op);
  // The accum as [N, O, H, W]: float32, or uint8 in channels_last layout (carried).
  const bool carried_accum = accum.scalar_type() == at::kChar;
  TORCH_CHECK((accum.scalar_type() == at::kFloat || carried_accum) && accum.dim() == 4, op,
              ": the tensor added must be a float32 [N, O, H, W] tensor or the uint8 "
              "[N, H, W, O] activation of another int8 layer (as int8), got ",
              accum.scalar_type(), accum.sizes());
  const at::Tensor addend =
      carried_accum ? accum.contiguous().view(at::kByte).permute({0, 3, 1, 2}) : accum;
  auto [accum_scale, accum_zero_point] = read_input_range(accum_range, op, "accum_range");
  TORCH_CHECK(accum_scale > 0 || (!carried_accum && !call.quantized_out), op,
              ": accum_range needs a positive scale for a uint8 result or a uint8 tensor "
              "added, got ", accum_scale);
  // oneDNN writes into the tensor added: its sizes must be the convolution's, exactly.
  const std::vector<int64_t> made = at::native::conv_output_size(
      call.image.sizes(), weight.sizes(), padding, stride, dilation);
  TORCH_CHECK(addend.sizes() == at::IntArrayRef(made), op, ": the tensor added has sizes ",
              addend.sizes(), " ([N, O, H, W]), the convolution makes ",
              at::IntArrayRef(made));
  const auto float_addend = [&] {
    return carried_accum ? (addend.to(at::kFloat) - accum_zero_point) * accum_scale : addend;
  };
  if (!int8_kernels_take(weight) || input.numel() == 0) {
    in_float_calls.fetch_add(input.numel() > 0 ? 1 : 0, std::memory_order_relaxed);
    // As oneDNN would add it: a float32 accum of a uint8 sum rounded with accum_range.
    const at::Tensor added =
        call.quantized_out && !carried_accum
            ? (quantize_uint8(addend, accum_scale, accum_zero_point).to(at::kFloat) -
               accum_zero_point) * accum_scale
            : float_addend();
    return conv_in_float(call, weight, weight_scale, bias, stride, padding, dilation, groups,
                         added, post_op);
  }
  const auto quantize_input = [&] { return uint8_image(call); };
  // Blade's kernel reads the tensor added where it lies (NHWC): uint8, or float32, which
  // for a uint8 result is first rounded with accum_range, as oneDNN's sum takes it.
  const auto added_input = [&] {
    return carried_accum ? accum.contiguous()
           : call.quantized_out
               ? quantize_uint8_channels_last(addend, accum_scale, accum_zero_point)
               : addend.contiguous(at::MemoryFormat::ChannelsLast);
  };
  const bool float_sum = !carried_accum && !call.quantized_out;
  return blade_or_onednn(
      call.image.sizes().vec(), weight,
      int8_conv_takes(call.image.size(1), weight, dilation, groups),
      [&] {
        return blade_conv(call, weight, weight_scale, bias, stride, padding, dilation, groups,
                          post_op, quantize_input, added_input, float_sum ? 1.0 : accum_scale,
                          float_sum ? 0 : accum_zero_point);
      },
      [&] {
        const at::Tensor quantized = quantize_input();
        // oneDNN writes the result into the tensor added (a private copy here, which takes
        // the engine's offered result buffer), channels_last, in the result's dtype: uint8
        // with accum_range, or float32 (its range then unused).
        at::Tensor sum;
        double sum_scale = accum_scale;
        int64_t sum_zero_point = accum_zero_point;
        if (call.quantized_out) {
          // The bytes copied as they lie (NHWC), not element by element through a permuted
          // view.
          sum = carried_accum
                    ? accum.contiguous().clone().view(at::kByte).permute({0, 3, 1, 2})
                    : quantize_uint8_channels_last(addend, accum_scale, accum_zero_point);
        } else {
          sum = float_addend().clone(at::MemoryFormat::ChannelsLast);
          sum_scale = 1.0;
          sum_zero_point = 0;
        }
        const at::Tensor packed =
            packed_conv_weight(call, weight, weight_scale, stride, padding, dilation, groups);
        static const auto conv = onednn_op("onednn::qconv2d_pointwise", "binary");
        torch::jit::Stack stack;
        stack.reserve(22);
        push_source(stack, call, quantized, packed, weight_scale);
        stack.emplace_back(sum);
        push_geometry(stack, call, bias, stride, padding, dilation, groups);
        stack.emplace_back(sum_scale);
        stack.emplace_back(sum_zero_point);
        stack.emplace_back(std::string("sum"));
        stack.emplace_back(at::Scalar(1.0));
        stack.emplace_back(std::string(post_op));
        stack.emplace_back(c10::List<std::optional<at::Scalar>>());
        stack.emplace_back(c10::IValue());
        conv.callBoxed(stack);
        // Where the op wrote its result into `sum`, that is the result: not the copy it
        // returns.
        return conv_result(call, binary_conv_writes_accum() ? sum : stack.at(0).toTensor());
      });
}

namespace {

// One output pixel's channels: the largest of its window's input pixels (uint8), held in a
// register per 64 channels.
__attribute__((target("avx512f,avx512bw"))) void max_pixels_avx512(
    uint8_t* dst, const uint8_t* image, const int64_t* pixels, int64_t count, int64_t c) {
  for (int64_t i = 0; i < c; i += 64) {
    const __mmask64 mask = bytes_left(c - i);
    __m512i largest = _mm512_setzero_si512();  // below every value
    for (int64_t p = 0; p < count; ++p) {
      largest = _mm512_max_epu8(largest,
                                _mm512_maskz_loadu_epi8(mask, image + pixels[p] * c + i));
    }
    _mm512_mask_storeu_epi8(dst + i, mask, largest);
  }
}

// A 3 x 3 window inside the image (ResNet's stem pool), `row` pixels between its rows:
// nine whole-vector loads per 64 channels, no window list.
__attribute__((target("avx512f,avx512bw"))) void max_3x3_avx512(uint8_t* dst,
                                                                const uint8_t* corner,
                                                                int64_t row, int64_t c) {
  for (int64_t i = 0; i < c; i += 64) {
    const uint8_t* at = corner + i;
    __m512i largest = _mm512_loadu_si512(at);
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = y == 0 ? 1 : 0; x < 3; ++x) {
        largest = _mm512_max_epu8(largest, _mm512_loadu_si512(at + (y * row + x) * c));
      }
    }
    _mm512_storeu_si512(dst + i, largest);
  }
}

void max_pixels(uint8_t* dst, const uint8_t* image, const int64_t* pixels, int64_t count,
                int64_t c) {
  std::memset(dst, 0, c);  // below every value
  for (int64_t p = 0; p < count; ++p) {
    const uint8_t* pixel = image + pixels[p] * c;
    for (int64_t i = 0; i < c; ++i) {
      dst[i] = std::max(dst[i], pixel[i]);
    }
  }
}

}  // namespace

at::Tensor quantized_max_pool2d(const at::Tensor& input, at::IntArrayRef kernel_size,
                                at::IntArrayRef stride, at::IntArrayRef padding,
                                at::IntArrayRef dilation, bool ceil_mode) {
  constexpr const char* op = "blade::quantized_max_pool2d";
  TORCH_CHECK(input.scalar_type() == at::kChar && input.dim() == 4, op,
              ": the input must be the uint8 [N, H, W, C] activation of an int8 layer (as "
              "int8), got ", input.scalar_type(), input.sizes());
  TORCH_CHECK(kernel_size.size() == 2 && stride.size() == 2 && padding.size() == 2 &&
                  dilation.size() == 2,
              op, ": kernel_size, stride, padding and dilation must have 2 values");
  for (int64_t d = 0; d < 2; ++d) {
    TORCH_CHECK(kernel_size[d] > 0 && stride[d] > 0 && dilation[d] > 0 && padding[d] >= 0 &&
                    padding[d] <= ((kernel_size[d] - 1) * dilation[d] + 1) / 2,
                op, ": kernel ", kernel_size, ", stride ", stride, ", padding ", padding,
                ", dilation ", dilation, ": sizes must be positive and padding at most half "
                "the kernel (as dilated)");
  }
  const at::Tensor x = input.contiguous();
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3);
  const int64_t oh = at::native::pooling_output_shape<int64_t>(
      h, kernel_size[0], padding[0], stride[0], dilation[0], ceil_mode);
  const int64_t ow = at::native::pooling_output_shape<int64_t>(
      w, kernel_size[1], padding[1], stride[1], dilation[1], ceil_mode);
  TORCH_CHECK(oh > 0 && ow > 0, op, ": a ", h, " x ", w, " input gives no output pixel");
  at::Tensor out = at::empty({n, oh, ow, c}, x.options());
  const uint8_t* src = reinterpret_cast<const uint8_t*>(x.const_data_ptr<int8_t>());
  uint8_t* dst = reinterpret_cast<uint8_t*>(out.data_ptr<int8_t>());
  static const bool avx512 = has_cpu_feature("avx512bw");
  const auto combine = avx512 ? max_pixels_avx512 : max_pixels;
  const bool whole_3x3 = avx512 && c % 64 == 0 && kernel_size[0] == 3 && kernel_size[1] == 3 &&
                         dilation[0] == 1 && dilation[1] == 1;
  at::parallel_for(0, n * oh, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> window(kernel_size[0] * kernel_size[1]);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t image = row / oh, y = row % oh;
      for (int64_t x0 = 0; x0 < ow; ++x0) {
        const int64_t top = y * stride[0] - padding[0], left = x0 * stride[1] - padding[1];
        if (whole_3x3 && top >= 0 && top + 2 < h && left >= 0 && left + 2 < w) {
          max_3x3_avx512(dst + ((image * oh + y) * ow + x0) * c,
                         src + ((image * h + top) * w + left) * c, w, c);
          continue;
        }
        int64_t count = 0;  // the window's pixels inside the image (none: the result is 0)
        for (int64_t i = 0; i < kernel_size[0]; ++i) {
          const int64_t iy = y * stride[0] - padding[0] + i * dilation[0];
          for (int64_t j = 0; iy >= 0 && iy < h && j < kernel_size[1]; ++j) {
            const int64_t ix = x0 * stride[1] - padding[1] + j * dilation[1];
            if (ix >= 0 && ix < w) {
              window[count++] = iy * w + ix;
            }
          }
        }
        combine(dst + ((image * oh + y) * ow + x0) * c, src + image * h * w * c,
                window.data(), count, c);
      }
    }
  });
  return out;
}

}  // namespace blade::ral
