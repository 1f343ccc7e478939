#include "ral/offered_buffers.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

namespace blade::ral {
namespace {

// The buffer offered for the next CPU allocation of exactly `bytes` on this thread.
struct Offer {
  void* data = nullptr;
  size_t bytes = 0;
};
thread_local Offer offer;

std::atomic<int64_t> placed_results{0};
std::atomic<int64_t> copied_results{0};

// A wrapper of PyTorch's CPU allocator that hands out the offered buffer when one is
// offered and the size matches; every other allocation, and every deallocation, is the
// wrapped allocator's own. The offered buffer belongs to the engine: its DataPtr frees
// nothing, and its context differs from its data, so that raw_allocate (whose memory
// raw_deallocate would free) refuses it instead of taking it.
class OfferingAllocator final : public c10::Allocator {
 public:
  explicit OfferingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t bytes) override {
    if (offer.data != nullptr && bytes == offer.bytes) {
      void* data = offer.data;
      offer = Offer();
      return {data, &offer_context, &keep, c10::Device(c10::DeviceType::CPU)};
    }
    return wrapped_->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return wrapped_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    wrapped_->copy_data(dest, src, count);
  }

 private:
  static void keep(void*) {}
  static inline char offer_context = 0;
  c10::Allocator* wrapped_;
};

}  // namespace

bool offering_installed() {
  static const bool installed = [] {
    c10::Allocator* wrapped = c10::GetCPUAllocator();
    // Never destroyed: PyTorch allocates through it until the process ends.
    auto* wrapper = new OfferingAllocator(wrapped);
    c10::SetCPUAllocator(wrapper, /*priority=*/0);
    return c10::GetCPUAllocator() == wrapper;
  }();
  return installed;
}

ScopedOffer::ScopedOffer(const at::Tensor& out) {
  offer = {out.data_ptr(), static_cast<size_t>(out.numel()) * out.element_size()};
}

ScopedOffer::~ScopedOffer() { offer = Offer(); }

SuspendedOffer::SuspendedOffer() : data_(offer.data), bytes_(offer.bytes) { offer = Offer(); }

SuspendedOffer::~SuspendedOffer() { offer = {data_, bytes_}; }

void copy_into(at::Tensor& out, const at::Tensor& result) { out.copy_(result); }

bool settle(const at::Tensor& result, at::Tensor& out, CopyInto copy) {
  if (result.storage().data() != out.data_ptr()) {
    copy(out, result);
  } else if (result.data_ptr() == out.data_ptr() && result.strides() == out.strides()) {
    placed_results.fetch_add(1, std::memory_order_relaxed);
    return true;
  } else {
    copy(out, result.clone(at::MemoryFormat::Contiguous));
  }
  copied_results.fetch_add(1, std::memory_order_relaxed);
  return false;
}

std::pair<int64_t, int64_t> settled_result_counts() {
  return {placed_results.load(), copied_results.load()};
}

}  // namespace blade::ral
