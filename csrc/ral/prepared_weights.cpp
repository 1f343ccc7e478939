#include "ral/prepared_weights.h"

#include "ral/mkl_functions.h"

#include <limits>

namespace blade::ral {
namespace {

// A weight keeps packs for at most this many row counts.
constexpr size_t kRowCountsPerWeight = 4;

const MklFunctions& mkl() { return mkl_functions(); }

bool fits_int(int64_t value) { return value > 0 && value <= std::numeric_limits<int>::max(); }

thread_local PreparedWeights* active = nullptr;

}  // namespace

PreparedWeights::PreparedWeights(const std::vector<at::Tensor>& params) : params_(params) {}

bool PreparedWeights::is_param(const at::Tensor& t) const {
  for (const auto& p : params_) {
    if (p.data_ptr() == t.data_ptr() && p.sizes() == t.sizes() && p.strides() == t.strides()) {
      return true;
    }
  }
  return false;
}

at::Tensor PreparedWeights::channels_last(const at::Tensor& weight) {
  if (weight.dim() != 4 || !is_param(weight)) {
    return weight;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = channels_last_.find(weight.data_ptr());
  if (it == channels_last_.end()) {
    it = channels_last_
             .emplace(weight.data_ptr(), weight.clone(at::MemoryFormat::ChannelsLast))
             .first;
  }
  return it->second;
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
  size_t packs_of_weight = 0;
  for (const auto& entry : packs_) {
    packs_of_weight += std::get<0>(entry.first) == data ? 1 : 0;
  }
  if (packs_of_weight >= kRowCountsPerWeight) {
    return nullptr;
  }
  const size_t bytes = mkl().pack_get_size(kCblasBMatrix, static_cast<int>(m),
                                           static_cast<int>(n), static_cast<int>(k));
  at::Tensor buffer =
      at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  mkl().pack(kCblasRowMajor, kCblasBMatrix, transposed ? kCblasTrans : kCblasNoTrans,
             static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0F,
             static_cast<const float*>(rhs.data_ptr()), static_cast<int>(rhs.stride(0)),
             static_cast<float*>(buffer.data_ptr()));
  packs_.emplace(key, buffer);
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
  return static_cast<int64_t>(packs_.size());
}

PreparedWeights* active_prepared_weights() { return active; }

ActivePreparedWeights::ActivePreparedWeights(PreparedWeights* weights) : previous_(active) {
  active = weights;
}

ActivePreparedWeights::~ActivePreparedWeights() { active = previous_; }

}  // namespace blade::ral
