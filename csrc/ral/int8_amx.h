// Blade's AMX-INT8 block product for the int8 convolution (int8_conv.h): a block of GEMM
// rows by up to 64 output channels accumulated over every filter tap and the whole depth
// in AMX tiles, stored once as int32 for the epilogue. oneDNN's microkernel (PyTorch's
// cpublas::brgemm) takes one tap per call and adds into the int32 block in memory, so a
// 3x3 layer of 64 channels wrote and read its block 9 times for 64 bytes of depth each.
#pragma once

#include <cstdint>

namespace blade::ral {

// The depth a tap's weight is padded to for the tiles: whole 64-byte tile rows. A row's
// last tile reads up to 60 bytes past its depth (whatever follows: the next pixel, or
// slack), which the weight's zero rows there cancel.
constexpr int64_t kAmxDepthStep = 64;
// A tile's rows; the kernel runs two tiles of rows by two of 16 columns at a time.
constexpr int64_t kAmxTileRows = 16;
// Bytes a buffer of rows needs past its last row for that over-read.
constexpr int64_t kAmxSlack = kAmxDepthStep;

inline int64_t amx_padded_depth(int64_t depth) {
  return (depth + kAmxDepthStep - 1) / kAmxDepthStep * kAmxDepthStep;
}

// Whether the tiles run in this process: the CPU has AMX-INT8, Linux granted the tile
// state (asked once), and the kernel gave a plain loop's sums on a few shapes.
bool amx_int8_runs();

// Where weight byte (column `lane` < 64, tap, depth k) of a 64-column block lies in the
// tiles' layout: each B tile (16 columns by 64 bytes of depth: 16 rows of 4 depth units by
// 16 columns, each column's 4 bytes together, VNNI's layout) is 1 KB in one piece, and a
// pair of 32 columns holds its two tiles per depth step, every tap and step in order, so
// a block's product reads its weight front to back (a 64-column row 256 bytes wide had
// each tile touch 16 lines 256 bytes apart, which the tiles waited for).
inline int64_t amx_weight_index(int64_t lane, int64_t tap, int64_t k, int64_t taps,
                                int64_t kpad) {
  const int64_t steps = kpad / kAmxDepthStep;
  const int64_t tile = ((lane / 32 * taps + tap) * steps + k / kAmxDepthStep) * 2 + lane / 16 % 2;
  return (tile * 16 + k % kAmxDepthStep / 4) * 64 + lane % 16 * 4 + k % 4;
}

// acc[r * 64 + j] = sum over taps t and depth k < kpad of
//   a[tap_offsets[t] + r * lda + k] * weight[t][k][j]      for r < rows, j < columns,
// the weight a block of 64 columns at b as amx_weight_index lays it out (zeros past the
// real depth and columns). `columns` is a multiple of 16, at most 64; kpad a multiple of
// kAmxDepthStep. The tiles' configuration is loaded by the first call on a thread;
// amx_int8_release ends it.
// [fetch, fetch_end) (may be empty): bytes to bring into L2 meanwhile, spread over the
// block's depth steps (the thread's next weight block, read next from memory otherwise:
// the tiles waited for each block's first pass over its weight).
void amx_int8_block(const uint8_t* a, int64_t rows, int64_t lda, int64_t kpad,
                    const int64_t* tap_offsets, int64_t taps, const int8_t* b, int64_t columns,
                    int32_t* acc, const char* fetch = nullptr, const char* fetch_end = nullptr);
// Gives the thread's tile state back after its blocks (and tells PyTorch's brgemm, whose
// configuration the tiles' replaced).
void amx_int8_release();

}  // namespace blade::ral
