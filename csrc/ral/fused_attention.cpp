#include "ral/fused_attention.h"

#include "ral/float_conv.h"
#include "ral/bf16_rounding.h"
#include "ral/cpu_features.h"
#include "ral/kernel_trials.h"
#include "ral/mkl_functions.h"
#include "ral/ral_parallel.h"
#include "ral/task_runs.h"

#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace blade::ral {
namespace {

// MKL's sgemm (mkl_functions.h; null without MKL: attention then takes PyTorch's kernel).
MklFunctions::FortranSgemm fortran_sgemm() { return mkl_functions().sgemm; }

// Row-major C[m, n] = A[m, k] @ B[k, n], every operand unit-stride along its rows:
// oneDNN's batch-reduce GEMM microkernel (PyTorch's cpublas::brgemm, the one its own CPU
// flash attention runs; MKL's sgemm where oneDNN has no kernel for the CPU). Unlike MKL's
// sgemm it neither packs A nor zero-fills C first: on one 128 x 128 x 64 head those two
// steps were a quarter of sgemm's time in the attention workload.
void brgemm_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float* c, int64_t ldc) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, /*add_C=*/false, a, b, c,
                              /*is_vnni=*/false);
}

// Scores per task block: query rows are taken so that a block of scores (rows x keys
// floats) stays within this many, in L2 next to its k and v.
constexpr int64_t kScoresPerBlock = 32 * 1024;
constexpr int64_t kMinRowsPerBlock = 16;
// Query rows per block where a causal mask ends rows early: a block multiplies only the
// keys its rows attend, so smaller blocks skip more (32 rows: 5/8 of a head's products).
constexpr int64_t kTrimmedRowsPerBlock = 32;
// v's columns as oneDNN's bf16 microkernel packs them (AMX): a multiple of kVColumnStep in
// panels of at most kVPanelWidth.
constexpr int64_t kVColumnStep = 16;
constexpr int64_t kVPanelWidth = 64;

// A [rows, cols] matrix of a rank-4 tensor for CBLAS (row-major): stored as is (unit
// stride along cols) or transposed (unit stride along rows), `ld` apart.
struct Matrix {
  const float* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t row_stride = 0;  // elements between rows of the logical matrix
  bool transposed = false;
  int64_t ld = 0;
};

bool fits_int(int64_t value) { return value >= 0 && value <= std::numeric_limits<int>::max(); }

bool as_matrix(const at::Tensor& t, Matrix* m) {
  const int64_t rows = t.size(2);
  const int64_t cols = t.size(3);
  m->data = t.data_ptr<float>();
  m->batch_stride = t.stride(0);
  m->head_stride = t.stride(1);
  m->row_stride = t.stride(2);
  if (t.stride(3) == 1 || cols == 1) {
    m->transposed = false;
    m->ld = std::max<int64_t>(t.stride(2), cols);
    return rows == 1 || t.stride(2) >= cols ? fits_int(m->ld) : false;
  }
  if (t.stride(2) == 1 || rows == 1) {
    m->transposed = true;
    m->ld = std::max<int64_t>(t.stride(3), rows);
    return fits_int(m->ld) && (cols == 1 || t.stride(3) >= rows);
  }
  return false;
}

// Rows of scores are padded to a multiple of this many floats (-inf scores, exp 0), so
// that exp_rows' loops have no tail at any of its vector widths.
constexpr int64_t kLanes = 16;

// `Lanes` floats (or int32s) as one value, GCC's vector extensions: exp_rows is compiled
// once per instruction set with the width of its registers (16 on AVX-512, 8 on AVX2, 4
// on SSE). A width past the target's registers compiles, but GCC splits it through the
// stack: 16 lanes on AVX2 made exp_rows half the attention workload's time. The helpers
// are always inlined into their caller's target, so the ABI of passing such a value
// (what -Wpsabi warns about) never applies.
#pragma GCC diagnostic ignored "-Wpsabi"
template <int Lanes>
struct Vector {
  typedef float Floats __attribute__((vector_size(Lanes * sizeof(float))));
  typedef int32_t Ints __attribute__((vector_size(Lanes * sizeof(int32_t))));
};

#define BLADE_INLINE __attribute__((always_inline)) inline

template <int Lanes>
BLADE_INLINE typename Vector<Lanes>::Floats load(const float* p) {
  typename Vector<Lanes>::Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename Floats>
BLADE_INLINE void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }

template <int Lanes>
BLADE_INLINE typename Vector<Lanes>::Floats splat(float x) {
  return typename Vector<Lanes>::Floats{} + x;
}

template <typename Floats>
BLADE_INLINE Floats max(Floats a, Floats b) { return a > b ? a : b; }

// The lanes of `v` combined by `op` in a tree of halves, in registers (log2(Lanes) steps
// deep): lane by lane, one row's sum and max took 16 dependent adds each, as long as the
// exponentials of 128 keys. `op` takes vectors of every width and floats.
template <int Lanes, typename Op>
BLADE_INLINE float tree_reduce(typename Vector<Lanes>::Floats v, Op op) {
  using Half = typename Vector<Lanes / 2>::Floats;
  if constexpr (Lanes == 16) {
    const Half low = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const Half high = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    return tree_reduce<8>(op(low, high), op);
  } else if constexpr (Lanes == 8) {
    const Half low = __builtin_shufflevector(v, v, 0, 1, 2, 3);
    const Half high = __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return tree_reduce<4>(op(low, high), op);
  } else {
    static_assert(Lanes == 4, "16, 8 or 4 lanes");
    return op(op(v[0], v[2]), op(v[1], v[3]));
  }
}

// exp(x) for x <= 0 (a score minus its row's max): Cody-Waite range reduction and the
// degree-5 polynomial of approximations.py (< 1 ulp in the normal range; 0 below -87.3,
// where the true result is under 1.22e-38; NaN stays NaN).
template <int Lanes>
BLADE_INLINE typename Vector<Lanes>::Floats exp_nonpositive(typename Vector<Lanes>::Floats x) {
  using Floats = typename Vector<Lanes>::Floats;
  using Ints = typename Vector<Lanes>::Ints;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMin = -87.3f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2**23: adding it rounds to an integer
  const Floats below = splat<Lanes>(kMin);
  const Floats xc = x < below ? below : x;
  const Floats n = (xc * kLog2e + kRound) - kRound;
  const Floats r = (xc - n * kLn2Hi) - n * kLn2Lo;
  Floats p = splat<Lanes>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Floats y = p * r * r + r + 1.0f;
  // y * 2**n, n in [-126, 0]: 2**n is a normal float built in the exponent bits.
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  Floats scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < below ? Floats{} : y * scale;
}

// 8 floats: one AVX2 register (half an AVX-512 one), the width of transpose's tiles.
typedef float Floats8 __attribute__((vector_size(8 * sizeof(float))));

// The 8 x 8 tile at `src` (rows `ld_src` apart) transposed into `dst` (rows `ld_dst`
// apart): three rounds of pairwise shuffles in registers, 8 row loads, 8 row stores.
BLADE_INLINE void transpose_tile(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  Floats8 r[8];
  for (int i = 0; i < 8; ++i) {
    std::memcpy(&r[i], src + i * ld_src, sizeof(Floats8));
  }
  Floats8 t[8];  // pairs of rows interleaved
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  Floats8 u[8];  // quads of rows interleaved
  for (int i = 0; i < 8; i += 4) {
    for (int h = 0; h < 2; ++h) {
      u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 2 * h + 1] =
          __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int c = 0; c < 4; ++c) {
    const Floats8 low = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Floats8 high = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(dst + c * ld_dst, &low, sizeof(Floats8));
    std::memcpy(dst + (c + 4) * ld_dst, &high, sizeof(Floats8));
  }
}

// The 8 x 8 tile at `src` transposed into `dst` as transpose_tile, by AVX intrinsics: the
// vector-extension version's row loads, split in halves by GCC's generic tuning, went
// through the stack and stalled its 32-byte reloads (a fifth of gpt_block's attention).
__attribute__((target("avx2"))) inline void transpose_tile_avx2(const float* src,
                                                                int64_t ld_src, float* dst,
                                                                int64_t ld_dst) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm256_loadu_ps(src + i * ld_src);
  }
  __m256 t[8];  // pairs of rows interleaved: columns 0, 1, 4, 5 and 2, 3, 6, 7
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];  // quads: u[4q + j] holds column j (low half) and j + 4 (high half)
  for (int q = 0; q < 2; ++q) {
    const __m256* tq = t + 4 * q;
    u[4 * q + 0] = _mm256_shuffle_ps(tq[0], tq[2], 0x44);
    u[4 * q + 1] = _mm256_shuffle_ps(tq[0], tq[2], 0xEE);
    u[4 * q + 2] = _mm256_shuffle_ps(tq[1], tq[3], 0x44);
    u[4 * q + 3] = _mm256_shuffle_ps(tq[1], tq[3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ld_dst, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * ld_dst, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
  }
}

// dst[c, r] = src[r, c] for a [rows, cols] matrix: k^T for the microkernel, which reads
// both operands untransposed. 8 x 8 tiles in registers (an element-wise copy, its stores
// each a row apart, was a visible share of attention), element-wise at the edges.
template <bool kAvx2>
BLADE_INLINE void transpose_tiles(const float* __restrict src, int64_t ld_src, int64_t rows,
                                  int64_t cols, float* __restrict dst, int64_t ld_dst) {
  const int64_t whole_rows = rows - rows % 8;
  const int64_t whole_cols = cols - cols % 8;
  for (int64_t r = 0; r < whole_rows; r += 8) {
    for (int64_t c = 0; c < whole_cols; c += 8) {
      if constexpr (kAvx2) {
        transpose_tile_avx2(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst);
      } else {
        transpose_tile(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst);
      }
    }
    for (int64_t c = whole_cols; c < cols; ++c) {
      for (int64_t i = r; i < r + 8; ++i) {
        dst[c * ld_dst + i] = src[i * ld_src + c];
      }
    }
  }
  for (int64_t r = whole_rows; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      dst[c * ld_dst + r] = src[r * ld_src + c];
    }
  }
}

__attribute__((target("avx2"))) void transpose_avx2(const float* src, int64_t ld_src,
                                                    int64_t rows, int64_t cols, float* dst,
                                                    int64_t ld_dst) {
  transpose_tiles<true>(src, ld_src, rows, cols, dst, ld_dst);
}

void transpose_baseline(const float* src, int64_t ld_src, int64_t rows, int64_t cols,
                        float* dst, int64_t ld_dst) {
  transpose_tiles<false>(src, ld_src, rows, cols, dst, ld_dst);
}

void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst) {
  static const bool avx2 = has_cpu_feature("avx2");
  (avx2 ? transpose_avx2 : transpose_baseline)(src, ld_src, rows, cols, dst, ld_dst);
}

// One row of scores: scales it and adds the mask row, then exp(score - max) in place;
// returns the reciprocal of the row's sum, by which the caller scales the row's output
// (fewer multiplies than scaling the row when the value dim is under the key count). When
// every score is -inf the row and the result are `empty_row` (0, so the output row is 0,
// or NaN, softmax's 0/0 unfused). Rows are padded to a multiple of kLanes with -inf
// scores (exp 0) in the scratch block, so the exp loop has no tail.
template <int Lanes>
BLADE_INLINE float exp_row_lanes(float* __restrict row, const float* __restrict mask,
                                 float scale, int64_t n, int64_t padded, float empty_row) {
  using Floats = typename Vector<Lanes>::Floats;
  static_assert(kLanes % Lanes == 0, "rows are padded to whole vectors");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const Floats factor = splat<Lanes>(scale);
  Floats top = splat<Lanes>(kNegInf);
  for (int64_t j = n; j < padded; ++j) {
    row[j] = kNegInf;
  }
  const int64_t whole = n - n % Lanes;
  if (mask != nullptr) {
    for (int64_t j = 0; j < whole; j += Lanes) {
      const Floats x = load<Lanes>(row + j) * factor + load<Lanes>(mask + j);
      store(row + j, x);
      top = max(top, x);
    }
    for (int64_t j = whole; j < n; ++j) {
      row[j] = row[j] * scale + mask[j];
    }
  } else {
    for (int64_t j = 0; j < whole; j += Lanes) {
      const Floats x = load<Lanes>(row + j) * factor;
      store(row + j, x);
      top = max(top, x);
    }
    for (int64_t j = whole; j < n; ++j) {
      row[j] *= scale;
    }
  }
  if (whole < n) {
    top = max(top, load<Lanes>(row + whole));
  }
  const float largest = tree_reduce<Lanes>(top, [](auto a, auto b) { return a > b ? a : b; });
  if (largest == kNegInf) {
    std::fill(row, row + n, empty_row);  // (its padding stays -inf)
    return empty_row;
  }
  const Floats shift = splat<Lanes>(largest);
  Floats sums{};
  for (int64_t j = 0; j < padded; j += Lanes) {
    const Floats e = exp_nonpositive<Lanes>(load<Lanes>(row + j) - shift);
    store(row + j, e);
    sums += e;
  }
  return 1.0f / tree_reduce<Lanes>(sums, [](auto a, auto b) { return a + b; });
}

// exp_row_lanes over `count` rows of a block (`stride` floats apart; each row's first n
// scores, padded to `padded`), their mask rows `mask_stride` apart (null: none), each
// row's 1 / sum into inverse_sums: one call a block, so that the constants and the call's
// cost are not paid per row.
template <int Lanes>
BLADE_INLINE void exp_rows_lanes(float* rows, int64_t count, int64_t stride,
                                 const float* mask, int64_t mask_stride, float scale,
                                 int64_t n, int64_t padded, float empty_row,
                                 float* inverse_sums) {
  for (int64_t i = 0; i < count; ++i) {
    inverse_sums[i] = exp_row_lanes<Lanes>(rows + i * stride,
                                           mask == nullptr ? nullptr : mask + i * mask_stride,
                                           scale, n, padded, empty_row);
  }
}

using ExpRows = void (*)(float*, int64_t, int64_t, const float*, int64_t, float, int64_t,
                         int64_t, float, float*);

__attribute__((target("avx512f"))) void exp_rows_avx512(
    float* rows, int64_t count, int64_t stride, const float* mask, int64_t mask_stride,
    float scale, int64_t n, int64_t padded, float empty_row, float* inverse_sums) {
  exp_rows_lanes<16>(rows, count, stride, mask, mask_stride, scale, n, padded, empty_row,
                     inverse_sums);
}

__attribute__((target("avx2,fma"))) void exp_rows_avx2(
    float* rows, int64_t count, int64_t stride, const float* mask, int64_t mask_stride,
    float scale, int64_t n, int64_t padded, float empty_row, float* inverse_sums) {
  exp_rows_lanes<8>(rows, count, stride, mask, mask_stride, scale, n, padded, empty_row,
                    inverse_sums);
}

void exp_rows_baseline(float* rows, int64_t count, int64_t stride, const float* mask,
                       int64_t mask_stride, float scale, int64_t n, int64_t padded,
                       float empty_row, float* inverse_sums) {
  exp_rows_lanes<4>(rows, count, stride, mask, mask_stride, scale, n, padded, empty_row,
                    inverse_sums);
}

// exp_rows, then the rows rounded to bfloat16 into `probabilities` (rows `stride` apart,
// their padding 0: @ v reads whole pairs of keys) by AVX512-BF16's one instruction per
// vector (the bf16 products run on such CPUs only). Rounded in the exponentials' loop
// instead, by integer steps (GCC cannot inline that instruction into exp_row_lanes, a
// template of no target), BERT-base's attention at 128 keys took 8% longer.
__attribute__((target("avx512f"))) void exp_rows_bf16(
    float* rows, int64_t count, int64_t stride, const float* mask, int64_t mask_stride,
    float scale, int64_t n, int64_t padded, float empty_row, float* inverse_sums,
    c10::BFloat16* probabilities) {
  exp_rows_lanes<16>(rows, count, stride, mask, mask_stride, scale, n, padded, empty_row,
                     inverse_sums);
  for (int64_t i = 0; i < count; ++i) {
    float* row = rows + i * stride;
    std::fill(row + n, row + padded, 0.0f);  // an empty row's padding is still -inf
    round_to_bf16_avx512(row, probabilities + i * stride, padded);
  }
}

// exp_rows for this CPU, picked once.
ExpRows exp_rows_for_host() {
  if (has_cpu_feature("avx512f")) {
    return exp_rows_avx512;
  }
  if (has_cpu_feature("avx2") && has_cpu_feature("fma")) {
    return exp_rows_avx2;
  }
  return exp_rows_baseline;
}

const ExpRows exp_rows = exp_rows_for_host();

thread_local bool bf16_products = false;
std::atomic<Bf16Attention> bf16_attention_mode{Bf16Attention::kWhenFaster};

struct Problem {
  Matrix q;
  Matrix k;
  Matrix v;
  float* out = nullptr;
  int64_t out_batch_stride = 0;
  int64_t out_head_stride = 0;
  int64_t out_row_stride = 0;
  const float* mask = nullptr;
  int64_t mask_strides[3] = {0, 0, 0};  // batch, head, row; unit along keys
  int64_t batches = 0;
  int64_t heads = 0;
  int64_t rows = 0;  // query length
  int64_t keys = 0;
  int64_t head_dim = 0;
  int64_t value_dim = 0;
  int64_t rows_per_block = 0;
  int64_t blocks_per_head = 0;
  // Per block of a head's query rows, the keys its rows attend at most (empty: all), where
  // a mask shared by every (batch, head) ends rows early (a causal one).
  std::vector<int64_t> block_keys;
  float scale = 1.0f;
  float empty_row = 0.0f;  // exp_rows' value for a row of -inf scores
  // q and v stored as is (unit stride along their rows): both products run on
  // brgemm_row_major, k^T copied per block unless k is stored transposed. Otherwise MKL's
  // sgemm, which reads either operand transposed.
  bool microkernel = false;
  // Products with bfloat16 operands (Bf16AttentionProducts; microkernel, even head dim).
  bool bf16 = false;
};

// Where task `task` works: the (batch, head) and the block of query rows it takes.
struct Block {
  int64_t head_index = 0;
  int64_t b = 0;
  int64_t h = 0;
  int64_t first = 0;  // query row
  int64_t count = 0;
  const float* q = nullptr;  // the block's first row
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;  // the block's first row
};

Block block_of(const Problem& p, int64_t task) {
  Block block;
  block.head_index = task / p.blocks_per_head;
  block.b = block.head_index / p.heads;
  block.h = block.head_index % p.heads;
  block.first = (task % p.blocks_per_head) * p.rows_per_block;
  block.count = std::min(p.rows_per_block, p.rows - block.first);
  block.q = p.q.data + block.b * p.q.batch_stride + block.h * p.q.head_stride +
            block.first * p.q.row_stride;
  block.k = p.k.data + block.b * p.k.batch_stride + block.h * p.k.head_stride;
  block.v = p.v.data + block.b * p.v.batch_stride + block.h * p.v.head_stride;
  block.out = p.out + block.b * p.out_batch_stride + block.h * p.out_head_stride +
              block.first * p.out_row_stride;
  return block;
}

// The keys the block's rows multiply: block_keys' count (the rest are masked for all of
// them), or every key.
int64_t keys_of(const Problem& p, int64_t task) {
  return p.block_keys.empty() ? p.keys : p.block_keys[task % p.blocks_per_head];
}

// The mask's row for the block's row i (null without a mask).
const float* mask_row(const Problem& p, const Block& block, int64_t i) {
  return p.mask == nullptr ? nullptr
                           : p.mask + block.b * p.mask_strides[0] +
                                 block.h * p.mask_strides[1] +
                                 (block.first + i) * p.mask_strides[2];
}

// The block's output rows times their softmax's 1 / sum.
void normalize_rows(const Problem& p, const Block& block, const float* inverse_sums) {
  for (int64_t i = 0; i < block.count; ++i) {
    float* row = block.out + i * p.out_row_stride;
    const float inverse = inverse_sums[i];
    for (int64_t j = 0; j < p.value_dim; ++j) {
      row[j] *= inverse;
    }
  }
}

// One worker of the pool: takes its own run of blocks (TaskRuns), then the other runs'
// last ones, so a thread that starts late or is preempted (a busy or virtualized host)
// does not leave the others waiting at the barrier on a fixed share of the blocks.
void run_blocks(int64_t first_worker, int64_t /*end_worker*/, void** arguments) {
  const Problem& p = *static_cast<const Problem*>(arguments[0]);
  auto& runs = *static_cast<TaskRuns*>(arguments[1]);
  // Rows of scores padded to whole vectors (exp_rows).
  const int64_t padded = (p.keys + kLanes - 1) / kLanes * kLanes;
  std::unique_ptr<float[]> scores(new float[p.rows_per_block * padded]);
  std::unique_ptr<float[]> inverse_sums(new float[p.rows_per_block]);
  std::unique_ptr<float[]> k_transposed(
      p.microkernel && !p.k.transposed ? new float[p.head_dim * padded] : nullptr);
  // The (batch, head) whose k^T k_transposed holds, and for how many keys: a thread's
  // blocks are mostly of one head in turn (at 384 keys a head's 5 blocks had each copied
  // it again), and under a causal mask a block multiplies only the keys its rows attend
  // (a head's first block of 32 rows, a quarter of them): the copy grows to them.
  int64_t transposed_head = -1;
  int64_t transposed_keys = 0;
  int64_t task = 0, run_end = 0;
  while (runs.next(first_worker, task, run_end)) {
    const Block block = block_of(p, task);
    const int64_t count = block.count;
    const int64_t keys = keys_of(p, task);
    const int64_t keys_padded = (keys + kLanes - 1) / kLanes * kLanes;
    const float *q = block.q, *k = block.k, *v = block.v;
    float* out = block.out;
    // scores = q @ k^T (exp_rows scales them).
    if (p.microkernel) {
      const float* k_t = k;
      int64_t ld_k_t = p.k.ld;
      if (!p.k.transposed) {
        if (transposed_head != block.head_index) {
          transposed_head = block.head_index;
          transposed_keys = 0;
        }
        if (transposed_keys < keys) {
          transpose(k + transposed_keys * p.k.ld, p.k.ld, keys - transposed_keys, p.head_dim,
                    k_transposed.get() + transposed_keys, padded);
          transposed_keys = keys;
        }
        k_t = k_transposed.get();
        ld_k_t = padded;
      }
      brgemm_row_major(count, keys, p.head_dim, q, p.q.ld, k_t, ld_k_t, scores.get(),
                       padded);
    } else {
      sgemm_row_major(p.q.transposed, !p.k.transposed, count, keys, p.head_dim, 1.0f, q,
                     p.q.ld, k, p.k.ld, 0.0f, scores.get(), padded);
    }
    exp_rows(scores.get(), count, padded, mask_row(p, block, 0), p.mask_strides[2], p.scale,
             keys, keys_padded, p.empty_row, inverse_sums.get());
    if (p.microkernel) {
      brgemm_row_major(count, p.value_dim, keys, scores.get(), padded, v, p.v.ld, out,
                       p.out_row_stride);
    } else {
      sgemm_row_major(false, p.v.transposed, count, p.value_dim, keys, 1.0f, scores.get(),
                     padded, v, p.v.ld, 0.0f, out, p.out_row_stride);
    }
    normalize_rows(p, block, inverse_sums.get());
  }
}

// A worker thread's buffers for the bf16 products, kept from one call to the next (an
// attention a layer would otherwise allocate and free them each time), up to kKeptBytes.
struct Bf16Scratch {
  static constexpr size_t kKeptBytes = size_t{8} << 20;
  std::vector<float> scores, inverse_sums;
  std::vector<c10::BFloat16> q, probabilities, k_rows, k_pairs, v_rows, v_pairs;

  void trim() {
    const size_t bytes = (scores.capacity() + inverse_sums.capacity()) * sizeof(float) +
                         (q.capacity() + probabilities.capacity() + k_rows.capacity() +
                          k_pairs.capacity() + v_rows.capacity() + v_pairs.capacity()) *
                             sizeof(c10::BFloat16);
    if (bytes > kKeptBytes) {
      *this = Bf16Scratch();
    }
  }
};
thread_local Bf16Scratch bf16_scratch;

// `buffer` with room for n values (grown, never shrunk here).
template <typename T>
T* grown(std::vector<T>& buffer, int64_t n) {
  if (buffer.size() < static_cast<size_t>(n)) {
    buffer.resize(static_cast<size_t>(n));
  }
  return buffer.data();
}

// b [k, n] bfloat16 row-major (k even) as bf16_pairs_gemm's pairs: rows 2p and 2p + 1
// interleaved into pair row p of n 32-bit pairs.
void pair_rows(const c10::BFloat16* b, int64_t k, int64_t n, uint32_t* pairs) {
  for (int64_t p = 0; p < k / 2; ++p) {
    const auto* even = reinterpret_cast<const uint16_t*>(b + 2 * p * n);
    const auto* odd = reinterpret_cast<const uint16_t*>(b + (2 * p + 1) * n);
    uint32_t* out = pairs + p * n;
    for (int64_t j = 0; j < n; ++j) {
      out[j] = static_cast<uint32_t>(even[j]) | (static_cast<uint32_t>(odd[j]) << 16);
    }
  }
}

std::atomic<bool> bf16_amx_allowed{true};  // set_bf16_attention_amx

// Whether this CPU has AMX-BF16 tiles that PyTorch's brgemm microkernel packs for.
bool has_amx_bf16() {
  static const bool amx =
      has_cpu_feature("amx_bf16") && at::native::cpublas::could_pack(at::kBFloat16);
  return amx;
}

// Whether the bf16 products run on those tiles, else on AVX512-BF16's dot products
// (bf16_pairs_gemm, float_conv.h: PyTorch's brgemm runs bf16 only on AMX).
bool bf16_amx() { return has_amx_bf16() && bf16_amx_allowed.load(std::memory_order_relaxed); }

// c[m x n] = a @ b (b's rows in pairs, the layout both ways read) by the AMX microkernel or
// bf16_pairs_gemm.
void pairs_gemm(bool amx, int64_t m, int64_t n, int64_t k, const c10::BFloat16* a,
                int64_t lda, const c10::BFloat16* b, int64_t ldb, float* c, int64_t ldc) {
  if (amx) {
    at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, /*add_C=*/false, a, b, c,
                                /*is_vnni=*/true);
  } else {
    bf16_pairs_gemm(m, n, k, a, lda, reinterpret_cast<const uint32_t*>(b), ldb, c, ldc);
  }
}

// run_blocks with bfloat16 products: per head, k^T and v rounded to bfloat16 and laid
// out as both ways of multiplying read their B operand (pairs of rows interleaved,
// "VNNI"); per block, q's rows rounded, the scores and their softmax in float32 as above,
// and the probabilities rounded for @ v, whose float32 sums go straight into the output.
void run_blocks_bf16(int64_t first_worker, int64_t /*end_worker*/, void** arguments) {
  const Problem& p = *static_cast<const Problem*>(arguments[0]);
  auto& runs = *static_cast<TaskRuns*>(arguments[1]);
  const int64_t padded = (p.keys + kLanes - 1) / kLanes * kLanes;  // even, as pairs need
  const int64_t e = p.head_dim;
  const int64_t ev = p.value_dim;
  Bf16Scratch& scratch = bf16_scratch;
  // oneDNN's microkernel packs v only to rows of 16, 32, 48 or 64 values (others throw):
  // v is packed and multiplied in panels of up to 64 of its columns.
  const bool amx = bf16_amx() && ev % kVColumnStep == 0;
  const int64_t panel = amx ? kVPanelWidth : ev;
  float* scores = grown(scratch.scores, p.rows_per_block * padded);
  float* inverse_sums = grown(scratch.inverse_sums, p.rows_per_block);
  c10::BFloat16* q16 = grown(scratch.q, p.rows_per_block * e);
  c10::BFloat16* probabilities = grown(scratch.probabilities, p.rows_per_block * padded);
  c10::BFloat16* k_rows = grown(scratch.k_rows, padded * e);  // k's rows, or k^T's
  c10::BFloat16* k_pairs = grown(scratch.k_pairs, e * padded);
  c10::BFloat16* v_rows = grown(scratch.v_rows, padded * ev);
  c10::BFloat16* v_pairs = grown(scratch.v_pairs, padded * ev);
  // v's rows past the keys are 0: the probabilities there are 0, but 0 x NaN is not.
  std::fill(v_rows + p.keys * ev, v_rows + padded * ev, c10::BFloat16(0.0f));
  int64_t converted_head = -1;  // the (batch, head) whose k and v the buffers hold
  int64_t task = 0, run_end = 0;
  while (runs.next(first_worker, task, run_end)) {
    const Block block = block_of(p, task);
    const int64_t count = block.count;
    if (block.head_index != converted_head) {
      const float *k = block.k, *v = block.v;
      for (int64_t r = 0; r < p.keys; ++r) {
        round_to_bf16_avx512(v + r * p.v.ld, v_rows + r * ev, ev);
      }
      if (p.k.transposed) {
        // k stored as k^T (a key's values p.k.ld apart, the keys of one head-dim index
        // contiguous): those rows rounded, zeros past the keys, and paired as v's are.
        // Read as k's rows here, they were other keys' values: every score wrong.
        for (int64_t d = 0; d < e; ++d) {
          round_to_bf16_avx512(k + d * p.k.ld, k_rows + d * padded, p.keys);
          std::fill(k_rows + d * padded + p.keys, k_rows + (d + 1) * padded,
                    c10::BFloat16(0.0f));
        }
        pair_rows(k_rows, e, padded, reinterpret_cast<uint32_t*>(k_pairs));
      } else {
        for (int64_t r = 0; r < p.keys; ++r) {
          round_to_bf16_avx512(k + r * p.k.ld, k_rows + r * e, e);
        }
        // k^T's pairs: k's row r holds the pairs (r, 0..e/2), 32 bits each, which go to
        // column r of pair rows 0..e/2 (a transpose of 32-bit values).
        transpose(reinterpret_cast<const float*>(k_rows), e / 2, p.keys, e / 2,
                  reinterpret_cast<float*>(k_pairs), padded);
      }
      if (amx) {
        for (int64_t c = 0; c < ev; c += panel) {  // panel c at v_pairs + c * padded
          const int64_t width = std::min(panel, ev - c);
          at::native::cpublas::pack(padded, width, ev, width, at::kBFloat16, at::kBFloat16,
                                    v_rows + c, v_pairs + c * padded);
        }
      } else {
        pair_rows(v_rows, padded, ev, reinterpret_cast<uint32_t*>(v_pairs));
      }
      converted_head = block.head_index;
    }
    for (int64_t i = 0; i < count; ++i) {
      round_to_bf16_avx512(block.q + i * p.q.row_stride, q16 + i * e, e);
    }
    // The keys the block's rows attend (AMX's packed v is read whole: untried on part).
    const int64_t keys = amx ? p.keys : keys_of(p, task);
    const int64_t keys_padded = (keys + kLanes - 1) / kLanes * kLanes;
    pairs_gemm(amx, count, keys, e, q16, e, k_pairs, padded, scores, padded);
    exp_rows_bf16(scores, count, padded, mask_row(p, block, 0), p.mask_strides[2], p.scale,
                  keys, keys_padded, p.empty_row, inverse_sums, probabilities);
    for (int64_t c = 0; c < ev; c += panel) {  // the dot products' v is one panel
      const int64_t width = std::min(panel, ev - c);
      pairs_gemm(amx, count, width, keys_padded, probabilities, padded, v_pairs + c * padded,
                 width, block.out + c, p.out_row_stride);
    }
    normalize_rows(p, block, inverse_sums);
  }
  if (amx) {
    at::native::cpublas::brgemm_release(/*is_vnni=*/true);  // the thread's AMX tiles
  }
  scratch.trim();
}

// Per query row, 1 + its last key whose mask is not -inf (NaN counts: it must reach the
// output), where the mask is one for every (batch, head), varies by row and ends some
// row before the last key (a causal mask); else empty. Read once a call. Keys past a
// block's rows are then never multiplied: a NaN in v there no longer reaches those rows
// (0 x NaN), as PyTorch's CPU flash attention skips them with is_causal.
std::vector<int64_t> attended_keys(const Problem& p) {
  if (p.mask == nullptr || p.mask_strides[0] != 0 || p.mask_strides[1] != 0 ||
      p.mask_strides[2] == 0) {
    return {};
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> keys(p.rows);
  bool trimmed = false;
  for (int64_t i = 0; i < p.rows; ++i) {
    const float* row = p.mask + i * p.mask_strides[2];
    int64_t j = p.keys;
    while (j > 0 && row[j - 1] == kNegInf) {
      --j;
    }
    keys[i] = j;
    trimmed = trimmed || j < p.keys;
  }
  return trimmed ? keys : std::vector<int64_t>{};
}

// The fastest of `rounds` calls of `product`, in seconds (after one untimed call).
template <typename Product>
double fastest_call(const Product& product, int rounds) {
  product();
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < rounds; ++i) {
    const Stopwatch stopwatch;
    product();
    fastest = std::min(fastest, stopwatch.seconds());
  }
  return fastest;
}

// Whether bfloat16 products beat float32 ones on this CPU. AMX tiles do. AVX512-BF16's dot
// products run at twice the FMA rate on some CPUs and at half of it on others (Intel's
// without AMX), so one block's scores product (32 rows, 128 keys, 64 deep) is timed once
// both ways; bf16 must win by a fifth, the rounding of q, k, v and the probabilities'
// share of its call.
bool bf16_products_win() {
  if (has_amx_bf16()) {
    return true;
  }
  constexpr int64_t m = 32, n = 128, k = 64;
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  std::vector<c10::BFloat16> a16(m * k, c10::BFloat16(0.5f));
  std::vector<uint32_t> pairs(k / 2 * n, 0x3e803e80u);  // pairs of bfloat16 0.25
  constexpr int kRounds = 50;
  const double f32 = fastest_call([&] {
    brgemm_row_major(m, n, k, a.data(), k, b.data(), n, c.data(), n);
  }, kRounds);
  const double bf16 = fastest_call([&] {
    bf16_pairs_gemm(m, n, k, a16.data(), k, pairs.data(), n, c.data(), n);
  }, kRounds);
  return bf16 < 0.8 * f32;
}

}  // namespace

bool bf16_attention_supported() {
  // AVX512-BF16 for the rounding and the dot products (or AMX-BF16 tiles: bf16_amx).
  static const bool supported = has_cpu_feature("avx512_bf16") &&
                                has_cpu_feature("avx512bw") && has_cpu_feature("avx512vl");
  return supported;
}

bool bf16_attention_faster() {
  static const bool faster = bf16_attention_supported() && bf16_products_win();
  return faster;
}

void set_bf16_attention(Bf16Attention mode) { bf16_attention_mode.store(mode); }

void set_bf16_attention_amx(bool allowed) { bf16_amx_allowed.store(allowed); }

Bf16AttentionProducts::Bf16AttentionProducts(bool enabled, bool even_if_slower)
    : previous_(bf16_products) {
  const Bf16Attention mode = bf16_attention_mode.load(std::memory_order_relaxed);
  bf16_products = enabled && mode != Bf16Attention::kNever &&
                  (even_if_slower || mode == Bf16Attention::kAlways || bf16_attention_faster());
}

Bf16AttentionProducts::~Bf16AttentionProducts() { bf16_products = previous_; }

bool fused_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double scale,
                         bool zero_masked_rows, at::Tensor& out) {
  if (q.dim() != 4 || q.scalar_type() != at::kFloat ||
      k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat ||
      out.scalar_type() != at::kFloat) {
    return false;
  }
  Problem p;
  p.heads = q.size(1);
  p.rows = q.size(2);
  p.keys = k.size(2);
  p.head_dim = q.size(3);
  p.value_dim = v.size(3);
  if (q.numel() == 0 || out.numel() == 0 || p.keys == 0 || !fits_int(p.rows) ||
      !fits_int(p.keys + kLanes) || !fits_int(p.head_dim) || !fits_int(p.value_dim) ||
      !as_matrix(q, &p.q) || !as_matrix(k, &p.k) || !as_matrix(v, &p.v) ||
      (out.stride(3) != 1 && p.value_dim != 1) || out.stride(2) < p.value_dim ||
      !fits_int(out.stride(2))) {
    return false;
  }
  p.microkernel = !p.q.transposed && !p.v.transposed;
  p.bf16 = bf16_products && p.microkernel && p.head_dim % 2 == 0 && bf16_attention_supported();
  if (!p.microkernel && fortran_sgemm() == nullptr) {
    return false;
  }
  p.out = out.data_ptr<float>();
  p.out_batch_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.out_row_stride = out.stride(2);
  if (mask.has_value()) {
    const at::Tensor& m = *mask;
    if (m.scalar_type() != at::kFloat || m.dim() != 4 || m.size(3) != p.keys ||
        (m.stride(3) != 1 && p.keys != 1)) {
      return false;
    }
    p.mask = m.data_ptr<float>();
    for (int64_t d = 0; d < 3; ++d) {
      p.mask_strides[d] = m.size(d) == 1 ? 0 : m.stride(d);
    }
  }
  p.scale = static_cast<float>(scale);
  p.empty_row = zero_masked_rows ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  p.rows_per_block =
      std::min(p.rows, std::max(kMinRowsPerBlock, kScoresPerBlock / p.keys));
  const std::vector<int64_t> row_keys = attended_keys(p);
  if (!row_keys.empty()) {
    p.rows_per_block = std::min(p.rows_per_block, kTrimmedRowsPerBlock);
  }
  p.blocks_per_head = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
  if (!row_keys.empty()) {
    p.block_keys.assign(p.blocks_per_head, 1);  // at least one key (an empty row's)
    for (int64_t i = 0; i < p.rows; ++i) {
      int64_t& keys = p.block_keys[i / p.rows_per_block];
      keys = std::max(keys, row_keys[i]);
    }
  }
  p.batches = q.size(0);
  // One range element per worker, at most one per block (TaskRuns' runs). Each takes its
  // own run of blocks, head by head (so each head's k and v are converted by one thread,
  // once), then the other runs' last blocks: with one shared counter the threads took
  // alternate blocks, and each converted almost every head again (GPT-block int8: the
  // rounding to bfloat16 was 6% of the engine's samples).
  TaskRuns runs(p.batches * p.heads * p.blocks_per_head, at::get_num_threads());
  void* arguments[] = {&p, &runs};
  run_parallel_tasks(runs.runs(), 1, p.bf16 ? &run_blocks_bf16 : &run_blocks, arguments);
  return true;
}

}  // namespace blade::ral
