// int8 GEMMs and convolutions by weights quantized per output channel: what
// `blade::quantized_linear`, `blade::quantized_conv2d` and `blade::quantized_conv2d_add`
// compute, in a compiled engine (as kernel calls, kernel_calls.h) and in TorchScript alike.
//
// The activation is quantized per tensor to uint8 with a zero point (given, from
// calibration, or measured on each call when the scale is not positive), the weight is
// int8 with one symmetric scale per output channel, and the product is a u8 x s8 -> s32
// GEMM (VNNI or AMX instructions: Blade's kernels, int8_gemv.h and int8_conv.h, or
// PyTorch's onednn::qlinear_pointwise / qconv2d_pointwise, by kernel trial in engines), its
// result scaled back to float32 with the bias added. A param weight's packed copies are
// made once per engine (PreparedWeights::int8_weight).
//
// Without VNNI or AMX, x86's u8 x s8 multiply-add saturates its 16-bit pair sums beyond
// weights of +-64 (int8_weight_limit): such a weight's layer runs the same math in float32
// instead (dequantized operands), slower, never wrong.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>
#include <vector>

namespace blade::ral {

// Whether this CPU has u8 x s8 dot-product instructions that do not saturate (VNNI, AVX-VNNI
// or AMX-INT8): Blade's own int8 kernels (int8_conv.h, int8_gemv.h, depthwise_int8.h) use
// them.
bool has_int8_dot_product();
// Tests make a CPU with them behave as one without (false), to check AVX2's path.
void set_int8_dot_product_allowed(bool allowed);

// The largest |weight| this CPU's int8 kernels multiply exactly: 127 with a dot product;
// 64 with AVX2 only, whose u8 x s8 multiply-add (vpmaddubsw, in oneDNN's AVX2 kernels) sums
// pairs of products in 16 bits, and 2 * 255 * 64 = 32640 still fits; 0 without AVX2 either
// (no int8 kernels). Config(precision="int8") quantizes weights to this limit; a layer
// whose weight exceeds it runs in float32 instead (dequantized operands): slower, never
// wrong.
int64_t int8_weight_limit();
// Tests make an AVX2 CPU behave as one without int8 kernels (false).
void set_int8_pair_sums_allowed(bool allowed);
// The feature names int8 engines need, for messages.
const char* int8_features_needed();
// Whether this CPU's int8 kernels take `weight` (int8): within int8_weight_limit. An
// engine's params were checked when it was loaded (int8_params_exceeding); other weights
// are checked once per storage and version.
bool int8_kernels_take(const at::Tensor& weight);
// Calls of quantized_linear, quantized_conv2d and quantized_conv2d_add that ran in float32
// because this CPU's kernels do not take their weight (tests read it).
int64_t int8_float_path_calls();
// The first of `params` (int8 ones only) holding a value beyond int8_weight_limit, as its
// index and that value; index -1 when none does.
std::pair<int64_t, int64_t> int8_params_exceeding(const std::vector<at::Tensor>& params);

// input [..., K] float32, weight [N, K] int8, weight_scale [N] float32, bias [N] float32
// or None, input_range float32 [2]: the input's scale and zero point (a scale <= 0
// measures both on each input). The range is a tensor, not two constants, so that layers
// alike but for their ranges compile to the same engine code (an engine param each).
// Then `post_op` ("none", "relu", "gelu", "gelu_tanh"). An int8 input is the uint8
// activation of the int8 layer before, as its bytes (input_range its scale and zero
// point); with output_range the result is rounded to uint8 with it (the next layer's) and
// returned as its bytes, int8 [..., N], as quantized_conv2d does below.
at::Tensor quantized_linear(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            const at::Tensor& input_range,
                            const std::optional<at::Tensor>& output_range,
                            c10::string_view post_op);

// A 2-d convolution by weight [O, C / groups, kH, kW] int8 with one scale per output
// channel, bias [O] float32 or None, then `post_op` ("none", "relu" or "hardswish"; the _add
// variant below: "none" or "relu"); oneDNN's qconv2d
// with the weight packed once per input size. The input is float32 [N, C, H, W], rounded
// to uint8 with input_range as above, or the uint8 activation of the int8 layer before as
// its bytes, int8 [N, H, W, C], input_range its scale and zero point. Without
// output_range the result is float32 [N, C, H, W] in channels_last layout; with it, the
// result rounded to uint8 with that range (the next int8 layer's), as int8 [N, H, W, C]:
// two layers in a row then pass uint8 NHWC data, quantized and laid out once.
at::Tensor quantized_conv2d(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& weight_scale, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef dilation, int64_t groups,
                            const at::Tensor& input_range,
                            const std::optional<at::Tensor>& output_range,
                            c10::string_view post_op);

// post_op(quantized_conv2d(...) + accum), in one oneDNN call (its "sum" post-op): a
// residual block's last convolution and its add. accum is float32 [N, O, H', W'] (the
// convolution's result sizes), or the uint8 activation of another int8 layer as its bytes,
// int8 [N, H', W', O], with accum_range its scale and zero point. With output_range the
// result is uint8 as quantized_conv2d's, and a float32 accum is rounded to uint8 with
// accum_range first; without it the result is float32 and a float32 accum is added as it is.
// The accum is never written (oneDNN's sum writes into a private copy).
at::Tensor quantized_conv2d_add(const at::Tensor& input, const at::Tensor& weight,
                                const at::Tensor& weight_scale,
                                const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                at::IntArrayRef padding, at::IntArrayRef dilation,
                                int64_t groups, const at::Tensor& input_range,
                                const at::Tensor& accum, const at::Tensor& accum_range,
                                const std::optional<at::Tensor>& output_range,
                                c10::string_view post_op);

// max_pool2d of the uint8 [N, H, W, C] activation of an int8 layer (as int8 bytes), with
// PyTorch's window arguments (stride as given, not empty): uint8 rounding keeps order, so
// this is max_pool2d of the float values, rounded. int8 [N, H', W', C] out.
at::Tensor quantized_max_pool2d(const at::Tensor& input, at::IntArrayRef kernel_size,
                                at::IntArrayRef stride, at::IntArrayRef padding,
                                at::IntArrayRef dilation, bool ceil_mode);

// The activation's uint8 values, rounded half to even as PyTorch's quantize_per_tensor.
at::Tensor quantize_uint8(const at::Tensor& input, double scale, int64_t zero_point);

// The scale and zero point that cover [min(x, 0), max(x, 0)] with 256 levels.
std::pair<double, int64_t> uint8_range(double low, double high);

}  // namespace blade::ral
