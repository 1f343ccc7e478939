// The sort library calls (blade_ral_sort_*, ral_kernels.h): PyTorch's own sort and topk,
// so that ties and NaN come out in eager's order.
#include "ral/library_call.h"

#include <vector>

namespace blade::ral {
namespace {

void sort_along(c10::ScalarType dtype, BladeUnrankedMemRef* input, BladeUnrankedMemRef* values,
                BladeUnrankedMemRef* indices, int64_t dimension, bool descending,
                bool stable, int64_t k) noexcept {
  guarded("blade_ral_sort", [&] {
    const at::Tensor x = buffer_view(input, dtype);
    at::Tensor sorted = buffer_view(values, dtype);
    at::Tensor order = buffer_view(indices, at::kLong);
    TORCH_CHECK(x.dim() == 0 ? dimension == 0 : dimension >= 0 && dimension < x.dim(),
                "blade_ral_sort: dimension ", dimension, " of a tensor of rank ", x.dim());
    std::vector<int64_t> expected(x.sizes().begin(), x.sizes().end());
    if (k > 0) {
      TORCH_CHECK(x.dim() > 0 && k <= x.size(dimension), "blade_ral_sort: the first ", k,
                  " of ", x.sizes(), " along dim ", dimension);
      expected[static_cast<size_t>(dimension)] = k;
    }
    check_result_shape("blade_ral_sort", sorted, expected);
    check_result_shape("blade_ral_sort", order, expected);
    if (k > 0) {
      at::topk_out(sorted, order, x, k, dimension, /*largest=*/descending, /*sorted=*/true);
    } else {
      at::sort_out(sorted, order, x, stable, dimension, descending);
    }
  });
}

}  // namespace
}  // namespace blade::ral

extern "C" {

#define BLADE_RAL_DEFINE_SORT(suffix, scalar_type)                                           \
  void blade_ral_sort_##suffix(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(values),            \
                               BLADE_RAL_MEMREF(indices), int64_t dimension,                 \
                               int64_t descending, int64_t stable, int64_t k) {              \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), v = BLADE_RAL_UNRANKED(values),       \
                        i = BLADE_RAL_UNRANKED(indices);                                     \
    blade::ral::sort_along(scalar_type, &x, &v, &i, dimension, descending != 0, stable != 0, \
                           k);                                                               \
  }
BLADE_RAL_FOR_EACH_FLOAT_TYPE(BLADE_RAL_DEFINE_SORT)
BLADE_RAL_DEFINE_SORT(i32, c10::ScalarType::Int)
BLADE_RAL_DEFINE_SORT(i64, c10::ScalarType::Long)
#undef BLADE_RAL_DEFINE_SORT
}
