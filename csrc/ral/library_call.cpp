#include "ral/library_call.h"

#include "ral/prepared_weights.h"

#include <vector>

namespace blade::ral {

at::Tensor buffer_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type) {
  const auto* d = static_cast<const int64_t*>(memref->descriptor);
  const int64_t rank = memref->rank;
  auto* aligned = reinterpret_cast<char*>(d[1]);
  const int64_t element_size = static_cast<int64_t>(c10::elementSize(scalar_type));
  std::vector<int64_t> sizes(d + 3, d + 3 + rank);
  std::vector<int64_t> strides(d + 3 + rank, d + 3 + 2 * rank);
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
