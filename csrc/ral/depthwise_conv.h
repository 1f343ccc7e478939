// Depthwise 3x3 and 5x5 convolutions of NHWC float32 data (MobileNet's and EfficientNet's),
// each channel by its own filter, bias and ReLU fused: a channel block's filter stays in
// vector registers (AVX2: in L1) while the block's band of output rows is made. A kernel
// trial times it against oneDNN's depthwise convolution, whose call costs more around such
// a small convolution than the convolution itself.
#pragma once

#include "ral/conv_activation.h"

#include <cstdint>

namespace blade::ral {

// What follows the bias: nothing, ReLU, hardswish (x * min(max(x + 3, 0), 6) / 6), or SiLU
// (float32 results only: run over each task's row of results, conv_activation.h).
enum class DepthwisePostOp { kNone, kRelu, kHardswish, kSilu };

// The post-op of a float32 convolution's activation.
inline DepthwisePostOp depthwise_post_op(ConvActivation activation) {
  switch (activation) {
    case ConvActivation::kRelu:
      return DepthwisePostOp::kRelu;
    case ConvActivation::kSilu:
      return DepthwisePostOp::kSilu;
    case ConvActivation::kHardswish:
      return DepthwisePostOp::kHardswish;
    default:
      return DepthwisePostOp::kNone;
  }
}

// Whether depthwise_conv2d runs here (AVX-512 F, BW and VL; or AVX2 and FMA, 8 channels a
// vector), and depthwise_conv2d_uint8 (AVX-512 only).
bool depthwise_conv_available();
bool depthwise_uint8_available();

// Whether depthwise_conv2d takes a kernel of kh x kw (3x3 and 5x5).
bool depthwise_conv_takes(int64_t kh, int64_t kw);

// y[b, oy, ox, c] = bias[c] + sum over i < kh, j < kw of
//   x[b, oy * sh - ph + i * dh, ox * sw - pw + j * dw, c] * w[(i * kw + j) * c_count + c]
// (positions outside the image are zero padding), then the post-op (ReLU keeps NaN);
// x dense [n, h, w, c], w the filters as [kh, kw, c], y dense [n, oh, ow, c], bias [c] or
// null. On the intra-op threads by output rows. False (nothing written) where it does not
// run or takes the sizes.
bool depthwise_conv2d(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* filters, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw, const float* bias,
                      DepthwisePostOp post_op, float* y, int64_t oh, int64_t ow);

// The ranges of depthwise_conv2d_uint8's data: the input's real values are
// (x - zero_point) * scale, the filters' are theirs times channel_scale[c] (null: 1); with
// out_u8 the result is rounded to uint8 there (to nearest, ties to even) with out_scale
// and out_zero_point instead of written to y.
struct DepthwiseRanges {
  float scale = 1.0f;
  int32_t zero_point = 0;
  const float* channel_scale = nullptr;
  uint8_t* out_u8 = nullptr;
  float out_scale = 1.0f;
  int32_t out_zero_point = 0;
};


// depthwise_conv2d of uint8 NHWC data without dilation (an int8 network's: the filters
// its int8 weight as float32), computed in float32: the sums of the bytes by the filters,
// less the zero point's share, times the scales, plus the bias; then the post-op, and the
// result float32 [n, oh, ow, c] in y or uint8 in ranges.out_u8.
bool depthwise_conv2d_uint8(const uint8_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                            const float* filters, int64_t kh, int64_t kw, int64_t sh,
                            int64_t sw, int64_t ph, int64_t pw, const float* bias,
                            DepthwisePostOp post_op, const DepthwiseRanges& ranges, float* y,
                            int64_t oh, int64_t ow);

}  // namespace blade::ral
