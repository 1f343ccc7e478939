#include "ral/prepared_weights.h"

#include "ral/mkl_functions.h"
#include "ral/winograd.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <atomic>
#include <exception>
#include <limits>
#include <optional>

namespace blade::ral {
namespace {

// A weight keeps prepared copies (oneDNN's and MKL's together) for at most this many input
// sizes: oneDNN's layout depends on the size (a copy made for 512 rows multiplied 1 row
// 600x slower than one made for it), so other sizes run with the weight as it is.
constexpr size_t kRowCountsPerWeight = 4;

// Timed calls per kernel in a trial (after an untimed first: next_kernel), and the most
// trials an engine keeps (a dynamic engine sees many input sizes; past this many the others
// run the alternative kernel untried).
constexpr int kTimedTrialRuns = 1;
constexpr size_t kMaxTrials = 256;

const MklFunctions& mkl() { return mkl_functions(); }

// The plain values of a weight from its oneDNN copy (`transposed` as onednn_weight's key),
// shaped and strided as the weight; undefined when the copy's plain form has other sizes.
at::Tensor plain_values(const at::Tensor& copy, bool transposed, const at::Tensor& weight) {
  at::Tensor dense = copy.to_dense();  // oneDNN's reorder back to the plain layout
  if (weight.dim() == 2) {
    const int64_t n = transposed ? weight.size(0) : weight.size(1);
    const int64_t k = transposed ? weight.size(1) : weight.size(0);
    if (dense.numel() != n * k) {
      return at::Tensor();
    }
    dense = dense.reshape({n, k});  // the [N, K, 1, 1] 1x1 convolution weight's rows
    return transposed ? dense : dense.t();
  }
  return dense.sizes() == weight.sizes() ? dense : at::Tensor();
}

bool fits_int(int64_t value) { return value > 0 && value <= std::numeric_limits<int>::max(); }

thread_local PreparedWeights* active = nullptr;
thread_local bool one_kernel_per_call = false;

// Process-wide: the bytes all engines' prepared copies hold, and the most they may hold
// (no limit unless set: the copies are what makes the GEMMs and convolutions fast).
std::atomic<int64_t> total_bytes{0};
std::atomic<int64_t> limit_bytes{-1};
std::atomic<bool> kernel_trials{true};

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

void set_kernel_trials(bool enabled) { kernel_trials.store(enabled, std::memory_order_relaxed); }

PreparedWeights::PreparedWeights(const std::vector<at::Tensor>& params, bool bf16)
    : params_(params), bf16_(bf16) {}

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

PreparedWeights::Kernel PreparedWeights::next_kernel(
    const at::Tensor& weight, bool onednn_transposed,
    const std::vector<int64_t>& onednn_input_size, Kernel alternative) {
  if (!is_param(weight) || (alternative == Kernel::kGemm && mkl().sgemm == nullptr) ||
      !kernel_trials.load(std::memory_order_relaxed)) {
    return Kernel::kOneDnn;  // nothing prepared without a param; no sgemm without MKL
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const TrialKey key(weight.data_ptr(), onednn_transposed, onednn_input_size);
  auto it = trials_.find(key);
  if (it == trials_.end()) {
    if (trials_.size() >= kMaxTrials) {
      return alternative;
    }
    KernelTrial trial;
    trial.alternative = alternative;
    it = trials_.emplace(key, trial).first;
  }
  const KernelTrial& trial = it->second;
  if (trial.choice.has_value()) {
    return *trial.choice;
  }
  // The alternative first (the caller then runs oneDNN's too: onednn_run_pending), then
  // whichever has run less, oneDNN's on a tie.
  if (trial.runs[1] == 0) {
    return trial.alternative;
  }
  return trial.runs[0] <= trial.runs[1] ? Kernel::kOneDnn : trial.alternative;
}

bool PreparedWeights::onednn_run_pending(const at::Tensor& weight, bool onednn_transposed,
                                         const std::vector<int64_t>& onednn_input_size) {
  if (one_kernel_per_call || !is_param(weight)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = trials_.find(TrialKey(weight.data_ptr(), onednn_transposed, onednn_input_size));
  return it != trials_.end() && !it->second.choice.has_value() && it->second.runs[0] == 0 &&
         it->second.runs[1] > 0;
}

void PreparedWeights::record_kernel_time(const at::Tensor& weight, bool onednn_transposed,
                                         const std::vector<int64_t>& onednn_input_size,
                                         Kernel kernel, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  const TrialKey key(weight.data_ptr(), onednn_transposed, onednn_input_size);
  auto it = trials_.find(key);
  if (it == trials_.end() || it->second.choice.has_value()) {
    return;
  }
  KernelTrial& trial = it->second;
  const int k = kernel == Kernel::kOneDnn ? 0 : 1;
  if (trial.runs[k]++ > 0) {  // the first call prepared the weight: not timed
    trial.best[k] = trial.runs[k] == 2 ? seconds : std::min(trial.best[k], seconds);
  }
  if (trial.runs[0] > kTimedTrialRuns && trial.runs[1] > kTimedTrialRuns) {
    trial.choice = trial.best[1] <= trial.best[0] ? trial.alternative : Kernel::kOneDnn;
    release_loser(key, trial);
    release_due_.store(!keep_all_plain_, std::memory_order_relaxed);
  }
}

void PreparedWeights::release_loser(const TrialKey& key, const KernelTrial& trial) {
  const void* data = std::get<0>(key);
  if (trial.choice != Kernel::kOneDnn) {
    auto copy = onednn_.find(key);
    if (copy != onednn_.end()) {
      uncount(copy->second);
      onednn_.erase(copy);
      freed_.store(true, std::memory_order_relaxed);
    }
    return;
  }
  if (trial.alternative == Kernel::kGemm) {
    return;  // MKL's sgemm reads the weight as it is
  }
  // The Winograd form serves every input size: freed once no size still uses or tries it.
  for (const auto& [other, other_trial] : trials_) {
    if (std::get<0>(other) == data && other_trial.alternative == Kernel::kWinograd &&
        other_trial.choice != Kernel::kOneDnn) {
      return;
    }
  }
  auto form = winograd_.find(data);
  if (form != winograd_.end()) {
    uncount(form->second);
    winograd_.erase(form);
    freed_.store(true, std::memory_order_relaxed);
  }
}

void PreparedWeights::return_freed_memory() {
  if (freed_.exchange(false, std::memory_order_relaxed)) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
}

bool PreparedWeights::is_param(const at::Tensor& t) const {
  for (const auto& p : params_) {
    if (p.data_ptr() == t.data_ptr() && p.sizes() == t.sizes() && p.strides() == t.strides()) {
      return true;
    }
  }
  return false;
}

at::Tensor PreparedWeights::int8_weight(const at::Tensor& weight,
                                        const std::vector<int64_t>& key,
                                        const std::function<at::Tensor()>& pack) {
  if (weight.scalar_type() != at::kChar || !is_param(weight)) {
    return at::Tensor();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = int8_.find({weight.data_ptr(), key});
  if (it == int8_.end()) {
    if (!fits_limit(static_cast<int64_t>(weight.nbytes()))) {
      return at::Tensor();
    }
    it = int8_.emplace(std::make_pair(weight.data_ptr(), key), pack()).first;
    count(it->second);
  }
  return it->second;
}

at::Tensor PreparedWeights::channels_last(const at::Tensor& weight) {
  if (weight.dim() != 4 || !is_param(weight)) {
    return weight;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = channels_last_.find(weight.data_ptr());
  if (it == channels_last_.end()) {
    if (!fits_limit(static_cast<int64_t>(weight.nbytes()))) {
      return weight;
    }
    restore_locked(weight.data_ptr());
    it = channels_last_
             .emplace(weight.data_ptr(), weight.clone(at::MemoryFormat::ChannelsLast))
             .first;
    count(it->second);
  }
  return it->second;
}

at::Tensor PreparedWeights::winograd(const at::Tensor& weight) {
  if (weight.dim() != 4 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = winograd_.find(weight.data_ptr());
  if (it == winograd_.end()) {
    if (!fits_limit(static_cast<int64_t>(weight.nbytes()) * 16 / 9)) {
      return at::Tensor();
    }
    restore_locked(weight.data_ptr());
    it = winograd_.emplace(weight.data_ptr(), winograd_weight(weight)).first;
    count(it->second);
  }
  return it->second;
}

at::Tensor PreparedWeights::bf16_matrix(const at::Tensor& weight, bool transposed) {
  if (weight.dim() != 2 || weight.scalar_type() != at::kFloat || !is_param(weight)) {
    return at::Tensor();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_pair(weight.data_ptr(), transposed);
  auto it = bf16_matrices_.find(key);
  if (it == bf16_matrices_.end()) {
    if (!fits_limit(static_cast<int64_t>(weight.nbytes()) / 2)) {
      return at::Tensor();
    }
    restore_locked(weight.data_ptr());
    const at::Tensor rows = transposed ? weight : weight.t();  // [N, K]
    it = bf16_matrices_.emplace(key, rows.to(at::kBFloat16).contiguous()).first;
    count(it->second);
  }
  return it->second;
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
  const auto key = std::make_tuple(weight.data_ptr(), transposed, input_size);
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

void PreparedWeights::set_weight_only(const std::vector<size_t>& indices) {
  std::lock_guard<std::mutex> lock(mutex_);
  weight_only_.assign(params_.size(), false);
  for (size_t index : indices) {
    if (index < weight_only_.size()) {
      weight_only_[index] = true;
    }
  }
}

const std::pair<const PreparedWeights::TrialKey, at::Tensor>* PreparedWeights::release_source(
    const void* data) const {
  if (released_.count(data) > 0 || kept_plain_.count(data) > 0 ||
      channels_last_.count(data) > 0 || winograd_.count(data) > 0) {
    return nullptr;
  }
  for (const auto& entry : packs_) {
    if (std::get<0>(entry.first) == data) {
      return nullptr;  // MKL's pack: a kernel that reads the weight as it is ran
    }
  }
  for (const auto& entry : bf16_matrices_) {
    if (entry.first.first == data) {
      return nullptr;
    }
  }
  for (const auto& [key, trial] : trials_) {
    if (std::get<0>(key) == data && trial.choice != Kernel::kOneDnn) {
      return nullptr;  // undecided, or the other kernel (which may read it) won
    }
  }
  const std::pair<const TrialKey, at::Tensor>* source = nullptr;
  for (const auto& entry : onednn_) {
    if (std::get<0>(entry.first) != data) {
      continue;
    }
    if (!entry.second.defined()) {
      return nullptr;  // a size oneDNN could not take: read as it is
    }
    source = &entry;
  }
  return source;
}

void PreparedWeights::release_plain_weights() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_due_.store(false, std::memory_order_relaxed);
  if (keep_all_plain_ || bf16_) {
    return;
  }
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  bool released = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& weight = params_[i];
    if (i >= weight_only_.size() || !weight_only_[i] || weight.scalar_type() != at::kFloat ||
        !weight.is_contiguous() || weight.storage_offset() != 0 ||
        weight.nbytes() != weight.storage().nbytes() ||
        weight.storage().data_ptr().get_deleter() != c10::GetCPUAllocator()->raw_deleter()) {
      continue;
    }
    const void* data = weight.data_ptr();
    // Held by nothing but this engine: every param that is this tensor is weight-only,
    // the tensor is held only by the two param vectors, and its storage only by it.
    size_t occurrences = 0;
    bool all_weight_only = true;
    for (size_t j = 0; j < params_.size(); ++j) {
      if (params_[j].unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) {
        ++occurrences;
        all_weight_only = all_weight_only && j < weight_only_.size() && weight_only_[j];
      }
    }
    if (!all_weight_only || weight.use_count() != 2 * occurrences ||
        weight.storage().use_count() != 1) {
      continue;
    }
    const auto* source = release_source(data);
    if (source == nullptr) {
      continue;
    }
    const at::Tensor& copy = source->second;
    const bool transposed = std::get<1>(source->first);
    // Released only when the copy gives back exactly these bits.
    const at::Tensor values = plain_values(copy, transposed, weight);
    if (!values.defined() || !at::equal(values.view(at::kInt), weight.view(at::kInt))) {
      kept_plain_.insert(data);
      continue;
    }
    const auto begin = reinterpret_cast<uintptr_t>(data);
    const uintptr_t first = (begin + page - 1) / page * page;
    const uintptr_t last = (begin + weight.nbytes()) / page * page;
    if (last <= first ||
        ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) {
      kept_plain_.insert(data);
      continue;
    }
    released_.emplace(data, Released{weight, copy, transposed,
                                     static_cast<int64_t>(last - first)});
    released = true;
  }
  if (released) {
    any_released_.store(true, std::memory_order_release);
#ifdef __GLIBC__
    malloc_trim(0);  // the checks' temporary plain copies
#endif
  }
}

void PreparedWeights::restore_locked(const void* data) {
  if (!any_released_.load(std::memory_order_acquire)) {
    return;
  }
  auto it = released_.find(data);
  if (it == released_.end()) {
    return;
  }
  const Released& released = it->second;
  const at::Tensor values = plain_values(released.copy, released.transposed, released.weight);
  TORCH_CHECK(values.defined(), "blade: a released weight's copy no longer has its sizes");
  c10::InferenceMode guard;
  released.weight.detach().copy_(values);
  kept_plain_.insert(data);
  released_.erase(it);
  any_released_.store(!released_.empty(), std::memory_order_release);
}

void PreparedWeights::ensure_plain(const at::Tensor& weight) {
  if (!any_released_.load(std::memory_order_acquire) || !weight.defined()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  restore_locked(weight.data_ptr());
}

void PreparedWeights::keep_plain() {
  std::lock_guard<std::mutex> lock(mutex_);
  keep_all_plain_ = true;
  release_due_.store(false, std::memory_order_relaxed);
  while (!released_.empty()) {
    restore_locked(released_.begin()->first);
  }
}

void PreparedWeights::keep_plain(const at::Tensor& weight) {
  std::lock_guard<std::mutex> lock(mutex_);
  restore_locked(weight.data_ptr());
  kept_plain_.insert(weight.data_ptr());
}

int64_t PreparedWeights::released_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& entry : released_) {
    bytes += entry.second.bytes;
  }
  return bytes;
}

int64_t PreparedWeights::packed_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t count =
      static_cast<int64_t>(packs_.size() + winograd_.size() + bf16_matrices_.size() +
                           int8_.size());
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

OneKernelPerCall::OneKernelPerCall() : previous_(one_kernel_per_call) {
  one_kernel_per_call = true;
}

OneKernelPerCall::~OneKernelPerCall() { one_kernel_per_call = previous_; }

ActivePreparedWeights::ActivePreparedWeights(PreparedWeights* weights) : previous_(active) {
  active = weights;
}

ActivePreparedWeights::~ActivePreparedWeights() { active = previous_; }

}  // namespace blade::ral
