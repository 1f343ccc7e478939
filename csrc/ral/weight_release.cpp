// Weight release (prepared_weights.h): the plain values of weights that only their oneDNN
// copies are read from given back to the system, and put back before anything reads them
// as they are.
#include "ral/prepared_weights.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace blade::ral {
namespace {

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

}  // namespace

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
      channels_last_.count(data) > 0) {
    return nullptr;
  }
  for (const auto& entry : winograd_) {
    if (entry.first.first == data) {
      return nullptr;  // Winograd's tiles computed directly read the plain weight
    }
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

}  // namespace blade::ral
