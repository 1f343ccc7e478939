// Depthwise 3x3 and 5x5 convolutions of uint8 NHWC data by VNNI dot products: the int8
// networks' (MobileNet's), where widening each byte to float32 for a multiply-add made the
// float kernel (depthwise_conv.h) spend more on conversions than on products.
//
// A dot product sums 4 bytes of one channel, so each task first interleaves the rows of its
// input band by fours ("quads": for every column, 4 vectors of 16 channels x 4 rows) with
// the zero point in the padding; a window of 3 or 5 rows then spans one or two quads, its
// filter zero outside the window. The weight is packed once for each of the 4 positions a
// window can start at within a quad. Sums are exact in int32; the zero point's share (its
// product with every tap's filter: the padding holds the zero point) comes off before the
// scales, so the results are bit for bit depthwise_conv2d_uint8's.
#pragma once

#include "ral/depthwise_conv.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

// Whether the kernel runs here (AVX-512 F, BW, VL, VBMI and VNNI).
bool depthwise_int8_available();
// Whether a weight of `channels` filters packed now is this kernel's (where it runs and the
// weight has more than 16: 16 would fill a quarter of each dot product's 64 bytes), else
// the float kernel's filters. Tests turn it off (false) to run the float kernel, which
// CPUs without VBMI (Cascade Lake) run. A pack's type says which kernel it is for.
bool depthwise_int8_chosen(int64_t channels);
void set_depthwise_int8_enabled(bool enabled);

// The weight [C, 1, kh, kw] int8 (3x3 or 5x5) packed for depthwise_conv2d_int8.
at::Tensor pack_depthwise_int8(const at::Tensor& weight);

// depthwise_conv2d_uint8's convolution (same arguments, result and rounding) with the weight
// packed by pack_depthwise_int8. False (nothing written) where it does not run or take the
// sizes.
bool depthwise_conv2d_int8(const uint8_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                           const at::Tensor& packed, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t ph, int64_t pw, const float* bias,
                           DepthwisePostOp post_op, const DepthwiseRanges& ranges, float* y,
                           int64_t oh, int64_t ow);

}  // namespace blade::ral
