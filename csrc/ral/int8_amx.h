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

// acc[r * 64 + j] = sum over taps t and depth k < kpad of
//   a[tap_offsets[t] + r * lda + k] * weight_t[k][j]      for r < rows, j < columns,
// where weight_t (tap t at b + t * kpad * 64) holds kpad / 4 groups of 4 depth units by 64
// columns, each column's 4 bytes together (VNNI's layout, zeros past the real depth).
// `columns` is a multiple of 16, at most 64; kpad a multiple of kAmxDepthStep. The tiles'
// configuration is loaded by the first call on a thread; amx_int8_release ends it.
void amx_int8_block(const uint8_t* a, int64_t rows, int64_t lda, int64_t kpad,
                    const int64_t* tap_offsets, int64_t taps, const int8_t* b, int64_t columns,
                    int32_t* acc);
// Gives the thread's tile state back after its blocks (and tells PyTorch's brgemm, whose
// configuration the tiles' replaced).
void amx_int8_release();

}  // namespace blade::ral
