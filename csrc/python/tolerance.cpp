#include "python/tolerance.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>

namespace blade {
namespace {

template <typename T>
bool outside(T g, T w, T rtol, T atol) {
  if (std::isnan(w) || std::isnan(g)) {
    return std::isnan(w) != std::isnan(g);
  }
  if (std::isinf(w) || std::isinf(g)) {
    return g != w;
  }
  return std::abs(g - w) > atol + rtol * std::abs(w);
}

template <typename T>
int64_t count(const torch::Tensor& got, const torch::Tensor& want, T rtol, T atol) {
  const T* g = got.data_ptr<T>();
  const T* w = want.data_ptr<T>();
  const int64_t n = want.numel();
  constexpr int64_t kGrain = 1 << 16;
  std::atomic<int64_t> total{0};
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    int64_t found = 0;
    for (int64_t i = begin; i < end; ++i) {
      found += outside(g[i], w[i], rtol, atol) ? 1 : 0;
    }
    total += found;
  });
  return total.load();
}

}  // namespace

int64_t count_outside_tolerance(const torch::Tensor& got, const torch::Tensor& want,
                                double rtol, double atol) {
  TORCH_CHECK(got.scalar_type() == want.scalar_type(),
              "count_outside_tolerance: dtypes differ: ", got.scalar_type(), " and ",
              want.scalar_type());
  TORCH_CHECK(got.numel() == want.numel(), "count_outside_tolerance: ", got.numel(),
              " values against ", want.numel());
  TORCH_CHECK(got.device().is_cpu() && want.device().is_cpu(),
              "count_outside_tolerance: CPU tensors only");
  const torch::Tensor g = got.contiguous();
  const torch::Tensor w = want.contiguous();
  switch (want.scalar_type()) {
    case torch::kFloat:
      return count<float>(g, w, static_cast<float>(rtol), static_cast<float>(atol));
    case torch::kDouble:
      return count<double>(g, w, rtol, atol);
    default:
      TORCH_CHECK(false, "count_outside_tolerance: float32 or float64 only, got ",
                  want.scalar_type());
  }
}

}  // namespace blade
