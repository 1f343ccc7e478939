// Blade's own float convolutions, in float32 and in bfloat16, over float32 NHWC activations:
// the input copied into planes (conv_planes.h: the padded image, walked with the stride
// by a filter of fewer than 5 columns, else stride-phase planes) where padding or a stride
// needs them (bfloat16: always rounded into a copy), then an implicit GEMM in register
// tiles of 6 output pixels by 64 output channels (a narrow last block: 8 or 12 pixels by
// fewer), summed in float32 in registers over every tap (`vfmadd231ps` of one input
// channel, or `vdpbf16ps` of a pair of bfloat16 ones), and the bias and ReLU added there
// before the float32 result is stored. The library's call it replaces (PyTorch's mkldnn
// convolution) cost more per call than a small layer's products: building its tensors,
// finding its kernel in its cache, allocating the result; here a call costs the copy (none
// for a float32 convolution without padding) and the products.
#pragma once

#include "ral/conv_activation.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace blade::ral {

// Whether the bfloat16 kernel runs here: AVX512-BF16 (with AVX512-BW/VL), and no
// AMX-BF16, whose tiles make oneDNN's kernel the faster.
bool bf16_conv_available();
// Whether the float32 kernel runs here: AVX512-F/BW/VL, or AVX2 and FMA (its tiles of
// 6 pixels by 16 channels).
bool f32_conv_available();
// Tests turn the float32 kernel off (false) so that an engine's float32 convolutions try
// Winograd's, MKL's or none against oneDNN's, as on a CPU without AVX2, and back on.
void set_f32_conv_enabled(bool enabled);
bool f32_conv_enabled();
// How many convolutions each has run in this process (tests: that it ran).
int64_t bf16_conv_calls();
int64_t f32_conv_calls();
// How many of either kernel's calls ran a 1x1 convolution in slices of its depth (a deep
// one, or one of few rows streaming its weight).
int64_t depth_sliced_conv_calls();

// The float32 weight [O, C, kh, kw] as a kernel multiplies it: 64 output channels at a
// time, per tap (conv_planes.h's order), then per input channel (bfloat16: pairs of input
// channels rounded and interleaved per output channel, C padded with a zero channel to an
// even count), zeros past O.
at::Tensor pack_bf16_conv_weight(const at::Tensor& weight);
at::Tensor pack_f32_conv_weight(const at::Tensor& weight);
// The bytes of those packs for an [out_channels, channels, kh, kw] weight.
int64_t bf16_conv_pack_bytes(int64_t out_channels, int64_t channels, int64_t kh, int64_t kw);
int64_t f32_conv_pack_bytes(int64_t out_channels, int64_t channels, int64_t kh, int64_t kw);

// The convolution of `input` (float32 NHWC [batch, height, width, channels], contiguous) by
// `packed` (the kernel's pack of an [out_channels, channels, kh, kw] weight), plus `bias`
// ([out_channels] or null), plus `added` (null, or float32 of the result's layout: a
// residual connection, read in the tiles' registers where a pass after the call would read
// the result again), then the activation (ReLU keeping NaN; SiLU or hardswish on each
// task's block of results after its tiles, conv_activation.h), into `out` (float32 NHWC
// [batch, out_h, out_w, out_channels], overlapping neither the input nor `added`: a deep
// layer's slices of depth store partial sums there). `input_scale` (null, or [batch,
// channels] float32): the input multiplied by it per image and channel first (a
// squeeze-excitation's), as the input is copied, where float_conv_scales_input. The
// padding is zeros. The filter must fit the padded input.
void bf16_conv(const float* input, int64_t batch, int64_t height, int64_t width,
               int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
               int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding, const float* bias,
               ConvActivation activation, float* out, const float* added = nullptr,
               const float* input_scale = nullptr);
void f32_conv(const float* input, int64_t batch, int64_t height, int64_t width,
              int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
              int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding, const float* bias,
              ConvActivation activation, float* out, const float* added = nullptr,
              const float* input_scale = nullptr);
// Whether those take an `input_scale` for this input and filter: one where the input is
// read as its own plane (no padding; bfloat16: an even channel count).
bool float_conv_scales_input(bool bf16, int64_t height, int64_t width, int64_t channels,
                             int64_t kh, int64_t kw, at::IntArrayRef stride,
                             at::IntArrayRef padding);

// c[m x n] = a @ b by the bfloat16 register tiles, on the calling thread: a bfloat16
// row-major [m, k] (lda apart, k even), b its k / 2 rows of n bfloat16 pairs (rows 2p and
// 2p + 1 interleaved, ldb pairs apart: the "VNNI" layout), c float32 row-major (ldc apart).
// The bf16 products of an int8 engine's attention on a CPU without AMX.
void bf16_pairs_gemm(int64_t m, int64_t n, int64_t k, const c10::BFloat16* a, int64_t lda,
                     const uint32_t* b, int64_t ldb, float* c, int64_t ldc);

}  // namespace blade::ral
