#include "ral/prepared_weights.h"

#include "ral/float_conv.h"
#include "ral/blocked_gemm.h"
#include "ral/mkl_functions.h"
#include "ral/winograd.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <optional>

namespace blade::ral {
namespace {

// A weight keeps prepared copies (oneDNN's and MKL's together) for at most this many input
// sizes: oneDNN's layout depends on the size (a copy made for many rows multiplies one row
// far slower than one made for it), so other sizes run with the weight as it is.
constexpr size_t kRowCountsPerWeight = 4;

const MklFunctions& mkl() { return mkl_functions(); }

bool fits_int(int64_t value) { return value > 0 && value <= std::numeric_limits<int>::max(); }

thread_local PreparedWeights* active = nullptr;

// Process-wide: the bytes all engines' prepared copies hold, and the most they may hold
// (no limit unless set: the copies are what makes the GEMMs and convolutions fast).
std::atomic<int64_t> total_bytes{0};
std::atomic<int64_t> limit_bytes{-1};

// Whether a copy of about `bytes` fits under the limit.
bool fits_limit(int64_t bytes) {
  const int64_t limit = limit_bytes.load(std::memory_order_relaxed);
  return limit < 0 || total_bytes.load(std::memory_order_relaxed) + bytes <= limit;
}

}  // namespace

void set_prepared_weights_limit(int64_t bytes) {
  limit_bytes.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
}

int64_t prepared_weights_bytes() { return total_bytes.load(std::memory_order_relaxed); }

PreparedWeights::PreparedWeights(const std::vector<at::Tensor>& params, bool bf16)
    : params_(params), bf16_(bf16) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].defined() && params_[i].has_storage()) {
      params_by_data_.emplace(params_[i].data_ptr(), i);
    }
  }
}

PreparedWeights::~PreparedWeights() { total_bytes.fetch_sub(bytes_, std::memory_order_relaxed); }

void PreparedWeights::count(const at::Tensor& copy) {
  const auto bytes = copy.defined() ? static_cast<int64_t>(copy.nbytes()) : 0;
  bytes_ += bytes;
  total_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void PreparedWeights::uncount(const at::Tensor& copy) {
  const auto bytes = copy.defined() ? static_cast<int64_t>(copy.nbytes()) : 0;
  bytes_ -= bytes;
  total_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

bool PreparedWeights::is_param(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) {
    return false;
  }
  const auto [begin, end] = params_by_data_.equal_range(t.data_ptr());
  return std::any_of(begin, end, [&](const auto& entry) {
    const at::Tensor& p = params_[entry.second];
    return p.sizes() == t.sizes() && p.strides() == t.strides();
  });
}

template <typename Copies, typename Make>
at::Tensor PreparedWeights::made_once(Copies& copies, const typename Copies::key_type& key,
                                      const at::Tensor& weight, int64_t bytes, Make make) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = copies.find(key);
  if (it == copies.end()) {
    if (!fits_limit(bytes)) {
      return at::Tensor();
    }
    restore_locked(weight.data_ptr());
    it = copies.emplace(key, make()).first;
    count(it->second);
  }
  return it->second;
}

at::Tensor PreparedWeights::int8_weight(const at::Tensor& weight,
                                        const std::vector<int64_t>& key,
                                        const std::function<at::Tensor()>& pack) {
  if (weight.scalar_type() != at::kChar || !is_param(weight)) {
    return at::Tensor();
  }
  return made_once(int8_, {weight.data_ptr(), key}, weight,
                   static_cast<int64_t>(weight.nbytes()), pack);
}

at::Tensor PreparedWeights::channels_last(const at::Tensor& weight) {
  if (weight.dim() != 4 || !is_param(weight)) {
    return weight;
  }
  const at::Tensor copy =
      made_once(channels_last_, weight.data_ptr(), weight, static_cast<int64_t>(weight.nbytes()),
                [&] { return weight.clone(at::MemoryFormat::ChannelsLast); });
  return copy.defined() ? copy : weight;
}

at::Tensor PreparedWeights::bf16_conv(const at::Tensor& weight) {
  if (weight.dim() != 4 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  return made_once(bf16_convs_, weight.data_ptr(), weight,
                   bf16_conv_pack_bytes(weight.size(0), weight.size(1), weight.size(2),
                                        weight.size(3)),
                   [&] { return pack_bf16_conv_weight(weight); });
}

at::Tensor PreparedWeights::f32_conv(const at::Tensor& weight) {
  if (weight.dim() != 4 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  return made_once(f32_convs_, weight.data_ptr(), weight,
                   f32_conv_pack_bytes(weight.size(0), weight.size(1), weight.size(2),
                                       weight.size(3)),
                   [&] { return pack_f32_conv_weight(weight); });
}

at::Tensor PreparedWeights::f32_linear(const at::Tensor& weight) {
  if (weight.dim() != 2 || weight.scalar_type() != at::kFloat || !weight.is_contiguous() ||
      !is_param(weight)) {
    return at::Tensor();
  }
  return made_once(f32_convs_, weight.data_ptr(), weight,
                   f32_conv_pack_bytes(weight.size(0), weight.size(1), 1, 1), [&] {
                     return pack_f32_conv_weight(
                         weight.view({weight.size(0), weight.size(1), 1, 1}));
                   });
}

at::Tensor PreparedWeights::bf16_linear(const at::Tensor& weight, bool transposed) {
  if (weight.dim() != 2 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  const at::Tensor n_by_k = transposed ? weight : weight.t();
  return made_once(bf16_linears_, {weight.data_ptr(), transposed}, weight,
                   bf16_conv_pack_bytes(n_by_k.size(0), n_by_k.size(1), 1, 1), [&] {
                     return pack_bf16_conv_weight(n_by_k.contiguous().unsqueeze(2).unsqueeze(3));
                   });
}

at::Tensor PreparedWeights::depthwise(const at::Tensor& weight) {
  if (weight.dim() != 4 || weight.size(1) != 1 || weight.scalar_type() != at::kFloat ||
      !is_param(weight)) {
    return at::Tensor();
  }
  return made_once(depthwise_, weight.data_ptr(), weight, static_cast<int64_t>(weight.nbytes()),
                   [&] { return weight.squeeze(1).permute({1, 2, 0}).contiguous(); });
}

at::Tensor PreparedWeights::winograd(const at::Tensor& weight, int64_t tile) {
  if (weight.dim() != 4 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  const int64_t patch = tile + 2;
  return made_once(winograd_, {weight.data_ptr(), tile}, weight,
                   static_cast<int64_t>(weight.nbytes()) * patch * patch / 9,
                   [&] { return winograd_weight(weight, tile); });
}

at::Tensor PreparedWeights::bf16_matrix(const at::Tensor& weight, bool transposed) {
  if (weight.dim() != 2 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  const at::Tensor rows = transposed ? weight : weight.t();  // [N, K]
  return made_once(bf16_matrices_, {weight.data_ptr(), transposed}, weight,
                   static_cast<int64_t>(weight.nbytes()) / 2,
                   [&] { return rows.to(at::kBFloat16).contiguous(); });
}

at::Tensor PreparedWeights::k_by_n(const at::Tensor& weight, bool transposed) {
  const bool pointwise = weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1 &&
                         transposed && weight.is_contiguous();
  if ((weight.dim() != 2 && !pointwise) || weight.scalar_type() != at::kFloat ||
      !is_param(weight)) {
    return at::Tensor();
  }
  if (!transposed && weight.is_contiguous()) {
    // Already [K, N]: read as it is, so never released (weight_release.cpp).
    std::lock_guard<std::mutex> lock(mutex_);
    restore_locked(weight.data_ptr());
    kept_plain_.insert(weight.data_ptr());
    return weight;
  }
  const at::Tensor matrix = pointwise ? weight.view({weight.size(0), weight.size(1)}) : weight;
  return made_once(k_by_n_, {weight.data_ptr(), transposed}, weight,
                   static_cast<int64_t>(weight.nbytes()),
                   [&] { return column_panels(transposed ? matrix.t() : matrix); });
}

size_t PreparedWeights::copies_of(const void* data) const {
  size_t copies = 0;
  for (const auto& entry : packs_) {
    copies += std::get<0>(entry.first) == data ? 1 : 0;
  }
  for (const auto& entry : onednn_) {
    copies += std::get<0>(entry.first) == data ? 1 : 0;
  }
  return copies;
}

at::Tensor PreparedWeights::onednn_weight(const at::Tensor& weight, bool transposed,
                                          const std::vector<int64_t>& input_size,
                                          const std::vector<int64_t>& padding,
                                          const std::vector<int64_t>& stride,
                                          const std::vector<int64_t>& dilation,
                                          int64_t groups, bool bf16) {
  if ((weight.dim() != 2 && weight.dim() != 4) ||
      (weight.scalar_type() != at::kFloat && weight.scalar_type() != at::kBFloat16) ||
      !is_param(weight)) {
    return at::Tensor();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key =
      std::make_tuple(weight.data_ptr(), transposed, onednn_key_size(input_size, bf16));
  auto it = onednn_.find(key);
  if (it != onednn_.end()) {
    return it->second;
  }
  if (copies_of(weight.data_ptr()) >= kRowCountsPerWeight ||
      !fits_limit(static_cast<int64_t>(weight.nbytes()))) {
    return at::Tensor();
  }
  restore_locked(weight.data_ptr());
  at::Tensor plain = weight;
  if (weight.dim() == 2) {
    const at::Tensor rows = transposed ? weight : weight.t();  // [N, K]
    plain = rows.contiguous().view({rows.size(0), rows.size(1), 1, 1});
  }
  if (bf16) {
    plain = plain.to(at::kBFloat16);
  }
  // mkldnn::_reorder_convolution_weight (what Inductor's freezing calls) takes a dense
  // weight; aten's mkldnn_reorder_conv2d_weight only an mkldnn one. Where it fails, an
  // undefined copy is kept so that later calls do not try again.
  static const std::optional<c10::OperatorHandle> reorder =
      c10::Dispatcher::singleton().findOp(
          c10::OperatorName("mkldnn::_reorder_convolution_weight", ""));
  if (!reorder.has_value()) {
    return at::Tensor();
  }
  at::Tensor reordered;
  try {
    torch::jit::Stack stack{plain, padding, stride, dilation, groups, input_size};
    reorder->callBoxed(&stack);
    reordered = stack.at(0).toTensor();
  } catch (const std::exception&) {
    reordered = at::Tensor();
  }
  onednn_.emplace(key, reordered);
  count(reordered);
  release_due_.store(!keep_all_plain_ && reordered.defined(), std::memory_order_relaxed);
  return reordered;
}

const float* PreparedWeights::packed(const at::Tensor& rhs, bool transposed, int64_t m,
                                     int64_t n, int64_t k) {
  const void* data = rhs.data_ptr();
  if (!is_param(rhs)) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_tuple(data, transposed, m);
  auto it = packs_.find(key);
  if (it != packs_.end()) {
    return static_cast<const float*>(it->second.data_ptr());
  }
  if (copies_of(data) >= kRowCountsPerWeight) {
    return nullptr;
  }
  const size_t bytes = mkl().pack_get_size(kCblasBMatrix, static_cast<int>(m),
                                           static_cast<int>(n), static_cast<int>(k));
  if (!fits_limit(static_cast<int64_t>(bytes))) {
    return nullptr;
  }
  restore_locked(data);
  at::Tensor buffer =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  mkl().pack(kCblasRowMajor, kCblasBMatrix, transposed ? kCblasTrans : kCblasNoTrans,
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0F,
             static_cast<const float*>(rhs.data_ptr()), static_cast<int>(rhs.stride(0)),
             static_cast<float*>(buffer.data_ptr()));
  packs_.emplace(key, buffer);
  count(buffer);
  return static_cast<const float*>(buffer.data_ptr());
}

bool PreparedWeights::matmul_f32(const float* lhs, int64_t lda, const at::Tensor& rhs,
                                 bool transposed, float* out, int64_t ldc, int64_t m) {
  if (!mkl().has_packed_gemm() || rhs.scalar_type() != at::kFloat || rhs.dim() != 2 ||
      rhs.stride(1) != 1 || !fits_int(m) || !fits_int(rhs.size(0)) || !fits_int(rhs.size(1)) ||
      !fits_int(lda) || !fits_int(ldc) || !fits_int(rhs.stride(0))) {
    return false;
  }
  const int64_t n = transposed ? rhs.size(0) : rhs.size(1);
  const int64_t k = transposed ? rhs.size(1) : rhs.size(0);
  const float* packed_rhs = packed(rhs, transposed, m, n, k);
  if (packed_rhs == nullptr) {
    return false;
  }
  mkl().compute(kCblasRowMajor, kCblasNoTrans, kCblasPacked, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), lhs, static_cast<int>(lda), packed_rhs,
                static_cast<int>(n), 0.0F, out, static_cast<int>(ldc));
  return true;
}

int64_t PreparedWeights::packed_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t count =
      static_cast<int64_t>(packs_.size() + winograd_.size() + depthwise_.size() +
                           bf16_convs_.size() + f32_convs_.size() + bf16_linears_.size() +
                           bf16_matrices_.size() + k_by_n_.size() + int8_.size());
  for (const auto& entry : onednn_) {
    count += entry.second.defined() ? 1 : 0;
  }
  return count;
}

int64_t PreparedWeights::prepared_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

PreparedWeights* active_prepared_weights() { return active; }

ActivePreparedWeights::ActivePreparedWeights(PreparedWeights* weights) : previous_(active) {
  active = weights;
}

ActivePreparedWeights::~ActivePreparedWeights() { active = previous_; }

}  // namespace blade::ral
