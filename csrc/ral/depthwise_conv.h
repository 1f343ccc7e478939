// Depthwise 3x3 and 5x5 convolutions of NHWC float32 data (MobileNet's and EfficientNet's),
// each channel by its own filter, bias and ReLU fused: a channel block's filter stays in
// vector registers while the block's row of outputs is made. A kernel trial times it
// against oneDNN's depthwise convolution, whose call costs more around such a small
// convolution than the convolution itself.
#pragma once

#include <cstdint>

namespace blade::ral {

// Whether depthwise_conv2d runs here (AVX-512F).
bool depthwise_conv_available();

// Whether depthwise_conv2d takes a kernel of kh x kw (3x3 and 5x5).
bool depthwise_conv_takes(int64_t kh, int64_t kw);

// y[b, oy, ox, c] = bias[c] + sum over i < kh, j < kw of
//   x[b, oy * sh - ph + i * dh, ox * sw - pw + j * dw, c] * w[(i * kw + j) * c_count + c]
// (positions outside the image are zero padding), then max(0, .) keeping NaN where `relu`;
// x dense [n, h, w, c], w the filters as [kh, kw, c], y dense [n, oh, ow, c], bias [c] or
// null. On the intra-op threads by output rows. False (nothing written) where it does not
// run or takes the sizes.
bool depthwise_conv2d(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* filters, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t ph, int64_t pw, int64_t dh, int64_t dw, const float* bias,
                      bool relu, float* y, int64_t oh, int64_t ow);

}  // namespace blade::ral
