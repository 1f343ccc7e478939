// The engine check's comparison (blade/self_check.py) in one pass over the outputs.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace blade {

// How many elements of `got` differ from `want` by more than atol + rtol * |want|, or have
// a NaN or an infinity where the other has something else. Both are float32 or both
// float64, of the same number of elements; contiguous copies are made of strided ones.
int64_t count_outside_tolerance(const torch::Tensor& got, const torch::Tensor& want,
                                double rtol, double atol);

}  // namespace blade
