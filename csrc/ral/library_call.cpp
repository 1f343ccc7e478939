#include "ral/library_call.h"

#include "ral/prepared_weights.h"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace blade::ral {

at::Tensor buffer_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type) {
  const auto* d = static_cast<const int64_t*>(memref->descriptor);
  const int64_t rank = memref->rank;
  auto* aligned = reinterpret_cast<char*>(d[1]);
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(scalar_type));
  // The descriptor's sizes and strides read in place (from_blob copies them into the
  // tensor): two vectors a view cost two allocations, a kernel call's operands a dozen.
  const c10::IntArrayRef sizes(d + 3, static_cast<size_t>(rank));
  const c10::IntArrayRef strides(d + 3 + rank, static_cast<size_t>(rank));
  return at::from_blob(aligned + d[2] * element_size, sizes, strides,
                       at::TensorOptions().dtype(scalar_type));
}

namespace {

struct KeptView {
  std::vector<int64_t> descriptor;  // address, offset, sizes, strides
  c10::ScalarType type = c10::ScalarType::Undefined;
  ViewShape shape = ViewShape::kAsIs;
  at::Tensor view;
};

struct SiteHash {
  size_t operator()(const std::pair<const void*, int>& key) const {
    return std::hash<const void*>()(key.first) * 31 + static_cast<size_t>(key.second);
  }
};

constexpr size_t kKeptViews = 4096;

}  // namespace

at::Tensor shaped_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type,
                       ViewShape shape) {
  at::Tensor view = buffer_view(memref, scalar_type);
  if (shape == ViewShape::kAsIs) {
    return view;
  }
  TORCH_CHECK(view.dim() == 4, "an NHWC buffer of rank ", view.dim());
  return view.permute({0, 3, 1, 2});
}

const at::Tensor& kept_view(const void* site, int operand, const BladeUnrankedMemRef* memref,
                            c10::ScalarType scalar_type, ViewShape shape) {
  thread_local std::unordered_map<std::pair<const void*, int>, KeptView, SiteHash> kept;
  if (kept.size() > kKeptViews) {
    kept.clear();
  }
  KeptView& entry = kept[{site, operand}];
  const auto* d = static_cast<const int64_t*>(memref->descriptor);
  const int64_t* first = d + 1;
  const int64_t* last = d + 3 + 2 * memref->rank;
  if (!entry.view.defined() || entry.type != scalar_type || entry.shape != shape ||
      !std::equal(first, last, entry.descriptor.begin(), entry.descriptor.end())) {
    entry.view = shaped_view(memref, scalar_type, shape);
    entry.descriptor.assign(first, last);
    entry.type = scalar_type;
    entry.shape = shape;
  }
  return entry.view;
}

void check_result_shape(const char* what, const at::Tensor& out, at::IntArrayRef expected) {
  TORCH_CHECK(out.sizes() == expected, what, ": the output buffer has shape ", out.sizes(),
              ", the result has shape ", expected);
}

const at::Tensor& plain_weight(const at::Tensor& weight) {
  if (PreparedWeights* prepared = active_prepared_weights()) {
    prepared->ensure_plain(weight);
  }
  return weight;
}

}  // namespace blade::ral
