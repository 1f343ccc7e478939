// The convolution library calls (blade_ral_conv2d_*, ral_kernels.h): oneDNN's convolution
// into the engine's buffer, in bfloat16 for a bf16 engine, or Winograd's algorithm or MKL's
// sgemm where the engine's kernel trials find them faster (kernel_trials.h); ATen's
// convolution where none of them applies.
#include "ral/conv_kernels.h"

#include "ral/float_conv.h"
#include "ral/bf16_rounding.h"
#include "ral/cpu_features.h"
#include "ral/depthwise_conv.h"
#include "ral/kernel_trials.h"
#include "ral/library_call.h"
#include "ral/matmul_kernels.h"
#include "ral/offered_buffers.h"
#include "ral/winograd.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <sstream>
#include <vector>

namespace blade::ral {
namespace {

// rows[r, j] += bias[j] (where given), then max(x, 0) keeping NaN where `relu`, for rows
// [begin, end) of a dense [rows, cols] float32 matrix. (target_clones: each listed name is
// one clone, picked for the CPU at load; the loop is in the clone itself, so that it is
// vectorized for that CPU.)
__attribute__((target_clones("avx512f", "avx2", "default"))) void add_bias_rectify_rows(
    float* __restrict matrix, int64_t begin, int64_t end, int64_t cols,
    const float* __restrict bias, bool relu) {
  for (int64_t r = begin; r < end; ++r) {
    float* row = matrix + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float value = bias != nullptr ? row[j] + bias[j] : row[j];
      // NaN < 0 is false: NaN stays, as torch.relu keeps it.
      row[j] = relu && value < 0.0F ? 0.0F : value;
    }
  }
}

// The same for the whole matrix, just written: one pass over it where a broadcast copy of
// the bias before the GEMM (beta 1) and a ReLU after it took two, each a full pass.
void add_bias_rectify(float* matrix, int64_t rows, int64_t cols, const float* bias,
                      bool relu) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)),
                   [&](int64_t begin, int64_t end) {
                     add_bias_rectify_rows(matrix, begin, end, cols, bias, relu);
                   });
}

// A 1x1 convolution (stride 1, no padding, one group) of dense NHWC float32 data by a
// param, as the trials' plain-weight GEMM (trial_gemm) of its [N*H*W, C] rows by the
// weight [O, C] transposed, written straight into the rows of `target`, then the bias and
// the ReLU (keeping NaN) in one pass. False when no such GEMM runs here.
bool convolve_1x1_by_gemm(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                          const at::Tensor& target, const std::optional<at::Tensor>& bias,
                          bool relu) {
  const int64_t rows = x.size(0) * x.size(2) * x.size(3);
  const int64_t channels = x.size(1);
  const int64_t outputs = w.size(0);
  if (!trial_gemm(prepared, x.data_ptr<float>(), channels, w, true, target.data_ptr<float>(),
                  outputs, rows)) {
    return false;
  }
  if (bias.has_value() || relu) {
    const at::Tensor dense_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
    add_bias_rectify(target.data_ptr<float>(), rows, outputs,
                     dense_bias.defined() ? dense_bias.data_ptr<float>() : nullptr, relu);
  }
  return true;
}

// A float32 convolution of one group over dense, non-empty NHWC input and result: what
// the kernels reading the input as GEMM rows or planes need.
bool dense_float_conv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                      int64_t groups) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && groups == 1 &&
         w.size(1) == x.size(1) && x.is_contiguous(cl) && target.is_contiguous(cl) &&
         x.numel() > 0 && target.numel() > 0;
}

bool is_1x1_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                 const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                 const std::vector<int64_t>& dilation, int64_t groups) {
  return dense_float_conv(x, w, target, groups) && w.size(2) == 1 && w.size(3) == 1 &&
         w.is_contiguous() && padding == std::vector<int64_t>{0, 0} &&
         stride == std::vector<int64_t>{1, 1};
}

// The [N, O, H, W] sizes of conv2d(x, w) with symmetric `padding`.
std::vector<int64_t> conv_output_sizes(const at::Tensor& x, const at::Tensor& w,
                                       const std::vector<int64_t>& padding,
                                       const std::vector<int64_t>& stride,
                                       const std::vector<int64_t>& dilation) {
  std::vector<int64_t> sizes{x.size(0), w.size(0)};
  for (int64_t d = 0; d < 2; ++d) {
    const int64_t reach = x.size(2 + d) + 2 * padding[d] - dilation[d] * (w.size(2 + d) - 1) - 1;
    TORCH_CHECK(reach >= 0 && stride[d] > 0, "blade_ral_conv2d: input ", x.sizes(),
                " is smaller than the dilated kernel ", w.sizes());
    sizes.push_back(reach / stride[d] + 1);
  }
  return sizes;
}

// Winograd's F(2x2, 3x3) (winograd.h) where it can beat oneDNN's direct convolution (the
// engine's first calls then time both: PreparedWeights::next_kernel): float32
// NHWC data convolved by a 3x3 param with stride 1, no dilation, one group, padding 1 on
// every side, both buffers dense, and enough channels for the GEMMs to outweigh the
// transforms (fewer channels lost to oneDNN on an AVX2 host; the kernel trials decide
// per weight and size the rest of the way).
constexpr int64_t kWinogradMinChannels = 32;        // C and K each
constexpr int64_t kWinogradMinChannelPairs = 3072;  // C * K

bool winograd_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                      const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                      const std::vector<int64_t>& dilation, int64_t groups) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && groups == 1 &&
         w.size(1) == x.size(1) && w.size(2) == 3 && w.size(3) == 3 &&
         padding == std::vector<int64_t>{1, 1} &&
         stride == std::vector<int64_t>{1, 1} && dilation == std::vector<int64_t>{1, 1} &&
         x.size(1) >= kWinogradMinChannels && w.size(0) >= kWinogradMinChannels &&
         x.size(1) * w.size(0) >= kWinogradMinChannelPairs && x.is_contiguous(cl) &&
         target.is_contiguous(cl);
}

// Blade's bfloat16 convolution (float_conv.h) where it applies: a float32 NHWC input and
// result, a param weight of one group, no dilation. It rounds the input as it copies it
// into its planes and adds the bias and ReLU in registers, with no library call around it.
// False where it does not apply (oneDNN's bfloat16 kernel is tried next).
bool convolve_bf16_tiles(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& target, const std::optional<at::Tensor>& bias,
                         ConvActivation activation, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& dilation, const float* added,
                         const float* input_scale) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  if (!bf16_conv_available() || x.scalar_type() != at::kFloat || w.dim() != 4 ||
      target.scalar_type() != at::kFloat || !x.is_contiguous(cl) ||
      !target.is_contiguous(cl) || w.size(1) != x.size(1) ||
      std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d != 1; }) ||
      (bias.has_value() && (bias->scalar_type() != at::kFloat || !bias->is_contiguous()))) {
    return false;
  }
  const at::Tensor packed = prepared->bf16_conv(w);
  if (!packed.defined()) {
    return false;
  }
  bf16_conv(x.const_data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1), packed,
            w.size(0), w.size(2), w.size(3), stride, padding,
            bias.has_value() ? bias->const_data_ptr<float>() : nullptr, activation,
            target.data_ptr<float>(), added, input_scale);
  return true;
}

// Whether Blade's float32 convolution (float_conv.h) is the alternative to oneDNN's: on
// AVX-512 or AVX2 with FMA, for every dense convolution of one group that Winograd's does
// not take. It wins 1x1 layers (in place of MKL's sgemm, which runs its AVX2 code on AMD's
// cores), an image's stem (oneDNN runs few input channels slowly) and most of ResNet-50's
// strided layers; it loses some other strided and kxk ones by a little (their planes copy costs
// what the products save), which the kernel trial leaves to oneDNN.
bool f32_tiles_apply(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                     const std::vector<int64_t>& dilation, int64_t groups) {
  return f32_conv_available() && f32_conv_enabled() &&
         dense_float_conv(x, w, target, groups) && dilation == std::vector<int64_t>{1, 1};
}

// The convolution by Blade's float32 kernel into `target`, by the param's pack; false when
// there is none (not a param, or the pack would pass the limit).
bool convolve_f32_tiles(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                        const at::Tensor& target, const std::optional<at::Tensor>& bias,
                        ConvActivation activation, const std::vector<int64_t>& padding,
                        const std::vector<int64_t>& stride, const float* added,
                        const float* input_scale) {
  if (!f32_conv_enabled()) {  // turned off after its trial began: declined, oneDNN's runs
    return false;
  }
  const at::Tensor packed = prepared->f32_conv(w);
  if (!packed.defined()) {
    return false;
  }
  const at::Tensor dense_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
  f32_conv(x.const_data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1), packed,
           w.size(0), w.size(2), w.size(3), stride, padding,
           dense_bias.defined() ? dense_bias.const_data_ptr<float>() : nullptr, activation,
           target.data_ptr<float>(), added, input_scale);
  return true;
}

// Blade's depthwise convolution (depthwise_conv.h) where it applies: float32 NHWC data, one
// group per channel and one filter per group, a 3x3 or 5x5 kernel, both buffers dense.
bool depthwise_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& target,
                       int64_t groups) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return depthwise_conv_available() && x.scalar_type() == at::kFloat &&
         w.scalar_type() == at::kFloat && groups == x.size(1) && w.size(0) == groups &&
         w.size(1) == 1 && depthwise_conv_takes(w.size(2), w.size(3)) && x.is_contiguous(cl) &&
         target.is_contiguous(cl);
}

// The depthwise convolution into `target` (an NCHW view of the NHWC buffer, its shape
// checked) by the weight's [kh, kw, C] filters; false without them (not a param).
bool convolve_depthwise(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                        const at::Tensor& target, const std::optional<at::Tensor>& bias,
                        ConvActivation activation, const std::vector<int64_t>& padding,
                        const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation) {
  const at::Tensor filters = prepared->depthwise(w);
  if (!filters.defined()) {
    return false;
  }
  const at::Tensor dense_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
  return depthwise_conv2d(x.data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1),
                          filters.data_ptr<float>(), w.size(2), w.size(3), stride[0], stride[1],
                          padding[0], padding[1], dilation[0], dilation[1],
                          dense_bias.defined() ? dense_bias.data_ptr<float>() : nullptr,
                          depthwise_post_op(activation), target.data_ptr<float>(),
                          target.size(2), target.size(3));
}

// The convolution by Winograd's algorithm into `target` (an NCHW view of the NHWC buffer,
// its shape checked); false when the weight has no Winograd form (not a param), a size
// is empty, or too much of the input is inf or NaN (winograd.h).
bool convolve_winograd(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                       const at::Tensor& target, const std::optional<at::Tensor>& bias,
                       bool relu) {
  const int64_t tile = winograd_tile(x.size(0), x.size(2), x.size(3));
  const at::Tensor transformed = prepared->winograd(w, tile);
  if (!transformed.defined()) {
    return false;
  }
  const at::Tensor dense_bias = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor dense_weight = w.contiguous();  // a param: already contiguous
  return winograd_conv3x3(
      x.data_ptr<float>(), x.size(0), x.size(2), x.size(3), x.size(1),
      transformed.data_ptr<float>(), tile, dense_weight.data_ptr<float>(), w.size(0),
      dense_bias.defined() ? dense_bias.data_ptr<float>() : nullptr, relu,
      target.data_ptr<float>());
}

void conv2d(c10::ScalarType dtype, BladeUnrankedMemRef* input, BladeUnrankedMemRef* weight,
            BladeUnrankedMemRef* out, int64_t stride_h, int64_t stride_w, int64_t pad_top,
            int64_t pad_bottom, int64_t pad_left, int64_t pad_right, int64_t dilation_h,
            int64_t dilation_w, int64_t groups, bool channels_last,
            BladeUnrankedMemRef* bias_memref = nullptr, int64_t activation_code = 0,
            BladeUnrankedMemRef* added_memref = nullptr,
            BladeUnrankedMemRef* scale_memref = nullptr) noexcept {
  const char* what = channels_last ? "blade_ral_conv2d_nhwc" : "blade_ral_conv2d";
  const auto profile_name = [&] {
    std::ostringstream name;
    name << what << " " << buffer_view(input, dtype).sizes() << " by "
         << buffer_view(weight, dtype).sizes() << " stride " << stride_h << " groups " << groups;
    return name.str();
  };
  guarded(what, profile_name, [&] {
    // NHWC buffers are viewed as NCHW tensors with channels_last strides: PyTorch (oneDNN)
    // convolves those without reordering them, and returns a channels_last result. The
    // views are kept for the call (its weight's address) between calls.
    const ViewShape layout = channels_last ? ViewShape::kNchw : ViewShape::kAsIs;
    const void* site = buffer_address(weight);
    at::Tensor x = kept_view(site, 0, input, dtype, layout);
    std::vector<int64_t> padding{pad_top, pad_left};
    if (pad_top != pad_bottom || pad_left != pad_right) {
      x = at::constant_pad_nd(x, {pad_left, pad_right, pad_top, pad_bottom}, 0);
      padding = {0, 0};
    }
    const std::vector<int64_t> stride{stride_h, stride_w};
    const std::vector<int64_t> dilation{dilation_h, dilation_w};
    at::Tensor w = kept_view(site, 1, weight, dtype, ViewShape::kAsIs);
    at::Tensor target = kept_view(site, 2, out, dtype, layout);
    check_result_shape("blade_ral_conv2d", target,
                       conv_output_sizes(x, w, padding, stride, dilation));
    std::optional<at::Tensor> bias;
    if (bias_memref != nullptr) {
      bias = kept_view(site, 3, bias_memref, dtype, ViewShape::kAsIs);
      if (bias->dim() != 1) {
        bias = bias->reshape({-1});
      }
      TORCH_CHECK(bias->numel() == w.size(0), "blade_ral_conv2d: a bias of ", bias->numel(),
                  " values for ", w.size(0), " output channels");
    }
    // A tensor added to the result before the activation (a residual connection), of the
    // result's shape; copied first where it shares memory with the result.
    std::optional<at::Tensor> added;
    if (added_memref != nullptr) {
      added = kept_view(site, 4, added_memref, dtype, layout);
      check_result_shape("blade_ral_conv2d: the tensor added", *added, target.sizes());
      if (at::get_overlap_status(*added, target) != at::MemOverlapStatus::No) {
        added = added->clone(at::MemoryFormat::ChannelsLast);
      }
    }
    // Blade's float32 and bfloat16 tiles add it in registers (`tiles_add`), for float32
    // data in the channels_last layout they write.
    const auto cl = at::MemoryFormat::ChannelsLast;
    const bool tiles_add = !added.has_value() ||
                           (added->scalar_type() == at::kFloat && added->is_contiguous(cl));
    const float* added_data = added.has_value() && tiles_add ? added->const_data_ptr<float>()
                                                             : nullptr;
    // The input multiplied per image and channel first (a squeeze-excitation's scale,
    // [N, C] in any shape of that order): Blade's tiles scale it as they copy it where they
    // read it as its plane (`f32_scales`, `bf16_scales`); the other kernels read a scaled
    // copy, made once (`library_input`).
    at::Tensor input_scale;
    if (scale_memref != nullptr) {
      const at::Tensor& scale = kept_view(site, 5, scale_memref, dtype, ViewShape::kAsIs);
      TORCH_CHECK(scale.numel() == x.size(0) * x.size(1) || scale.numel() == x.size(1),
                  "blade_ral_conv2d: an input scale of ", scale.sizes(), " for the input ",
                  x.sizes(), ": one value per image and channel is needed");
      input_scale = scale.reshape({-1, x.size(1)}).expand({x.size(0), x.size(1)}).contiguous();
    }
    const bool scales = input_scale.defined();
    const bool float_scale = scales && input_scale.scalar_type() == at::kFloat;
    const auto scaled_by_tiles = [&](bool bf16) {
      return !scales || (float_scale && float_conv_scales_input(bf16, x.size(2), x.size(3),
                                                                x.size(1), w.size(2),
                                                                w.size(3), stride, padding));
    };
    const bool f32_scales = scaled_by_tiles(false), bf16_scales = scaled_by_tiles(true);
    const float* scale_data = float_scale ? input_scale.const_data_ptr<float>() : nullptr;
    at::Tensor scaled_x;
    const auto library_input = [&]() -> const at::Tensor& {
      if (!scales) {
        return x;
      }
      if (!scaled_x.defined()) {
        scaled_x = at::mul(x, input_scale.view({x.size(0), x.size(1), 1, 1}))
                       .contiguous(at::MemoryFormat::ChannelsLast);
      }
      return scaled_x;
    };
    PreparedWeights* prepared = active_prepared_weights();
    // Without a tensor added, ReLU is every kernel's post-op; SiLU and hardswish are
    // applied by Blade's float32, bfloat16 and depthwise kernels (`fuses_pass`) and after
    // any other (`pass_after`, over the result). With a tensor added, the kernels that do
    // not add it run without the activation, and `pass_after` adds it and activates.
    const ConvActivation activation = conv_activation(activation_code);
    const ConvActivation own_activation = added.has_value() ? ConvActivation::kNone : activation;
    const bool relu = own_activation == ConvActivation::kRelu;
    // The pass's SiLU or hardswish, which oneDNN's convolve_into may take as its post-op
    // (without a tensor added, which comes first).
    ConvActivation pass_activation = activation;
    ConvActivation* const onednn_post_op = added.has_value() ? nullptr : &pass_activation;
    const auto pass_after = [&] {
      if (added.has_value()) {
        target.add_(*added);
        if (activation == ConvActivation::kRelu) {
          target.relu_();  // max(x, 0) keeping NaN, as eager
        }
      }
      if (!activation_pass(pass_activation)) {
        return;
      }
      if (target.scalar_type() == at::kFloat &&
          target.is_contiguous(at::MemoryFormat::ChannelsLast)) {
        activation_dense(pass_activation, target.data_ptr<float>(), target.numel());
      } else if (pass_activation == ConvActivation::kSilu) {
        at::silu_(target);
      } else {
        at::hardswish_(target);
      }
    };
    // The float32 path: oneDNN's kernel, or a second where one applies.
    const auto convolve_f32 = [&] {
      // A second kernel where one applies (Winograd's algorithm, MKL's sgemm), timed
      // against oneDNN's on the engine's first calls (PreparedWeights::next_kernel).
      using Kernel = PreparedWeights::Kernel;
      Kernel alternative = Kernel::kOneDnn;
      if (channels_last && prepared != nullptr) {
        if (winograd_applies(x, w, target, padding, stride, dilation, groups)) {
          alternative = Kernel::kWinograd;
        } else if (f32_tiles_apply(x, w, target, dilation, groups)) {
          alternative = Kernel::kF32Tiles;
        } else if (is_1x1_gemm(x, w, target, padding, stride, dilation, groups)) {
          alternative = Kernel::kGemm;
        } else if (depthwise_applies(x, w, target, groups)) {
          alternative = Kernel::kDepthwise;
        }
      }
      const std::vector<int64_t> input_size = x.sizes().vec();
      const at::Tensor param = w;  // the trial's key (w may become a channels_last copy)
      // A running trial's calls are timed; a decided one's kernel runs untimed.
      bool timed = false;
      const Kernel kernel =
          alternative == Kernel::kOneDnn
              ? Kernel::kOneDnn
              : prepared->next_kernel(w, false, input_size, alternative, &timed);
      Stopwatch stopwatch;
      bool done = false;
      const bool fuses_pass = (kernel == Kernel::kF32Tiles && tiles_add) ||
                              (kernel == Kernel::kDepthwise && !added.has_value());
      if ((kernel == Kernel::kF32Tiles &&
           convolve_f32_tiles(prepared, f32_scales ? x : library_input(), w, target, bias,
                              tiles_add ? activation : own_activation, padding, stride,
                              added_data, f32_scales ? scale_data : nullptr)) ||
          (kernel == Kernel::kWinograd &&
           convolve_winograd(prepared, library_input(), plain_weight(w), target, bias, relu)) ||
          (kernel == Kernel::kGemm &&
           convolve_1x1_by_gemm(prepared, library_input(), w, target, bias, relu)) ||
          (kernel == Kernel::kDepthwise &&
           convolve_depthwise(prepared, library_input(), w, target, bias, own_activation,
                              padding, stride, dilation))) {
        if (!fuses_pass) {
          pass_after();
        }
        if (!timed) {
          return;
        }
        prepared->record_kernel_time(w, false, input_size, kernel, stopwatch.seconds());
        // A trial's first call runs oneDNN's too (below; the same result within rounding).
        if (!prepared->onednn_run_pending(w, false, input_size)) {
          return;
        }
        done = true;
        stopwatch = Stopwatch();
      }  // else declined (Winograd: inf or NaN in the input): oneDNN's, and not a sample
      at::Tensor reordered;  // oneDNN's copy, for convolve_into only
      if (channels_last && prepared != nullptr) {
        if (w.scalar_type() != at::kBFloat16 || onednn_takes_bf16()) {
          reordered = prepared->onednn_weight(w, false, input_size, padding, stride, dilation,
                                              groups);
        }
        // Without oneDNN's copy, a channels_last one (with it, no second copy is kept; the
        // plain weight serves the rare call convolve_into declines).
        if (!reordered.defined()) {
          w = prepared->channels_last(w);
        }
      }
      if (channels_last &&
          convolve_into(target, library_input(),
                        reordered.defined() ? reordered : plain_weight(w), bias, relu, padding,
                        stride, dilation, groups, onednn_post_op)) {
        pass_after();
        if ((kernel == Kernel::kOneDnn || done) && timed) {
          prepared->record_kernel_time(param, false, input_size, Kernel::kOneDnn,
                                       stopwatch.seconds());
        }
        return;
      }
      if (done) {
        return;  // the alternative's result stands
      }
      at::Tensor result =
          at::conv2d(library_input(), plain_weight(w), bias, stride, padding, dilation, groups);
      target.copy_(relu ? at::relu(result) : result);
      pass_after();
    };
    // A bf16 engine's convolutions by its params (depthwise and grouped ones excepted:
    // memory-bound, they ran slower in bfloat16 with the conversions) run in bfloat16 or
    // by the float32 path, whichever their precision trial finds faster: converting the
    // activations to and from bfloat16 costs more than the faster products save in the
    // small layers of a mobile network.
    if (!(channels_last && prepared != nullptr && prepared->bf16() && groups == 1)) {
      convolve_f32();
      return;
    }
    // bfloat16 declines without a copy (the limit, or oneDNN's reorder refused it); on a
    // trial's first call the float32 path runs after it, and its result stands.
    const at::Tensor param = w;  // the trial's key (convolve_f32 may replace w)
    prepared->run_trial(
        param, PreparedWeights::kPrecisionTrial, x.sizes().vec(),
        PreparedWeights::Kernel::kBf16,
        [&] {
          if (tiles_add &&
              convolve_bf16_tiles(prepared, bf16_scales ? x : library_input(), param, target,
                                  bias, activation, padding, stride, dilation, added_data,
                                  bf16_scales ? scale_data : nullptr)) {
            return true;
          }
          if (convolve_bf16(prepared, library_input(), param, false, target, bias, relu,
                            padding, stride, dilation)) {
            pass_after();
            return true;
          }
          return false;
        },
        convolve_f32);
  });
}

}  // namespace

bool onednn_takes_bf16() {
  static const bool takes =
      missing_cpu_features("avx512bw,avx512vl,avx512dq").empty() ||
      missing_cpu_features("avx_ne_convert").empty();
  return takes;
}

bool convolve_into(at::Tensor& target, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation, int64_t groups,
                   ConvActivation* post_op) {
  static const std::optional<c10::OperatorHandle> plain = c10::Dispatcher::singleton().findOp(
      c10::OperatorName("mkldnn::_convolution_pointwise", ""));
  static const std::optional<c10::OperatorHandle> adding = c10::Dispatcher::singleton().findOp(
      c10::OperatorName("mkldnn::_convolution_pointwise_", "binary"));
  const auto cl = at::MemoryFormat::ChannelsLast;
  // A oneDNN weight (PreparedWeights::onednn_weight) has no strides to check.
  const auto dtype = target.scalar_type();
  const bool takes_dtype =
      dtype == at::kFloat || (dtype == at::kBFloat16 && onednn_takes_bf16());
  if (!takes_dtype || x.scalar_type() != dtype || !x.is_contiguous(cl) ||
      (!w.is_mkldnn() && !w.is_contiguous(cl)) || !target.is_contiguous(cl)) {
    return false;
  }
  // The ReLU is not oneDNN's post-op: its vmaxps turns NaN into 0, where torch.relu keeps
  // NaN. A pass over the result just written (still in cache) costs little next to the
  // convolution. An error here (none is expected for these operands) propagates: the
  // engine falls back for the call and reports it.
  if (plain.has_value() && offering_installed()) {
    // oneDNN's result made in the engine's buffer, offered to the allocator (an output
    // made elsewhere, where a temporary of its size took the offer, is copied in).
    const ConvActivation own = post_op != nullptr ? *post_op : ConvActivation::kNone;
    const char* attr = own == ConvActivation::kSilu        ? "swish"
                       : own == ConvActivation::kHardswish ? "hardswish"
                                                           : "none";
    torch::jit::Stack stack{x,
                            w,
                            bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                            padding,
                            stride,
                            dilation,
                            groups,
                            std::string(attr),
                            c10::List<std::optional<at::Scalar>>(),
                            c10::IValue()};
    {
      ScopedOffer offered(target);
      plain->callBoxed(&stack);
    }
    settle(stack.at(0).toTensor(), target, copy_into);
    if (post_op != nullptr && activation_pass(own)) {
      *post_op = ConvActivation::kNone;
    }
  } else if (adding.has_value()) {
    // out = conv(x, w) + bias + out, into the buffer zeroed first.
    target.zero_();
    torch::jit::Stack stack{target,
                            x,
                            w,
                            bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                            padding,
                            stride,
                            dilation,
                            groups,
                            std::string("add"),
                            at::Scalar(1.0),
                            c10::IValue(),
                            c10::List<std::optional<at::Scalar>>(),
                            c10::IValue()};
    adding->callBoxed(&stack);
  } else {
    return false;
  }
  if (relu) {
    target.relu_();  // max(x, 0) keeping NaN, as eager
  }
  return true;
}

bool convolve_bf16(PreparedWeights* prepared, const at::Tensor& x, const at::Tensor& w,
                   bool transposed, const at::Tensor& target,
                   const std::optional<at::Tensor>& bias, bool relu,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& dilation) {
  static const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(
      c10::OperatorName("mkldnn::_convolution_pointwise", ""));
  if (!op.has_value() || x.scalar_type() != at::kFloat || x.numel() == 0 ||
      target.numel() == 0) {
    return false;
  }
  const at::Tensor reordered = prepared->onednn_weight(w, transposed, x.sizes().vec(), padding,
                                                       stride, dilation, 1, /*bf16=*/true);
  if (!reordered.defined()) {
    return false;
  }
  torch::jit::Stack stack{rounded_to_bf16(x),
                          reordered,
                          bias.has_value() ? c10::IValue(*bias) : c10::IValue(),
                          padding,
                          stride,
                          dilation,
                          int64_t{1},
                          std::string("none"),
                          c10::List<std::optional<at::Scalar>>(),
                          c10::IValue()};
  op->callBoxed(&stack);
  widen_bf16(stack.at(0).toTensor(), target, relu);
  return true;
}

}  // namespace blade::ral

extern "C" {

// blade_ral_conv2d_<suffix> (NCHW) and blade_ral_conv2d_nhwc_<suffix> alike.
#define BLADE_RAL_DEFINE_UNBIASED_CONV2D(name, scalar_type, channels_last)                   \
  void name(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(out),        \
            int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_bottom,         \
            int64_t pad_left, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,     \
            int64_t groups) {                                                                \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),       \
                        result = BLADE_RAL_UNRANKED(out);                                    \
    blade::ral::conv2d(scalar_type, &x, &w, &result, stride_h, stride_w, pad_top,            \
                       pad_bottom, pad_left, pad_right, dilation_h, dilation_w, groups,      \
                       channels_last);                                                       \
  }
// The biased NHWC entries' integer arguments, and their call of conv2d with a tensor added
// and an input scale (null: none), their memrefs unpacked as x, w, b and result.
#define BLADE_RAL_BIASED_CONV2D_INTS                                                       \
  int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_bottom,                 \
      int64_t pad_left, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,         \
      int64_t groups, int64_t activation
#define BLADE_RAL_CALL_BIASED_CONV2D(scalar_type, added, scale)                            \
  blade::ral::conv2d(scalar_type, &x, &w, &result, stride_h, stride_w, pad_top,            \
                     pad_bottom, pad_left, pad_right, dilation_h, dilation_w, groups,      \
                     true, &b, activation, added, scale)
#define BLADE_RAL_DEFINE_CONV2D(suffix, scalar_type)                                       \
  BLADE_RAL_DEFINE_UNBIASED_CONV2D(blade_ral_conv2d_##suffix, scalar_type, false)          \
  BLADE_RAL_DEFINE_UNBIASED_CONV2D(blade_ral_conv2d_nhwc_##suffix, scalar_type, true)      \
  void blade_ral_conv2d_nhwc_bias_##suffix(                                                \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),           \
      BLADE_RAL_MEMREF(out), BLADE_RAL_BIASED_CONV2D_INTS) {                               \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),     \
                        b = BLADE_RAL_UNRANKED(bias), result = BLADE_RAL_UNRANKED(out);    \
    BLADE_RAL_CALL_BIASED_CONV2D(scalar_type, nullptr, nullptr);                           \
  }                                                                                        \
  void blade_ral_conv2d_nhwc_bias_add_##suffix(                                            \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),           \
      BLADE_RAL_MEMREF(added), BLADE_RAL_MEMREF(out), BLADE_RAL_BIASED_CONV2D_INTS) {      \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),     \
                        b = BLADE_RAL_UNRANKED(bias), a = BLADE_RAL_UNRANKED(added),       \
                        result = BLADE_RAL_UNRANKED(out);                                  \
    BLADE_RAL_CALL_BIASED_CONV2D(scalar_type, &a, nullptr);                                \
  }                                                                                        \
  void blade_ral_conv2d_nhwc_bias_scaled_##suffix(                                         \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),           \
      BLADE_RAL_MEMREF(scale), BLADE_RAL_MEMREF(out), BLADE_RAL_BIASED_CONV2D_INTS) {      \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),     \
                        b = BLADE_RAL_UNRANKED(bias), s = BLADE_RAL_UNRANKED(scale),       \
                        result = BLADE_RAL_UNRANKED(out);                                  \
    BLADE_RAL_CALL_BIASED_CONV2D(scalar_type, nullptr, &s);                                \
  }                                                                                        \
  void blade_ral_conv2d_nhwc_bias_scaled_add_##suffix(                                     \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),           \
      BLADE_RAL_MEMREF(scale), BLADE_RAL_MEMREF(added), BLADE_RAL_MEMREF(out),             \
      BLADE_RAL_BIASED_CONV2D_INTS) {                                                      \
    BladeUnrankedMemRef x = BLADE_RAL_UNRANKED(input), w = BLADE_RAL_UNRANKED(weight),     \
                        b = BLADE_RAL_UNRANKED(bias), s = BLADE_RAL_UNRANKED(scale),       \
                        a = BLADE_RAL_UNRANKED(added), result = BLADE_RAL_UNRANKED(out);   \
    BLADE_RAL_CALL_BIASED_CONV2D(scalar_type, &a, &s);                                     \
  }
BLADE_RAL_FOR_EACH_FLOAT_TYPE(BLADE_RAL_DEFINE_CONV2D)
#undef BLADE_RAL_DEFINE_CONV2D
#undef BLADE_RAL_CALL_BIASED_CONV2D
#undef BLADE_RAL_BIASED_CONV2D_INTS
#undef BLADE_RAL_DEFINE_UNBIASED_CONV2D
}
