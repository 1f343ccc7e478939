// AMX-INT8 block product (int8_amx.h).
#include "ral/int8_amx.h"

#include "ral/cpu_features.h"

#include <ATen/native/CPUBlas.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace blade::ral {
namespace {

// Tiles: C00 C01 C10 C11 (int32, 16 x 16 each: two row groups by two column groups), A0 A1
// (each row group's 16 rows by 64 bytes of depth), B0 B1 (each column group's 16 groups of
// 4 depth units by 16 columns). 2 x 2 results per 2 + 2 loads, so the loads keep up with
// the products.
constexpr int64_t kGroupRows = kAmxTileRows;
constexpr int64_t kGroupColumns = 16;
constexpr int64_t kAccStride = 64 * sizeof(int32_t);  // acc's rows: 64 columns
constexpr int64_t kWeightStride = 64;                 // a B tile's row: 16 columns x 4 bytes
constexpr int64_t kWeightTile = 16 * kWeightStride;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The configuration loaded on this thread: rows of the first and second row groups
// (0: none loaded).
thread_local int loaded_rows0 = 0;
thread_local int loaded_rows1 = 0;

__attribute__((target("amx-tile,amx-int8"))) void configure(int rows0, int rows1) {
  if (rows0 == loaded_rows0 && rows1 == loaded_rows1) {
    return;
  }
  TileConfig config;
  const auto set = [&config](int tile, int rows, int bytes) {
    config.rows[tile] = static_cast<uint8_t>(rows);
    config.colsb[tile] = static_cast<uint16_t>(rows > 0 ? bytes : 0);
  };
  set(0, rows0, 64);
  set(1, rows0, 64);
  set(2, rows1, 64);
  set(3, rows1, 64);
  set(4, rows0, 64);
  set(5, rows1, 64);
  set(6, kAmxDepthStep / 4, 64);
  set(7, kAmxDepthStep / 4, 64);
  // Not _tile_loadconfig: GCC 12's names only the first 8 bytes as the memory it reads,
  // so the compiler left the rest of the configuration unwritten.
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
  loaded_rows0 = rows0;
  loaded_rows1 = rows1;
}

// Lines to fetch into L2, `per_step` of them a depth step.
struct Fetch {
  const char* line = nullptr;
  const char* end = nullptr;
  int64_t per_step = 0;

  __attribute__((always_inline)) void step() {
    for (int64_t i = 0; i < per_step && line < end; ++i, line += 64) {
      _mm_prefetch(line, _MM_HINT_T1);
    }
  }
};

// One block of up to 32 rows by up to 32 columns over every tap and the depth, stored to
// c (rows kAccStride apart).
template <bool kTwoRows, bool kTwoColumns>
__attribute__((target("amx-tile,amx-int8"))) void tile_block(const uint8_t* a, int64_t lda,
                                                              int64_t kpad,
                                                              const int64_t* tap_offsets,
                                                              int64_t taps, const int8_t* b,
                                                              int32_t* c, Fetch& fetch) {
  // The asm statements name no memory they read: what wrote the rows and the weight must
  // be done first.
  __asm__ volatile("" ::: "memory");
  _tile_zero(0);
  if (kTwoColumns) {
    _tile_zero(1);
  }
  if (kTwoRows) {
    _tile_zero(2);
    if (kTwoColumns) {
      _tile_zero(3);
    }
  }
  const int64_t second = kGroupRows * lda;
  const int8_t* w = b;  // the pair's tiles, in order (amx_weight_index)
  for (int64_t t = 0; t < taps; ++t) {
    const uint8_t* rows = a + tap_offsets[t];
    for (int64_t k = 0; k < kpad; k += kAmxDepthStep, w += 2 * kWeightTile) {
      fetch.step();
      _tile_loadd(4, rows + k, lda);
      _tile_loadd(6, w, kWeightStride);
      _tile_dpbusd(0, 4, 6);
      if (kTwoColumns) {
        _tile_loadd(7, w + kWeightTile, kWeightStride);
        _tile_dpbusd(1, 4, 7);
      }
      if (kTwoRows) {
        _tile_loadd(5, rows + second + k, lda);
        _tile_dpbusd(2, 5, 6);
        if (kTwoColumns) {
          _tile_dpbusd(3, 5, 7);
        }
      }
    }
  }
  _tile_stored(0, c, kAccStride);
  if (kTwoColumns) {
    _tile_stored(1, c + kGroupColumns, kAccStride);
  }
  if (kTwoRows) {
    int32_t* lower = c + kGroupRows * 64;
    _tile_stored(2, lower, kAccStride);
    if (kTwoColumns) {
      _tile_stored(3, lower + kGroupColumns, kAccStride);
    }
  }
}

}  // namespace

void amx_int8_block(const uint8_t* a, int64_t rows, int64_t lda, int64_t kpad,
                    const int64_t* tap_offsets, int64_t taps, const int8_t* b, int64_t columns,
                    int32_t* acc, const char* fetch_begin, const char* fetch_end) {
  Fetch fetch;
  if (fetch_begin != nullptr && fetch_end > fetch_begin) {
    const int64_t steps = (rows + 2 * kGroupRows - 1) / (2 * kGroupRows) *
                          ((columns + 2 * kGroupColumns - 1) / (2 * kGroupColumns)) * taps *
                          (kpad / kAmxDepthStep);
    const int64_t lines = (fetch_end - fetch_begin + 63) / 64;
    fetch = {fetch_begin, fetch_end, (lines + steps - 1) / steps};
  }
  for (int64_t m = 0; m < rows; m += 2 * kGroupRows) {
    const int64_t left = rows - m;
    const int rows0 = static_cast<int>(std::min(kGroupRows, left));
    const int rows1 = static_cast<int>(std::clamp<int64_t>(left - kGroupRows, 0, kGroupRows));
    configure(rows0, rows1);
    const uint8_t* a_m = a + m * lda;
    int32_t* c_m = acc + m * 64;
    for (int64_t n = 0; n < columns; n += 2 * kGroupColumns) {
      const bool two_columns = columns - n > kGroupColumns;
      const int8_t* b_n = b + n / (2 * kGroupColumns) * taps * kpad * 2 * kGroupColumns;
      if (rows1 > 0) {
        (two_columns ? tile_block<true, true> : tile_block<true, false>)(
            a_m, lda, kpad, tap_offsets, taps, b_n, c_m + n, fetch);
      } else {
        (two_columns ? tile_block<false, true> : tile_block<false, false>)(
            a_m, lda, kpad, tap_offsets, taps, b_n, c_m + n, fetch);
      }
    }
  }
}

// PyTorch's brgemm keeps which configuration it loaded per thread, so its release is
// called after the tiles replaced it (it does nothing where PyTorch's oneDNN has no
// microkernel, or oneDNN runs without AMX); the tiles' own release then always runs.
__attribute__((target("amx-tile"))) void amx_int8_release() {
  at::native::cpublas::brgemm_release(true);
  _tile_release();
  loaded_rows0 = 0;
  loaded_rows1 = 0;
}

namespace {

// Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); without it the first tile instruction faults.
bool tile_state_granted() {
  constexpr long kRequestPermission = 0x1023;
  constexpr long kTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

// The kernel against a plain loop on shapes with row and column tails, depths that are no
// multiple of 64 and several taps.
bool kernel_works() {
  struct Shape {
    int64_t rows, depth, taps, columns;
  };
  for (const Shape& s : {Shape{5, 4, 1, 16}, Shape{37, 196, 2, 48}, Shape{16, 64, 9, 64},
                         Shape{128, 516, 3, 64}, Shape{20, 8, 1, 32}}) {
    const int64_t kpad = amx_padded_depth(s.depth), lda = s.depth + 4;
    std::vector<int64_t> offsets(s.taps);
    for (int64_t t = 0; t < s.taps; ++t) {
      offsets[t] = t * 3 * lda;
    }
    std::vector<uint8_t> a(offsets.back() + s.rows * lda + kAmxSlack);
    std::vector<int8_t> b(s.taps * kpad * 64, 0);
    const auto at = [&](int64_t t, int64_t k, int64_t j) {
      return amx_weight_index(j, t, k, s.taps, kpad);
    };
    uint32_t state = 2463534242u;
    const auto next = [&state] {
      state ^= state << 13;
      state ^= state >> 17;
      state ^= state << 5;
      return state;
    };
    for (auto& value : a) {
      value = static_cast<uint8_t>(next());
    }
    for (int64_t t = 0; t < s.taps; ++t) {
      for (int64_t k = 0; k < s.depth; ++k) {
        for (int64_t j = 0; j < s.columns; ++j) {
          b[at(t, k, j)] = static_cast<int8_t>(next());
        }
      }
    }
    std::vector<int32_t> acc(s.rows * 64, -1);
    amx_int8_block(a.data(), s.rows, lda, kpad, offsets.data(), s.taps, b.data(), s.columns,
                   acc.data());
    amx_int8_release();
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t j = 0; j < s.columns; ++j) {
        int32_t want = 0;
        for (int64_t t = 0; t < s.taps; ++t) {
          for (int64_t k = 0; k < s.depth; ++k) {
            want += static_cast<int32_t>(a[offsets[t] + r * lda + k]) * b[at(t, k, j)];
          }
        }
        if (acc[r * 64 + j] != want) {
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace

bool amx_int8_runs() {
  // The epilogue after the tiles is AVX-512 code.
  static const bool runs = has_cpu_feature("amx_tile") && has_cpu_feature("amx_int8") &&
                           has_cpu_feature("avx512f") && has_cpu_feature("avx512bw") &&
                           has_cpu_feature("avx512vl") && tile_state_granted() && kernel_works();
  return runs;
}

}  // namespace blade::ral
