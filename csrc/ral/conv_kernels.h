// oneDNN's convolutions into an engine's buffer (conv_kernels.cpp): what the convolution
// library calls run, and GEMMs by a weight too, as a 1x1 convolution over their rows
// (matmul_kernels.cpp).
#pragma once

#include "ral/conv_activation.h"
#include "ral/prepared_weights.h"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace blade::ral {

// Whether PyTorch's oneDNN kernels take bfloat16 data on this CPU (elsewhere they raise, and
// a bfloat16 model's GEMMs and convolutions take ATen's own route).
bool onednn_takes_bf16();

// oneDNN's convolution straight into `target` (channels_last, already of the result's
// shape), the engine's buffer, where at::conv2d would allocate a fresh output (page faults
// on every call) that then had to be copied: the buffer is offered to the allocator for the
// op's output (offered_buffers.h), or else, where the offer cannot be made, oneDNN adds
// its result into the zeroed buffer (what Inductor uses for conv + add). float32 data, or
// a bfloat16 model's. False when it does not apply or is unavailable, and the caller
// convolves as usual. `post_op` (null: none), SiLU or hardswish: oneDNN's own post-op where
// the offer is made (eager's values at NaN and infinities, within float32 ulps elsewhere),
// over each block of results in cache where a pass after the call read the whole result
// again; *post_op becomes kNone where it ran.
bool convolve_into(at::Tensor& target, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation, int64_t groups,
                   ConvActivation* post_op = nullptr);

// The convolution in bfloat16 (a bf16 engine: prepared_weights.h) into `target`: the input
// rounded to bfloat16, convolved by the weight's bfloat16 oneDNN copy with the float32 bias
// (float32 accumulation), the result widened into `target`, then the ReLU keeping NaN. `w`
// is a convolution weight, or a GEMM's 2-d rhs convolved as 1x1 (`transposed` as for
// PreparedWeights::onednn_weight). False when oneDNN's convolution is unavailable or the
// weight has no copy.
bool convolve_bf16(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                   bool transposed, const at::Tensor& target,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation);

}  // namespace blade::ral
