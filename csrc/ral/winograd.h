// 3x3 convolutions of NHWC float32 data by Winograd's F(2x2, 3x3) and F(4x4, 3x3)
// algorithms.
//
// A 3x3 convolution with stride 1 computes each 2x2 block of outputs from a 4x4 patch of
// its input. Winograd's minimal filtering does that with 16 products per (input channel,
// output channel) pair instead of 36: the patch and the filter are transformed into a
// 4x4 "frequency" form (a few additions), multiplied element by element, and transformed
// back. Over all tiles and channels the 16 element-wise products are 16 GEMMs,
// [tiles, C] x [C, K], which oneDNN's GEMM microkernel runs near the machine's peak: 2.25
// times fewer multiply-adds than the direct convolution oneDNN computes.
//
// F(4x4, 3x3) takes each 4x4 block of outputs from a 6x6 patch with 36 products instead
// of 144: 1.8 times fewer than F(2x2, 3x3), for images whose 4x4 tiles cover them well.
//
// The weights' transform [16 or 36][C][K] is made once per engine (PreparedWeights). The
// input is taken in blocks of tiles small enough that a block's transformed input and
// products stay in L2 while one thread transforms, multiplies and transforms back; blocks
// run on PyTorch's intra-op threads. F(2x2, 3x3)'s results agree with the direct
// convolution to within a few float32 roundings of the sums (its transforms only add,
// subtract and halve); F(4x4, 3x3)'s scale by up to 8 and by fractions, which leaves about
// 1e-5 of the largest output.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace blade::ral {

// The output tile Winograd's algorithm takes for an [n, h, w, *] input: 4 (F(4x4, 3x3),
// 36 products per 16 outputs, on CPUs with AVX-512) where its tiles fit the image well
// enough to need clearly fewer products than F(2x2, 3x3), else 2.
int64_t winograd_tile(int64_t n, int64_t h, int64_t w);
// Process-wide: false keeps every Winograd convolution F(2x2, 3x3) (results within 1e-6
// of eager's rather than about 1e-5 of a layer's largest output), for calls from then on;
// true (the default) lets winograd_tile choose F(4x4, 3x3). blade.set_winograd_4x4.
void set_winograd_4x4(bool enabled);
bool winograd_4x4_enabled();

// How many convolutions winograd_conv3x3 has run (or begun) in this process with output
// tiles of `tile` (tests: which algorithm ran).
int64_t winograd_calls(int64_t tile);

// The Winograd form of a [K, C, 3, 3] float32 weight for output tiles of `tile` (2 or 4):
// [(tile + 2)^2, C, K], element (xi, c, k) the xi-th entry of G g G^T for filter
// g = weight[k, c].
at::Tensor winograd_weight(const at::Tensor& weight, int64_t tile);

// out[N, H, W, K] = relu?(conv3x3(x, weight, padding 1) + bias) for NHWC x [N, H, W, C],
// both contiguous, `transformed` from winograd_weight(weight, tile) of the contiguous OIHW
// `weight`, `bias` [K] or null. Tiles whose sums are not finite (an inf or NaN in their
// patch: the transforms would subtract inf from inf) are computed directly from `weight`,
// so +-inf and NaN land where the direct convolution puts them. False for empty sizes
// (nothing written), and when more than a sixteenth of the tiles needed the direct
// computation (part of `out` written); the caller then convolves another way, overwriting
// `out`.
bool winograd_conv3x3(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* transformed, int64_t tile, const float* weight, int64_t k,
                      const float* bias, bool relu, float* out);

}  // namespace blade::ral
