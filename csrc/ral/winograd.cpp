// Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions (see winograd.h).
//
// With d a 4x4 input patch, g a 3x3 filter and
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1],
// the 2x2 outputs are A^T [(G g G^T) . (B^T d B)] A, summed over input channels before
// the last transform (it is linear), which is where the GEMMs come in. F(4x4, 3x3) takes
// a 6x6 patch to 4x4 outputs with the points 0, +-1, +-2 and infinity:
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0;
//          0 4 0 -5 0 1],
//   G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1],
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
#include "ral/winograd.h"

#include "ral/cpu_features.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

namespace blade::ral {
namespace {

// Entries of a transformed patch: 16 for F(2x2, 3x3), 36 for F(4x4, 3x3).
constexpr int64_t entries(int64_t tile) { return (tile + 2) * (tile + 2); }
constexpr int64_t kMaxPatch = 6;

// A tile's patch rows (the input pixels it reads, or the padding's zeros) and its output
// pixels (null outside the image); F(2x2, 3x3) uses the first 4x4 and 2x2 of them.
using Patch = const float* [kMaxPatch][kMaxPatch];
using Outputs = float* [4][4];
// Floats between the 16 or 36 matrices of a block: without it they lie a power of two
// apart and a tile's entries, written and read together, contend for the same L1 sets.
constexpr int64_t kSkew = 16;

// B^T d B of one patch, channel by channel: v[xi * stride + ch] for the 16 entries xi, on
// CPUs without AVX-512F (transform_patch_avx512 below serves those with it; GCC leaves this
// loop scalar whatever the target).
__attribute__((target_clones("avx2", "default"))) void transform_patch(
    const Patch& d, float* __restrict v, int64_t stride, int64_t c) {
  const float* __restrict d00 = d[0][0]; const float* __restrict d01 = d[0][1];
  const float* __restrict d02 = d[0][2]; const float* __restrict d03 = d[0][3];
  const float* __restrict d10 = d[1][0]; const float* __restrict d11 = d[1][1];
  const float* __restrict d12 = d[1][2]; const float* __restrict d13 = d[1][3];
  const float* __restrict d20 = d[2][0]; const float* __restrict d21 = d[2][1];
  const float* __restrict d22 = d[2][2]; const float* __restrict d23 = d[2][3];
  const float* __restrict d30 = d[3][0]; const float* __restrict d31 = d[3][1];
  const float* __restrict d32 = d[3][2]; const float* __restrict d33 = d[3][3];
  for (int64_t ch = 0; ch < c; ++ch) {
    // B^T d: rows
    const float s00 = d00[ch] - d20[ch], s01 = d01[ch] - d21[ch];
    const float s02 = d02[ch] - d22[ch], s03 = d03[ch] - d23[ch];
    const float s10 = d10[ch] + d20[ch], s11 = d11[ch] + d21[ch];
    const float s12 = d12[ch] + d22[ch], s13 = d13[ch] + d23[ch];
    const float s20 = d20[ch] - d10[ch], s21 = d21[ch] - d11[ch];
    const float s22 = d22[ch] - d12[ch], s23 = d23[ch] - d13[ch];
    const float s30 = d10[ch] - d30[ch], s31 = d11[ch] - d31[ch];
    const float s32 = d12[ch] - d32[ch], s33 = d13[ch] - d33[ch];
    // (B^T d) B: columns
    v[0 * stride + ch] = s00 - s02;
    v[1 * stride + ch] = s01 + s02;
    v[2 * stride + ch] = s02 - s01;
    v[3 * stride + ch] = s01 - s03;
    v[4 * stride + ch] = s10 - s12;
    v[5 * stride + ch] = s11 + s12;
    v[6 * stride + ch] = s12 - s11;
    v[7 * stride + ch] = s11 - s13;
    v[8 * stride + ch] = s20 - s22;
    v[9 * stride + ch] = s21 + s22;
    v[10 * stride + ch] = s22 - s21;
    v[11 * stride + ch] = s21 - s23;
    v[12 * stride + ch] = s30 - s32;
    v[13 * stride + ch] = s31 + s32;
    v[14 * stride + ch] = s32 - s31;
    v[15 * stride + ch] = s31 - s33;
  }
}

// 1 when `x` is +-inf or NaN (all exponent bits set): an integer test, so that the loops
// that take it vectorize.
inline uint32_t non_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

// A^T m A of one tile's products m[xi * stride + ch], plus the bias and the ReLU, into
// the output rows y[i][j] (null outside the image). Returns whether every sum before the
// bias is finite: an inf or NaN in the patch (or a product overflowing) comes out of the
// transforms' differences as inf - inf where the direct convolution has +-inf, so such a
// tile is computed again directly (direct_tile).
__attribute__((target_clones("avx2", "default"))) bool untransform_tile(
    const float* __restrict m, int64_t stride, int64_t k, const float* __restrict bias,
    bool relu, const Outputs& y) {
  float* __restrict y00 = y[0][0];
  float* __restrict y01 = y[0][1];
  float* __restrict y10 = y[1][0];
  float* __restrict y11 = y[1][1];
  uint32_t any_non_finite = 0;
  for (int64_t ch = 0; ch < k; ++ch) {
    float in[16];
    for (int64_t xi = 0; xi < 16; ++xi) {
      in[xi] = m[xi * stride + ch];
    }
    const float b = bias != nullptr ? bias[ch] : 0.0f;
    float s0[4];
    float s1[4];
    for (int64_t j = 0; j < 4; ++j) {
      s0[j] = in[j] + in[4 + j] + in[8 + j];
      s1[j] = in[4 + j] - in[8 + j] - in[12 + j];
    }
    float r00 = s0[0] + s0[1] + s0[2];
    float r01 = s0[1] - s0[2] - s0[3];
    float r10 = s1[0] + s1[1] + s1[2];
    float r11 = s1[1] - s1[2] - s1[3];
    any_non_finite |= non_finite(r00) | non_finite(r01) | non_finite(r10) | non_finite(r11);
    r00 += b;
    r01 += b;
    r10 += b;
    r11 += b;
    if (relu) {  // max(NaN, 0) stays NaN, as torch.relu: (NaN < 0) is false
      r00 = std::max(r00, 0.0f);
      r01 = std::max(r01, 0.0f);
      r10 = std::max(r10, 0.0f);
      r11 = std::max(r11, 0.0f);
    }
    y00[ch] = r00;
    if (y01 != nullptr) y01[ch] = r01;
    if (y10 != nullptr) y10[ch] = r10;
    if (y11 != nullptr) y11[ch] = r11;
  }
  return any_non_finite == 0;
}

// GCC 12 warns inside its own intrinsics' headers here (`__Y` may be used uninitialized:
// their _mm512_undefined), not about this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The two transforms above, 16 channels to a vector: GCC leaves those loops scalar (their
// 16 rows of v or m lie a runtime stride apart, which it cannot prove apart), and they
// took more of a 64-channel 56 x 56 convolution than its GEMMs.
__attribute__((target("avx512f"))) void transform_patch_avx512(const Patch& d, float* v,
                                                               int64_t stride, int64_t c) {
  for (int64_t ch = 0; ch < c; ch += 16) {
    const __mmask16 mask = lanes_left(c - ch);
    __m512 s[4][4];
    for (int j = 0; j < 4; ++j) {  // B^T d: rows
      const __m512 d0 = _mm512_maskz_loadu_ps(mask, d[0][j] + ch);
      const __m512 d1 = _mm512_maskz_loadu_ps(mask, d[1][j] + ch);
      const __m512 d2 = _mm512_maskz_loadu_ps(mask, d[2][j] + ch);
      const __m512 d3 = _mm512_maskz_loadu_ps(mask, d[3][j] + ch);
      s[0][j] = _mm512_sub_ps(d0, d2);
      s[1][j] = _mm512_add_ps(d1, d2);
      s[2][j] = _mm512_sub_ps(d2, d1);
      s[3][j] = _mm512_sub_ps(d1, d3);
    }
    for (int i = 0; i < 4; ++i) {  // (B^T d) B: columns
      float* row = v + 4 * i * stride + ch;
      _mm512_mask_storeu_ps(row, mask, _mm512_sub_ps(s[i][0], s[i][2]));
      _mm512_mask_storeu_ps(row + stride, mask, _mm512_add_ps(s[i][1], s[i][2]));
      _mm512_mask_storeu_ps(row + 2 * stride, mask, _mm512_sub_ps(s[i][2], s[i][1]));
      _mm512_mask_storeu_ps(row + 3 * stride, mask, _mm512_sub_ps(s[i][1], s[i][3]));
    }
  }
}

__attribute__((target("avx512f"))) bool untransform_tile_avx512(
    const float* m, int64_t stride, int64_t k, const float* bias, bool relu, const Outputs& y) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __m512 zero = _mm512_setzero_ps();
  __mmask16 non_finite_lanes = 0;
  for (int64_t ch = 0; ch < k; ch += 16) {
    const __mmask16 mask = lanes_left(k - ch);
    __m512 in[16];
    for (int xi = 0; xi < 16; ++xi) {
      in[xi] = _mm512_maskz_loadu_ps(mask, m + xi * stride + ch);
    }
    __m512 s0[4];
    __m512 s1[4];
    for (int j = 0; j < 4; ++j) {
      s0[j] = _mm512_add_ps(_mm512_add_ps(in[j], in[4 + j]), in[8 + j]);
      s1[j] = _mm512_sub_ps(_mm512_sub_ps(in[4 + j], in[8 + j]), in[12 + j]);
    }
    __m512 r[4] = {_mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]),
                   _mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]),
                   _mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]),
                   _mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3])};
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + ch) : zero;
    for (int q = 0; q < 4; ++q) {
      const __m512i bits = _mm512_and_si512(_mm512_castps_si512(r[q]), exponent);
      non_finite_lanes |= _mm512_mask_cmpeq_epi32_mask(mask, bits, exponent);
      r[q] = _mm512_add_ps(r[q], b);
      if (relu) {  // vmaxps returns its second operand for a NaN: NaN stays, as torch.relu
        r[q] = _mm512_max_ps(zero, r[q]);
      }
    }
    _mm512_mask_storeu_ps(y[0][0] + ch, mask, r[0]);
    if (y[0][1] != nullptr) _mm512_mask_storeu_ps(y[0][1] + ch, mask, r[1]);
    if (y[1][0] != nullptr) _mm512_mask_storeu_ps(y[1][0] + ch, mask, r[2]);
    if (y[1][1] != nullptr) _mm512_mask_storeu_ps(y[1][1] + ch, mask, r[3]);
  }
  return non_finite_lanes == 0;
}

// B^T x of F(4x4, 3x3) for one column (or row) x of a 6x6 patch, 16 channels a vector.
__attribute__((target("avx512f"))) inline void input_transform6(const __m512 (&x)[6],
                                                                __m512 (&r)[6]) {
  const __m512 two = _mm512_set1_ps(2.0f);
  const __m512 four = _mm512_set1_ps(4.0f);
  const __m512 five = _mm512_set1_ps(5.0f);
  const __m512 t1 = _mm512_fnmadd_ps(four, x[2], x[4]);  // x4 - 4 x2
  const __m512 t2 = _mm512_fnmadd_ps(four, x[1], x[3]);  // x3 - 4 x1
  const __m512 t3 = _mm512_sub_ps(x[4], x[2]);
  const __m512 t4 = _mm512_mul_ps(two, _mm512_sub_ps(x[3], x[1]));
  r[0] = _mm512_fmadd_ps(four, x[0], _mm512_fnmadd_ps(five, x[2], x[4]));
  r[1] = _mm512_add_ps(t1, t2);
  r[2] = _mm512_sub_ps(t1, t2);
  r[3] = _mm512_add_ps(t3, t4);
  r[4] = _mm512_sub_ps(t3, t4);
  r[5] = _mm512_fmadd_ps(four, x[1], _mm512_fnmadd_ps(five, x[3], x[5]));
}

// A^T m of F(4x4, 3x3) for one column (or row) m of a tile's 6x6 products.
__attribute__((target("avx512f"))) inline void output_transform6(const __m512 (&m)[6],
                                                                 __m512 (&y)[4]) {
  const __m512 two = _mm512_set1_ps(2.0f);
  const __m512 four = _mm512_set1_ps(4.0f);
  const __m512 eight = _mm512_set1_ps(8.0f);
  const __m512 a = _mm512_add_ps(m[1], m[2]);
  const __m512 b = _mm512_sub_ps(m[1], m[2]);
  const __m512 c = _mm512_add_ps(m[3], m[4]);
  const __m512 d = _mm512_sub_ps(m[3], m[4]);
  y[0] = _mm512_add_ps(_mm512_add_ps(m[0], a), c);
  y[1] = _mm512_fmadd_ps(two, d, b);
  y[2] = _mm512_fmadd_ps(four, c, a);
  y[3] = _mm512_add_ps(_mm512_fmadd_ps(eight, d, b), m[5]);
}

// The first half of a 6x6 transform, 16 channels a vector: `transform` (B^T or A^T) of
// each column j of the 6x6 values at address(i, j) (masked by `mask`) into column j of t.
template <int kRows, void (*transform)(const __m512 (&)[6], __m512 (&)[kRows]),
          typename Address>
__attribute__((target("avx512f"), always_inline)) inline void transform_columns(
    __mmask16 mask, const Address& address, __m512 (&t)[kRows][6]) {
  for (int j = 0; j < 6; ++j) {
    __m512 column[6];
    __m512 r[kRows];
    for (int i = 0; i < 6; ++i) {
      column[i] = _mm512_maskz_loadu_ps(mask, address(i, j));
    }
    transform(column, r);
    for (int i = 0; i < kRows; ++i) {
      t[i][j] = r[i];
    }
  }
}

// B^T d B of one 6x6 patch into v[xi * stride + ch], xi = 6 i + j.
__attribute__((target("avx512f"))) void transform_patch4_avx512(const Patch& d, float* v,
                                                                int64_t stride, int64_t c) {
  for (int64_t ch = 0; ch < c; ch += 16) {
    const __mmask16 mask = lanes_left(c - ch);
    __m512 t[6][6];  // B^T d
    transform_columns<6, input_transform6>(mask, [&](int i, int j) { return d[i][j] + ch; },
                                           t);
    for (int i = 0; i < 6; ++i) {  // (B^T d) B, row by row
      __m512 r[6];
      input_transform6(t[i], r);
      for (int j = 0; j < 6; ++j) {
        _mm512_mask_storeu_ps(v + (6 * i + j) * stride + ch, mask, r[j]);
      }
    }
  }
}

// A^T m A of one tile's products m[xi * stride + ch], plus the bias and the ReLU, into its
// 4x4 outputs y (null outside the image); whether every sum before the bias is finite.
__attribute__((target("avx512f"))) bool untransform_tile4_avx512(
    const float* m, int64_t stride, int64_t k, const float* bias, bool relu, const Outputs& y) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  const __m512 zero = _mm512_setzero_ps();
  __mmask16 non_finite_lanes = 0;
  for (int64_t ch = 0; ch < k; ch += 16) {
    const __mmask16 mask = lanes_left(k - ch);
    __m512 s[4][6];  // A^T m
    transform_columns<4, output_transform6>(
        mask, [&](int i, int j) { return m + (6 * i + j) * stride + ch; }, s);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + ch) : zero;
    for (int i = 0; i < 4; ++i) {  // (A^T m) A, row by row
      __m512 r[4];
      output_transform6(s[i], r);
      for (int j = 0; j < 4; ++j) {
        const __m512i bits = _mm512_and_si512(_mm512_castps_si512(r[j]), exponent);
        non_finite_lanes |= _mm512_mask_cmpeq_epi32_mask(mask, bits, exponent);
        __m512 out = _mm512_add_ps(r[j], b);
        if (relu) {  // NaN stays, as torch.relu (see untransform_tile_avx512)
          out = _mm512_max_ps(zero, out);
        }
        if (y[i][j] != nullptr) {
          _mm512_mask_storeu_ps(y[i][j] + ch, mask, out);
        }
      }
    }
  }
  return non_finite_lanes == 0;
}

#pragma GCC diagnostic pop

bool transforms_in_avx512() {
  static const bool available = has_cpu_feature("avx512f");
  return available;
}

// Where tile `t` lies: its image and the row and column of its output block (`tile` x
// `tile` pixels). Tiles are numbered (image, row block, column block) in row-major order.
struct TileOrigin {
  int64_t image, row, col;
};

TileOrigin tile_origin(int64_t t, int64_t tile, int64_t tiles_h, int64_t tiles_w) {
  return {t / (tiles_h * tiles_w), tile * ((t / tiles_w) % tiles_h), tile * (t % tiles_w)};
}

// Transforms the patches of the tiles [first, first + count) of the NHWC input into
// v[entries][count][c]; patch rows and columns outside the image read `zeros` (the
// padding).
void transform_input(const float* x, int64_t tile, int64_t h, int64_t w, int64_t c,
                     int64_t tiles_h, int64_t tiles_w, int64_t first, int64_t count,
                     const float* zeros, float* v, int64_t v_stride) {
  const int64_t patch = tile + 2;
  for (int64_t t = 0; t < count; ++t) {
    const TileOrigin o = tile_origin(first + t, tile, tiles_h, tiles_w);
    Patch d;  // the patch starts one row and column before the block (padding)
    for (int64_t i = 0; i < patch; ++i) {
      for (int64_t j = 0; j < patch; ++j) {
        const int64_t y = o.row - 1 + i;
        const int64_t z = o.col - 1 + j;
        d[i][j] = (y < 0 || y >= h || z < 0 || z >= w) ? zeros
                                                        : x + ((o.image * h + y) * w + z) * c;
      }
    }
    if (tile == 4) {
      transform_patch4_avx512(d, v + t * c, v_stride, c);
    } else if (transforms_in_avx512()) {
      transform_patch_avx512(d, v + t * c, v_stride, c);
    } else {
      transform_patch(d, v + t * c, v_stride, c);
    }
  }
}

// The operands of one convolution, for the tiles that are computed directly.
struct Convolution {
  const float* x;       // NHWC [n, h, w, c]
  const float* weight;  // OIHW [k, c, 3, 3]
  int64_t h, w, c, k;
  const float* bias;    // [k] or null
  bool relu;
  float* out;           // NHWC [n, h, w, k]
};

// The outputs of one tile as the direct convolution computes them (sums in double): +-inf
// and NaN come out where they do in oneDNN's convolution. Only for the few tiles whose
// Winograd sums are not finite; output channels [k0, k1).
void direct_tile(const Convolution& conv, const TileOrigin& o, int64_t tile, int64_t k0,
                 int64_t k1) {
  for (int64_t i = 0; i < tile && o.row + i < conv.h; ++i) {
    for (int64_t j = 0; j < tile && o.col + j < conv.w; ++j) {
      float* y = conv.out + ((o.image * conv.h + o.row + i) * conv.w + o.col + j) * conv.k;
      for (int64_t ko = k0; ko < k1; ++ko) {
        double sum = 0.0;
        for (int64_t di = 0; di < 3; ++di) {
          const int64_t row = o.row + i + di - 1;
          for (int64_t dj = 0; dj < 3; ++dj) {
            const int64_t col = o.col + j + dj - 1;
            if (row < 0 || row >= conv.h || col < 0 || col >= conv.w) {
              continue;  // padding
            }
            const float* patch = conv.x + ((o.image * conv.h + row) * conv.w + col) * conv.c;
            const float* filter = conv.weight + ko * conv.c * 9 + di * 3 + dj;
            for (int64_t ch = 0; ch < conv.c; ++ch) {
              sum += static_cast<double>(patch[ch]) * filter[ch * 9];
            }
          }
        }
        float r = static_cast<float>(sum) + (conv.bias != nullptr ? conv.bias[ko] : 0.0f);
        y[ko] = conv.relu ? std::max(r, 0.0f) : r;
      }
    }
  }
}

// The inverse transform of the products m[entries][count][kn] of those tiles for the
// output channels [k0, k0 + kn), plus the bias and the ReLU, written to the output pixels
// that lie inside the image; tiles whose sums are not finite are computed directly.
// Returns how many were.
int64_t transform_output(const float* m, int64_t m_stride, const Convolution& conv,
                         int64_t tile, int64_t tiles_h, int64_t tiles_w, int64_t first,
                         int64_t count, int64_t k0, int64_t kn) {
  int64_t direct = 0;
  const float* bias = conv.bias != nullptr ? conv.bias + k0 : nullptr;
  for (int64_t t = 0; t < count; ++t) {
    const TileOrigin o = tile_origin(first + t, tile, tiles_h, tiles_w);
    Outputs y{};
    for (int64_t i = 0; i < tile; ++i) {
      for (int64_t j = 0; j < tile; ++j) {
        const bool inside = o.row + i < conv.h && o.col + j < conv.w;
        y[i][j] = inside ? conv.out + ((o.image * conv.h + o.row + i) * conv.w + o.col + j) *
                                          conv.k + k0
                         : nullptr;
      }
    }
    bool finite;
    if (tile == 4) {
      finite = untransform_tile4_avx512(m + t * kn, m_stride, kn, bias, conv.relu, y);
    } else if (transforms_in_avx512()) {
      finite = untransform_tile_avx512(m + t * kn, m_stride, kn, bias, conv.relu, y);
    } else {
      finite = untransform_tile(m + t * kn, m_stride, kn, bias, conv.relu, y);
    }
    if (!finite) {
      direct_tile(conv, o, tile, k0, k0 + kn);
      ++direct;
    }
  }
  return direct;
}

// How a call's work is shared: the tiles in `blocks` blocks of `block`, the output channels
// in `chunks` chunks of `chunk`, a task per (chunk, block) pair numbered chunk-major.
struct WorkSplit {
  int64_t block, blocks, chunk, chunks;
};

// Where the transformed weight outweighs the transformed input (more output channels than
// tiles: the 14 x 14 and 7 x 7 layers of an image network at batch 1), each thread takes a
// chunk of the output channels over every tile, so each weight byte is read by one thread
// once; blocks of tiles each thread took whole re-read every matrix per block (a 7 x 7
// layer of 512 channels read its 16 MB weight once per block). Otherwise the tiles are
// shared and each block multiplies by every output channel.
WorkSplit split_work(int64_t tiles, int64_t entries, int64_t c, int64_t k, int64_t threads) {
  constexpr int64_t kVector = 16;
  int64_t chunks = 1;
  if (threads > 1 && k > tiles) {
    chunks = std::min(threads, std::max<int64_t>(1, k / (4 * kVector)));
  }
  int64_t chunk = (k + chunks - 1) / chunks;
  chunk = std::min(k, (chunk + kVector - 1) / kVector * kVector);
  chunks = (k + chunk - 1) / chunk;
  // A block's transformed input and products, entries x block x (C + chunk) floats: with
  // shared tiles within about half of a 1 MB L2, as many blocks as that takes, rounded up
  // to a multiple of the threads and the tiles shared evenly among them (4 blocks of 16,
  // 16, 16 and 1 tiles left one of 2 threads idle a third of a 14 x 14 convolution). A
  // chunk's thread re-reads its weight per block, so its blocks may fill more of the L2.
  const int64_t budget = (chunks > 1 ? 1536 : 512) * 1024;
  const int64_t largest = std::clamp<int64_t>(budget / (4 * entries * (c + chunk)), 8, 256);
  int64_t blocks = (tiles + largest - 1) / largest;
  if (chunks == 1) {
    blocks = std::min(tiles, (blocks + threads - 1) / threads * threads);
  }
  const int64_t block = (tiles + blocks - 1) / blocks;
  return {block, (tiles + block - 1) / block, chunk, chunks};
}

std::atomic<int64_t> calls_by_tile[2];  // F(2x2, 3x3)'s, F(4x4, 3x3)'s
std::atomic<bool> allow_4x4{true};

int64_t tiles_of(int64_t n, int64_t h, int64_t w, int64_t tile) {
  return n * ((h + tile - 1) / tile) * ((w + tile - 1) / tile);
}

}  // namespace

void set_winograd_4x4(bool enabled) { allow_4x4.store(enabled, std::memory_order_relaxed); }

bool winograd_4x4_enabled() { return allow_4x4.load(std::memory_order_relaxed); }

int64_t winograd_calls(int64_t tile) {
  return tile == 2 || tile == 4 ? calls_by_tile[tile / 4].load(std::memory_order_relaxed) : 0;
}

int64_t winograd_tile(int64_t n, int64_t h, int64_t w) {
  // F(4x4, 3x3) multiplies 36 entries per tile of 16 outputs, F(2x2, 3x3) 16 per 4, but
  // its tiles overhang an image whose sides are not multiples of 4 (14 x 14: 16 x 16
  // computed) and its weight is 2.25 times as large: taken where its products are at most
  // 0.75 of F(2x2, 3x3)'s and its GEMMs have 32 rows or more to read the weight for
  // (ResNet-50's 56 x 56 and 28 x 28 layers, its 14 x 14 ones from batch 2 and 7 x 7 ones
  // at batch 8; at batch 1 a 14 x 14 layer's 16 tiles made it wait on its weight), with
  // AVX-512 for its transforms.
  const int64_t tiles = tiles_of(n, h, w, 4);
  if (!transforms_in_avx512() || !winograd_4x4_enabled() || tiles < 32) {
    return 2;
  }
  return 36 * tiles * 4 <= 3 * 16 * tiles_of(n, h, w, 2) ? 4 : 2;
}

at::Tensor winograd_weight(const at::Tensor& weight, int64_t tile) {
  TORCH_CHECK(weight.dim() == 4 && weight.size(2) == 3 && weight.size(3) == 3,
              "winograd_weight: expected a [K, C, 3, 3] weight, got ", weight.sizes());
  TORCH_CHECK(tile == 2 || tile == 4, "winograd_weight: the output tile is 2 or 4, not ",
              tile);
  const at::Tensor g = weight.to(at::kDouble).contiguous();
  const int64_t k = g.size(0);
  const int64_t c = g.size(1);
  const int64_t patch = tile + 2;
  at::Tensor u = at::empty({entries(tile), c, k}, weight.options().dtype(at::kFloat));
  const double* gp = g.data_ptr<double>();
  float* up = u.data_ptr<float>();
  // G's rows (header comment) as the weights of g's three taps.
  static constexpr double kG2[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, -.5, .5}, {0, 0, 1}};
  static constexpr double kG4[6][3] = {{1.0 / 4, 0, 0},
                                       {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                       {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                       {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                       {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                       {0, 0, 1}};
  const double(*gm)[3] = tile == 4 ? kG4 : kG2;
  // Made on an engine's first calls (ResNet-50's 3x3 weights: tens of milliseconds on one
  // thread), so on the intra-op threads, a range of input channels each; the filters of
  // one channel are written side by side (u's innermost dimension is k).
  at::parallel_for(0, c, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t o = 0; o < k; ++o) {
        const double* f = gp + (o * c + i) * 9;
        double a[kMaxPatch][3];  // G g
        for (int64_t r = 0; r < patch; ++r) {
          for (int64_t j = 0; j < 3; ++j) {
            a[r][j] = gm[r][0] * f[j] + gm[r][1] * f[3 + j] + gm[r][2] * f[6 + j];
          }
        }
        for (int64_t r = 0; r < patch; ++r) {  // (G g) G^T
          for (int64_t s = 0; s < patch; ++s) {
            const double e = a[r][0] * gm[s][0] + a[r][1] * gm[s][1] + a[r][2] * gm[s][2];
            up[((patch * r + s) * c + i) * k + o] = static_cast<float>(e);
          }
        }
      }
    }
  });
  return u;
}

bool winograd_conv3x3(const float* x, int64_t n, int64_t h, int64_t w, int64_t c,
                      const float* transformed, int64_t tile, const float* weight, int64_t k,
                      const float* bias, bool relu, float* out) {
  TORCH_CHECK(tile == 2 || (tile == 4 && transforms_in_avx512()),
              "winograd_conv3x3: no F(", tile, "x", tile, ", 3x3) on this CPU");
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0 || k <= 0) {
    return false;
  }
  calls_by_tile[tile / 4].fetch_add(1, std::memory_order_relaxed);
  const int64_t n_entries = entries(tile);
  const int64_t tiles_h = (h + tile - 1) / tile;
  const int64_t tiles_w = (w + tile - 1) / tile;
  const int64_t tiles = n * tiles_h * tiles_w;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const WorkSplit split = split_work(tiles, n_entries, c, k, threads);
  const Convolution conv{x, weight, h, w, c, k, bias, relu, out};
  // Tiles computed directly (non-finite inputs) so far. Each costs tens of Winograd tiles,
  // so past a sixteenth of them the call gives up and the caller convolves another way.
  const int64_t max_direct = std::max<int64_t>(tiles / 16, 16) * split.chunks;
  std::atomic<int64_t> direct{0};
  at::parallel_for(0, split.blocks * split.chunks, 1, [&](int64_t begin, int64_t end) {
    // Per task, not per call of the kernel: the blocks' buffers are overwritten whole.
    const int64_t v_stride = split.block * c + kSkew;
    const int64_t m_stride = split.block * split.chunk + kSkew;
    std::unique_ptr<float[]> scratch(new float[n_entries * (v_stride + m_stride) + c]);
    float* v = scratch.get();
    float* m = v + n_entries * v_stride;
    float* zeros = m + n_entries * m_stride;
    std::fill(zeros, zeros + c, 0.0f);
    for (int64_t task = begin;
         task < end && direct.load(std::memory_order_relaxed) <= max_direct; ++task) {
      const int64_t k0 = task / split.blocks * split.chunk;
      const int64_t kn = std::min(split.chunk, k - k0);
      const int64_t first = task % split.blocks * split.block;
      const int64_t count = std::min(split.block, tiles - first);
      transform_input(x, tile, h, w, c, tiles_h, tiles_w, first, count, zeros, v, v_stride);
      // m[xi] = v[xi] [count, C] @ u[xi][:, k0:k0 + kn], row-major: oneDNN's GEMM
      // microkernel (as fused_attention.cpp; MKL's sgemm took 1.6 times as long on these
      // small GEMMs).
      for (int64_t xi = 0; xi < n_entries; ++xi) {
        at::native::cpublas::brgemm(count, kn, c, c, k, kn, /*add_C=*/false,
                                    v + xi * v_stride, transformed + xi * c * k + k0,
                                    m + xi * m_stride, /*is_vnni=*/false);
      }
      const int64_t direct_tiles = transform_output(m, m_stride, conv, tile, tiles_h, tiles_w,
                                                    first, count, k0, kn);
      if (direct_tiles > 0) {
        direct.fetch_add(direct_tiles, std::memory_order_relaxed);
      }
    }
  });
  return direct.load() <= max_direct;
}

}  // namespace blade::ral
