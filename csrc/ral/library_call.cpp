#include "ral/library_call.h"

#include "ral/prepared_weights.h"

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
