// Blade's own int8 convolution over NHWC uint8 activations, an implicit GEMM whose rows are
// output pixels and whose depth is the input channels of one filter tap at a time, read
// from planes (conv_planes.h). The register tiles read each row at its own position: from
// the padded image (the input itself without padding) walked with the stride, for a filter
// of fewer than 5 columns. Otherwise, and for the microkernel, whose rows lie one pixel
// apart, the padded input is split into stride-phase planes, so every convolution is a
// stride-1 one over a plane's flat pixel index: one block of rows covers several output
// rows, the microkernel's padding columns' results dropped. A filter over fewer than 4 channels (an
// image's) of a few taps (kw * C <= 64 bytes a filter row, kh * kw * C <= 256) is unfolded
// instead: each pixel's kh x kw x C inputs side by side, multiplied as a 1x1 convolution of
// that depth, and its weight packed so.
//
// Three ways to multiply, with the same epilogue (zero-point correction, per-channel scales,
// bias, residual add, ReLU, requantization):
// - Blade's register tiles (AVX-512 VNNI): 6 rows x 64 output channels accumulated over
//   every tap in registers and finished there, so no int32 block goes through memory; on
//   AVX2 without VNNI, where weights lie within 64 (int8_weight_limit), its pair-sum tiles:
//   6 rows x 16 channels a pass, vpmaddubsw's int16 pair sums widened by vpmaddwd;
// - on AMX-INT8, Blade's AMX tiles (int8_amx.h): an int32 block accumulated over every tap
//   in tiles and stored once for the epilogue; AMX multiplies many times faster than VNNI;
// - oneDNN's u8 x s8 -> s32 brgemm microkernel (PyTorch's exported cpublas::brgemm), one
//   call per tap into the int32 block, where the AMX tiles do not run (tests on VNNI).
// It runs the convolutions of quantized_conv2d(_add) (int8_kernels.h) that it takes, and
// quantized_linear's layers of more rows than int8_gemv.h takes (as 1x1 convolutions whose
// pixels are the rows), in place of PyTorch's onednn::qconv2d_pointwise and
// qlinear_pointwise, whose per-call cost (the packed weight's lookup, oneDNN's primitive
// cache, the boxed call) exceeds the work of the small convolutions of a batch-1 network.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

// Whether the kernel runs here (AVX-512 VNNI, AMX-INT8, or AVX2 where int8_weight_limit()
// is 64).
bool int8_conv_available();
// Tests turn it off (false) to run oneDNN's kernel everywhere, and back on (int8
// depthwise convolutions and linear layers too, int8_kernels.cpp).
void set_int8_conv_enabled(bool enabled);
bool int8_conv_enabled();
// Whether the register tiles multiply (else the AMX tiles or the microkernel): on AVX-512
// VNNI without AMX, unless turned off (tests: false tries the microkernel where it
// answers), and on AVX2 (the pair-sum tiles; there is no microkernel there).
bool int8_conv_tiles_run();
void set_int8_conv_tiles(bool enabled);
// Rows of the VNNI tiles of 4 vectors (blocks of 49-64 output channels): 5 on AMD's Zen 4,
// 6 elsewhere; tests set 5 or 6 to run either on any AVX-512 VNNI CPU (0: this CPU's).
int64_t int8_wide_tile_rows();
void set_int8_wide_tile_rows(int64_t rows);
// A convolution of fewer products (multiply-adds) than this runs on the calling thread;
// tests set 0 to split any between the threads (negative: the default).
void set_int8_conv_serial_products(int64_t products);
// How many convolutions and linear layers it has run in this process (tests: that it ran),
// and the int8 depthwise ones and few-row linear layers (counted by note_int8_conv_call).
int64_t int8_conv_calls();
void note_int8_conv_call();

// Whether int8_conv takes a convolution of `channels` input channels by a weight
// [O, C / groups, kh, kw]: one group, no dilation, and the kernel available and enabled.
bool int8_conv_takes(int64_t channels, const at::Tensor& weight, at::IntArrayRef dilation,
                     int64_t groups);

// The weight [O, C, kh, kw] int8 in the multiplication's layout (an unfolded filter's as
// the 1x1 weight [O, kh * kw * C, 1, 1]): 64 output channels at a time, per tap, groups of
// 4 channels (VNNI's depth; C padded with zeros to a multiple of 4) interleaved per output
// channel (zeros past O; where the AMX tiles run, each block of 64 in their order, C padded
// to a multiple of 64: int8_amx.h), then each output channel's sum of weights (int32), for
// the zero-point correction.
at::Tensor pack_int8_conv_weight(const at::Tensor& weight);

// The function applied after the sums, scales, bias and residual, other than ReLU (which
// the epilogue folds into the uint8 result's lower bound).
enum class Int8Activation {
  kNone,
  kHardswish,  // x * min(max(x + 3, 0), 6) / 6
  kGelu,       // x * (1 + erf(x / sqrt 2)) / 2
  kGeluTanh,   // PyTorch's gelu(approximate="tanh")
};

// What happens to each result: scaled to float32, the bias added, a residual added
// (uint8 with its scale and zero point, or float32; NHWC with the result's sizes), ReLU or
// the activation, then rounded to uint8 with the output range, or left float32. Pointers
// may be null (no bias, no residual); exactly one of out_u8 and out_f32 is set.
struct Int8ConvEpilogue {
  float input_scale = 1.0f;
  int32_t input_zero_point = 0;
  const float* weight_scale = nullptr;  // [O]
  const float* bias = nullptr;          // [O] or null
  const uint8_t* add_u8 = nullptr;
  const float* add_f32 = nullptr;
  float add_scale = 1.0f;
  int32_t add_zero_point = 0;
  bool relu = false;  // not with an activation
  Int8Activation activation = Int8Activation::kNone;
  uint8_t* out_u8 = nullptr;
  float* out_f32 = nullptr;
  float out_scale = 1.0f;
  int32_t out_zero_point = 0;
};

// The convolution of `input` (uint8 NHWC [batch, height, width, channels], contiguous) by
// `packed` (pack_int8_conv_weight of an [out_channels, channels, kh, kw] weight), the
// results NHWC [batch, out_h, out_w, out_channels] as the epilogue says. Padding is the
// input's zero point.
void int8_conv(const uint8_t* input, int64_t batch, int64_t height, int64_t width,
               int64_t channels, const at::Tensor& packed, int64_t out_channels, int64_t kh,
               int64_t kw, at::IntArrayRef stride, at::IntArrayRef padding,
               const Int8ConvEpilogue& epilogue);

}  // namespace blade::ral
