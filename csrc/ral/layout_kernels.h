// Layout changes around oneDNN's channels_last int8 convolutions, in one pass each:
// a float32 NCHW activation quantized straight into uint8 NHWC, and a float32 NHWC result
// written into an NCHW buffer. ATen's copy_ between the two layouts walks one side element
// by element, far slower than the bytes moved; these read 16 channels of 16 pixels at a
// time (AVX-512 gathers, chosen at run time; scalar tiles elsewhere).
#pragma once

#include <ATen/ATen.h>

namespace blade::ral {

// round(input / scale) + zero_point clamped to [0, 255] (ties to even), for a float32
// [N, C, H, W] tensor, as a uint8 tensor in channels_last layout.
at::Tensor quantize_uint8_channels_last(const at::Tensor& input, double scale,
                                        int64_t zero_point);

// dst (contiguous [N, C, H, W] float32) = src (channels_last, same sizes).
void channels_last_to_contiguous(const at::Tensor& src, at::Tensor& dst);

}  // namespace blade::ral
