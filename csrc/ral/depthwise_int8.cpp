// Depthwise convolutions of uint8 NHWC data by VNNI dot products (depthwise_int8.h).
#include "ral/depthwise_int8.h"

#include "ral/conv_planes.h"
#include "ral/cpu_features.h"
#include "ral/int8_epilogue.h"
#include "ral/lane_masks.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <vector>

namespace blade::ral {
namespace {

// GCC 12 warns inside its own intrinsics' headers here (their _mm512_undefined), not about
// this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

constexpr int64_t kBlock = 64;         // channels of a task: one vector of bytes
constexpr int kPixels = 8;             // output pixels of a row summed at once
constexpr int kPhases = 4;             // where a window's first row lies in its quad
constexpr int kQuads = 2;              // quads a window of at most 5 rows spans
constexpr int64_t kColumnBytes = 256;  // a quad's column: 4 vectors of 16 channels x 4 rows
constexpr int64_t kMaxQuads = 8;       // of a task's band (its buffer stays in L2)
// The most bytes of interleaved rows a thread keeps between calls (a wider image's are
// made per call, not held for the thread's life).
constexpr int64_t kKeptBytes = int64_t{1} << 20;

// A block's pack: [phase][quad][kw][vector][64 bytes], then the int32 sums of each
// channel's filter (64, in channel order).
int64_t block_bytes(int64_t kw) {
  return kPhases * kQuads * kw * kColumnBytes + kBlock * 4;
}

struct Job {
  const uint8_t* x;
  int64_t n, h, w, c, kh, kw, sh, sw, ph, pw, oh, ow;
  const int8_t* pack;
  const float* bias;
  DepthwisePostOp post_op;
  DepthwiseRanges ranges;
  float* y;
  int64_t rows;     // output rows of a task's band
  int64_t columns;  // of a quad: the whole groups of kPixels outputs' columns
};

// The permutations' indices (interleave): for each half h of the operands, element i of
// the first operand's half h, then the second's (its elements counted from 2 * kHalf),
// side by side.
template <typename T, int kHalf>
constexpr std::array<std::array<T, 2 * kHalf>, 2> side_by_side() {
  std::array<std::array<T, 2 * kHalf>, 2> index{};
  for (int half = 0; half < 2; ++half) {
    for (int i = 0; i < kHalf; ++i) {
      index[half][2 * i] = static_cast<T>(kHalf * half + i);
      index[half][2 * i + 1] = static_cast<T>(2 * kHalf + kHalf * half + i);
    }
  }
  return index;
}
constexpr auto kPairs = side_by_side<uint8_t, 32>();       // bytes of rows 0 and 1 (2 and 3)
constexpr auto kQuadWords = side_by_side<uint16_t, 16>();  // their pairs' words

struct alignas(64) Column {
  uint8_t bytes[kColumnBytes];
};

// Rows [first, first + 4 * quads) of image b, channels [ch, ch + 64) under `mask`,
// interleaved into `out` (quad by quad, column by column: `columns` of them from the
// padding's first), the zero point wherever no byte of the image is. A column's vector v
// holds the 4 rows of channel 16 * v + t in its dword t: the block's channels in order, so
// that a block's last vectors past its last channel need not be summed.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void interleave(const Job& job, int64_t b,
                                                            int64_t first, int64_t quads,
                                                            int64_t ch, __mmask64 mask,
                                                            Column* out) {
  const __m512i zero_point = _mm512_set1_epi8(static_cast<char>(job.ranges.zero_point));
  // Channel c of rows 0 and 1 side by side (c < 32, then the others), and the pairs' words
  // of 16 channels of rows 0 and 1 and of rows 2 and 3 side by side.
  const __m512i pair_low = _mm512_loadu_si512(kPairs[0].data());
  const __m512i pair_high = _mm512_loadu_si512(kPairs[1].data());
  const __m512i quad_low = _mm512_loadu_si512(kQuadWords[0].data());
  const __m512i quad_high = _mm512_loadu_si512(kQuadWords[1].data());
  const uint8_t* image = job.x + b * job.h * job.w * job.c + ch;
  for (int64_t q = 0; q < quads; ++q) {
    const uint8_t* row[4];
    for (int r = 0; r < 4; ++r) {
      const int64_t iy = first + 4 * q + r;
      row[r] = iy >= 0 && iy < job.h ? image + iy * job.w * job.c : nullptr;
    }
    Column* line = out + q * job.columns;
    for (int64_t col = 0; col < job.columns; ++col) {
      const int64_t ix = col - job.pw;
      const bool inside = ix >= 0 && ix < job.w;
      __m512i v[4];
      for (int r = 0; r < 4; ++r) {
        v[r] = inside && row[r] != nullptr
                   ? _mm512_mask_loadu_epi8(zero_point, mask, row[r] + ix * job.c)
                   : zero_point;
      }
      const __m512i low01 = _mm512_permutex2var_epi8(v[0], pair_low, v[1]);
      const __m512i high01 = _mm512_permutex2var_epi8(v[0], pair_high, v[1]);
      const __m512i low23 = _mm512_permutex2var_epi8(v[2], pair_low, v[3]);
      const __m512i high23 = _mm512_permutex2var_epi8(v[2], pair_high, v[3]);
      __m512i* to = reinterpret_cast<__m512i*>(line[col].bytes);
      _mm512_store_si512(to, _mm512_permutex2var_epi16(low01, quad_low, low23));
      _mm512_store_si512(to + 1, _mm512_permutex2var_epi16(low01, quad_high, low23));
      _mm512_store_si512(to + 2, _mm512_permutex2var_epi16(high01, quad_low, high23));
      _mm512_store_si512(to + 3, _mm512_permutex2var_epi16(high01, quad_high, high23));
    }
  }
}

// A block's per-channel values, vector by vector.
struct Constants {
  int vectors;  // those holding channels of the image
  __m512 scale[4], bias[4];
  __m512i start[4];  // minus the zero point times the filter's sum
  __m512 out_inverse, out_zero_point;
};

__attribute__((target("avx512f"))) Constants block_constants(const Job& job, int64_t block) {
  const DepthwiseRanges& r = job.ranges;
  const int64_t ch = block * kBlock;
  const int32_t* sums =
      reinterpret_cast<const int32_t*>(job.pack + block * block_bytes(job.kw) +
                                       kPhases * kQuads * job.kw * kColumnBytes);
  Constants k;
  k.vectors = static_cast<int>(std::min<int64_t>(4, (job.c - ch + 15) / 16));
  for (int v = 0; v < 4; ++v) {
    const __mmask16 mask = lanes_left(job.c - ch - 16 * v);
    const int64_t at = ch + 16 * v;
    k.scale[v] = _mm512_mul_ps(
        _mm512_set1_ps(r.scale), r.channel_scale != nullptr
                                     ? _mm512_maskz_loadu_ps(mask, r.channel_scale + at)
                                     : _mm512_set1_ps(1.0f));
    k.bias[v] = job.bias != nullptr ? _mm512_maskz_loadu_ps(mask, job.bias + at)
                                    : _mm512_setzero_ps();
    k.start[v] = _mm512_mullo_epi32(_mm512_load_si512(sums + 16 * v),
                                    _mm512_set1_epi32(-r.zero_point));
  }
  k.out_inverse = _mm512_set1_ps(1.0f / r.out_scale);
  k.out_zero_point = _mm512_set1_ps(static_cast<float>(r.out_zero_point));
  return k;
}

// One output row's pixels [ox, ox + kPixels) for vector v of the block: the dot products of
// the quads `quad` (the window's first) on, each column loaded once for the filter columns
// that read it (S: the column stride, 0 where it is none of 1 and 2), then finished: stored
// at `to` (float32, pixel p at to + p * c) or, for uint8 results, put in `tile` in the
// result's units.
template <int KW, int S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"),
               always_inline)) inline void sum_vector(
    const Job& job, const Column* quads, int64_t quad, int quads_read, const int8_t* filters,
    int64_t ox, int64_t pixels, int v, const Constants& k, float* to, __mmask16 mask,
    __m512 (*tile)[4]) {
  __m512i acc[kPixels];
#pragma GCC unroll 8
  for (int p = 0; p < kPixels; ++p) {
    acc[p] = k.start[v];
  }
  for (int qi = 0; qi < quads_read; ++qi) {
    __m512i f[KW];
#pragma GCC unroll 5
    for (int j = 0; j < KW; ++j) {
      f[j] = _mm512_load_si512(filters + ((qi * KW + j) * 4 + v) * 64);
    }
    const Column* line = quads + (quad + qi) * job.columns;
    if constexpr (S == 0) {
      for (int p = 0; p < kPixels; ++p) {
#pragma GCC unroll 5
        for (int j = 0; j < KW; ++j) {
          const __m512i in = _mm512_load_si512(line[(ox + p) * job.sw + j].bytes + v * 64);
          acc[p] = _mm512_dpbusd_epi32(acc[p], in, f[j]);
        }
      }
    } else {
      const Column* from = line + ox * S;
#pragma GCC unroll 24
      for (int col = 0; col < (kPixels - 1) * S + KW; ++col) {
        const __m512i in = _mm512_load_si512(from[col].bytes + v * 64);
#pragma GCC unroll 5
        for (int j = 0; j < KW; ++j) {
          const int d = col - j;
          if (d >= 0 && d % S == 0 && d / S < kPixels) {
            acc[d / S] = _mm512_dpbusd_epi32(acc[d / S], in, f[j]);
          }
        }
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int p = 0; p < kPixels; ++p) {
    __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[p]), k.scale[v], k.bias[v]);
    if (job.post_op == DepthwisePostOp::kRelu) {
      sum = _mm512_max_ps(zero, sum);  // vmaxps returns its second operand for a NaN
    } else if (job.post_op == DepthwisePostOp::kHardswish) {
      sum = hardswish_units(sum, _mm512_set1_ps(1.0f), zero);
    }
    if (job.ranges.out_u8 != nullptr) {
      tile[p][v] = _mm512_fmadd_ps(sum, k.out_inverse, k.out_zero_point);
    } else if (p < pixels) {
      _mm512_mask_storeu_ps(to + p * job.c, mask, sum);
    }
  }
}

// Output row oy of image b, the block's channels: `quads` holds its band's interleaved rows
// from the band's first window, `t` rows of the band before it.
template <int KW, int S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void output_row(
    const Job& job, const Column* quads, int64_t t, int64_t b, int64_t oy, int64_t block,
    const Constants& k) {
  const int64_t first = t * job.sh;
  const int phase = static_cast<int>(first % 4);
  const int quads_read = (phase + static_cast<int>(job.kh) + 3) / 4;
  const int8_t* filters =
      job.pack + block * block_bytes(KW) + phase * kQuads * KW * kColumnBytes;
  const int64_t ch = block * kBlock;
  const int64_t out_pixel = (b * job.oh + oy) * job.ow;
  const __mmask64 bytes_mask = bytes_left(job.c - ch);
  __m512 tile[kPixels][4];  // uint8 results: vectors past k.vectors are never read
  for (int64_t ox = 0; ox < job.ow; ox += kPixels) {
    const int64_t pixels = std::min<int64_t>(kPixels, job.ow - ox);
    float* to = job.y != nullptr ? job.y + (out_pixel + ox) * job.c + ch : nullptr;
    for (int v = 0; v < k.vectors; ++v) {
      sum_vector<KW, S>(job, quads, first / 4, quads_read, filters, ox, pixels, v, k,
                        to != nullptr ? to + 16 * v : nullptr,
                        lanes_left(job.c - ch - 16 * v), tile);
    }
    if (job.ranges.out_u8 == nullptr) {
      continue;
    }
    uint8_t* out = job.ranges.out_u8 + (out_pixel + ox) * job.c + ch;
    for (int64_t p = 0; p < pixels; ++p) {
      if (k.vectors == 4) {
        _mm512_mask_storeu_epi8(out + p * job.c, bytes_mask,
                                uint8_pack64(tile[p], _mm512_setzero_si512()));
        continue;
      }
      for (int v = 0; v < k.vectors; ++v) {  // a block's last vectors, 16 bytes each
        _mm_mask_storeu_epi8(out + p * job.c + 16 * v, lanes_left(job.c - ch - 16 * v),
                             _mm512_cvtepi32_epi8(uint8_steps(tile[p][v], _mm512_setzero_ps())));
      }
    }
  }
}

template <int KW, int S>
void convolve(const Job& job) {
  const int64_t blocks = (job.c + kBlock - 1) / kBlock;
  const int64_t bands = (job.oh + job.rows - 1) / job.rows;
  const int64_t quads = ((job.rows - 1) * job.sh + job.kh - 1) / 4 + 1;
  at::parallel_for(0, job.n * bands * blocks, 1, [&](int64_t begin, int64_t end) {
    at::Tensor large;  // the buffer past kKeptBytes, for this call only
    Column* buffer = planes_buffer<Column>(quads * job.columns, kKeptBytes, large);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task % blocks;
      const int64_t band = task / blocks % bands;
      const int64_t b = task / blocks / bands;
      const int64_t ch = block * kBlock;
      const int64_t oy0 = band * job.rows;
      const int64_t oy1 = std::min(job.oh, oy0 + job.rows);
      const int64_t used = ((oy1 - oy0 - 1) * job.sh + job.kh - 1) / 4 + 1;
      interleave(job, b, oy0 * job.sh - job.ph, used, ch, bytes_left(job.c - ch), buffer);
      const Constants k = block_constants(job, block);
      for (int64_t oy = oy0; oy < oy1; ++oy) {
        output_row<KW, S>(job, buffer, oy - oy0, b, oy, block, k);
      }
    }
  });
}

#pragma GCC diagnostic pop

template <int KW>
void convolve_by_stride(const Job& job) {
  if (job.sw == 1) {
    convolve<KW, 1>(job);
  } else if (job.sw == 2) {
    convolve<KW, 2>(job);
  } else {
    convolve<KW, 0>(job);
  }
}

}  // namespace

bool depthwise_int8_available() {
  static const bool available = has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                                has_cpu_feature("avx512vl") && has_cpu_feature("avx512vbmi") &&
                                has_cpu_feature("avx512_vnni");
  return available;
}

namespace {
std::atomic<bool> enabled{true};
}  // namespace

bool depthwise_int8_chosen(int64_t channels) {
  return channels > 16 && depthwise_int8_available() && enabled.load(std::memory_order_relaxed);
}

void set_depthwise_int8_enabled(bool value) { enabled.store(value, std::memory_order_relaxed); }

at::Tensor pack_depthwise_int8(const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 4 && weight.size(1) == 1 &&
                  depthwise_conv_takes(weight.size(2), weight.size(3)),
              "pack_depthwise_int8: expected an int8 [C, 1, 3, 3] or [C, 1, 5, 5] weight, got ",
              weight.scalar_type(), weight.sizes());
  const int64_t c = weight.size(0);
  const int64_t kh = weight.size(2);
  const int64_t kw = weight.size(3);
  const int64_t blocks = (c + kBlock - 1) / kBlock;
  const at::Tensor w = weight.contiguous();
  const int8_t* from = w.const_data_ptr<int8_t>();
  at::Tensor packed = at::zeros({blocks * block_bytes(kw)}, at::kChar);
  int8_t* to = packed.data_ptr<int8_t>();
  for (int64_t block = 0; block < blocks; ++block) {
    int8_t* base = to + block * block_bytes(kw);
    for (int64_t phase = 0; phase < kPhases; ++phase) {
      for (int64_t quad = 0; quad < kQuads; ++quad) {
        for (int64_t j = 0; j < kw; ++j) {
          for (int64_t v = 0; v < 4; ++v) {
            int8_t* vector = base + (((phase * kQuads + quad) * kw + j) * 4 + v) * 64;
            for (int64_t t = 0; t < 16; ++t) {
              const int64_t ch = block * kBlock + 16 * v + t;
              for (int64_t r = 0; r < 4; ++r) {
                const int64_t i = 4 * quad + r - phase;  // the filter row at byte r
                if (ch < c && i >= 0 && i < kh) {
                  vector[4 * t + r] = from[(ch * kh + i) * kw + j];
                }
              }
            }
          }
        }
      }
    }
    int32_t* sums = reinterpret_cast<int32_t*>(base + kPhases * kQuads * kw * kColumnBytes);
    for (int64_t i = 0; i < kBlock && block * kBlock + i < c; ++i) {
      const int8_t* filter = from + (block * kBlock + i) * kh * kw;
      int32_t sum = 0;
      for (int64_t tap = 0; tap < kh * kw; ++tap) {
        sum += filter[tap];
      }
      sums[i] = sum;
    }
  }
  return packed;
}

bool depthwise_conv2d_int8(const uint8_t* x, int64_t n, int64_t h, int64_t w, int64_t c,
                           const at::Tensor& packed, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t ph, int64_t pw, const float* bias,
                           DepthwisePostOp post_op, const DepthwiseRanges& ranges, float* y,
                           int64_t oh, int64_t ow) {
  const int64_t blocks = (c + kBlock - 1) / kBlock;
  if (!depthwise_int8_available() || !depthwise_conv_takes(kh, kw) || kh != kw || n <= 0 ||
      h <= 0 || w <= 0 || c <= 0 || oh <= 0 || ow <= 0 || sh <= 0 || sw <= 0 || ph < 0 ||
      pw < 0 || packed.scalar_type() != at::kChar || !packed.is_contiguous() ||
      packed.numel() != blocks * block_bytes(kw) ||
      reinterpret_cast<uintptr_t>(packed.const_data_ptr()) % 64 != 0 ||
      post_op == DepthwisePostOp::kSilu) {  // float32 data's post-op only
    return false;
  }
  Job job{x, n, h, w, c, kh, kw, sh, sw, ph, pw, oh, ow, packed.const_data_ptr<int8_t>(),
          bias, post_op, ranges, y, 1, 0};
  // Bands of output rows: about 8 tasks a thread, each band's quads few enough for L2.
  const int64_t groups = (ow + kPixels - 1) / kPixels;
  job.columns = (groups * kPixels - 1) * sw + kw;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  job.rows = std::clamp<int64_t>((n * oh * blocks + 8 * threads - 1) / (8 * threads), 1, oh);
  while (job.rows > 1 && ((job.rows - 1) * sh + kh - 1) / 4 + 1 > kMaxQuads) {
    --job.rows;
  }
  if (kw == 3) {
    convolve_by_stride<3>(job);
  } else {
    convolve_by_stride<5>(job);
  }
  return true;
}

}  // namespace blade::ral
