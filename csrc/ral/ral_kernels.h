// Library calls from generated code into PyTorch's own CPU kernels (MKL / oneDNN), and the
// memref helpers MLIR's lowering expects from a runtime.
//
// Each memref argument arrives as an unranked memref: its rank and a pointer to its
// descriptor {allocated, aligned, offset, sizes[rank], strides[rank]}. None of them throws;
// a failure is recorded for the calling thread and the engine that made the call discards
// the results and runs its TorchScript fallback instead (kernel_errors.h).
//
// Defined by kernel family: matmul_kernels.cpp, conv_kernels.cpp, attention_kernels.cpp,
// sort_kernels.cpp, copy_kernels.cpp (memrefCopy) and kernel_errors.cpp (the errors
// generated code reports), each call's operands handled alike (library_call.h).
#pragma once

#include <cstdint>

extern "C" {

struct BladeUnrankedMemRef {
  int64_t rank;
  void* descriptor;
};

// Generated code calls this when an index read from a tensor (a gather's) is outside
// [0, size): the engine then runs its TorchScript fallback, whose op raises PyTorch's error.
void blade_ral_index_out_of_range(int64_t index, int64_t size);

// Generated code calls this when an integer division or remainder meets a zero divisor
// (PyTorch raises ZeroDivisionError): the engine then runs its fallback, which raises it.
void blade_ral_division_by_zero();

// MLIR's `memref.copy` between non-contiguous memrefs lowers to this call.
void memrefCopy(int64_t element_size, BladeUnrankedMemRef* source,
                BladeUnrankedMemRef* target);

// Generated code declares `func.func private @blade_ral_matmul_f32(memref<*xf32>, ...)`; the
// LLVM lowering passes each unranked memref as two arguments, its rank and a pointer to its
// descriptor (BLADE_RAL_MEMREF below). One symbol per element type: f32, f64, f16, bf16.
// Each writes all of `out`. Which ops they replace: python/blade/codegen/kernels/matmul.py,
// convolution.py, attention.py and sort.py.
//
// matmul: out = a @ b, or a @ b^T when `transpose_b`; batch dims broadcast as in
// torch.matmul (b may have fewer of them).
// conv2d: out = conv2d(input, weight) in NCHW / OIHW layout with explicit (possibly
// asymmetric) zero padding. conv2d_nhwc: the same with input and out in NHWC layout
// (python/blade/codegen/stablehlo/layouts.py), the weight still OIHW. conv2d_nhwc_bias:
// the same plus a per-channel bias (any shape holding one value per output channel), then the
// `activation` (0 none, 1 ReLU, 2 SiLU, 3 hardswish: conv_activation.h), run as the
// convolution's own bias and post-op. conv2d_nhwc_bias_add: the same with a tensor of the
// result's shape (a residual connection) added after the bias, before the activation.
// conv2d_nhwc_bias_scaled[_add]: the input multiplied first by `scale`, one value per
// image and channel ([N, 1, 1, C]: a squeeze-excitation's), then as those.
// attention: out = softmax(q @ k^T * scale + mask) @ v over the last dim, q/k/v of rank 3
// or 4 ([batch..., length, head dim]; k and v stored transposed when `transpose_k` /
// `transpose_v`), the mask broadcasting to the scores; PyTorch's fused CPU attention, which
// never materializes the scores. attention_masked takes the mask, attention has none. A
// query row whose scores are all -inf comes out 0 when `zero_masked_rows` (PyTorch's
// scaled_dot_product_attention), else NaN (softmax's 0/0, as the ops give one by one).
#define BLADE_RAL_MEMREF(name) int64_t name##_rank, void* name##_descriptor
#define BLADE_RAL_DECLARE_KERNELS(suffix)                                                    \
  void blade_ral_matmul_##suffix(BLADE_RAL_MEMREF(a), BLADE_RAL_MEMREF(b),                   \
                                 BLADE_RAL_MEMREF(out), int64_t transpose_b);                \
  void blade_ral_conv2d_##suffix(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight),          \
                                 BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w,  \
                                 int64_t pad_top, int64_t pad_bottom, int64_t pad_left,      \
                                 int64_t pad_right, int64_t dilation_h, int64_t dilation_w,  \
                                 int64_t groups);                                            \
  void blade_ral_conv2d_nhwc_##suffix(                                                       \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(out),              \
      int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_bottom,               \
      int64_t pad_left, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,           \
      int64_t groups);                                                                       \
  void blade_ral_conv2d_nhwc_bias_##suffix(                                                  \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),             \
      BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w, int64_t pad_top,            \
      int64_t pad_bottom, int64_t pad_left, int64_t pad_right, int64_t dilation_h,           \
      int64_t dilation_w, int64_t groups, int64_t activation);                               \
  void blade_ral_conv2d_nhwc_bias_add_##suffix(                                              \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),             \
      BLADE_RAL_MEMREF(added), BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w,    \
      int64_t pad_top, int64_t pad_bottom, int64_t pad_left, int64_t pad_right,              \
      int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t activation);           \
  void blade_ral_conv2d_nhwc_bias_scaled_##suffix(                                           \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),             \
      BLADE_RAL_MEMREF(scale), BLADE_RAL_MEMREF(out), int64_t stride_h, int64_t stride_w,    \
      int64_t pad_top, int64_t pad_bottom, int64_t pad_left, int64_t pad_right,              \
      int64_t dilation_h, int64_t dilation_w, int64_t groups, int64_t activation);           \
  void blade_ral_conv2d_nhwc_bias_scaled_add_##suffix(                                       \
      BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(weight), BLADE_RAL_MEMREF(bias),             \
      BLADE_RAL_MEMREF(scale), BLADE_RAL_MEMREF(added), BLADE_RAL_MEMREF(out),               \
      int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_bottom,               \
      int64_t pad_left, int64_t pad_right, int64_t dilation_h, int64_t dilation_w,           \
      int64_t groups, int64_t activation);                                                   \
  void blade_ral_attention_##suffix(BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k),                \
                                    BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(out),              \
                                    int64_t transpose_k, int64_t transpose_v, double scale,  \
                                    int64_t zero_masked_rows);                               \
  void blade_ral_attention_masked_##suffix(                                                  \
      BLADE_RAL_MEMREF(q), BLADE_RAL_MEMREF(k), BLADE_RAL_MEMREF(v), BLADE_RAL_MEMREF(mask), \
      BLADE_RAL_MEMREF(out), int64_t transpose_k, int64_t transpose_v, double scale,         \
      int64_t zero_masked_rows);

BLADE_RAL_DECLARE_KERNELS(f32)
BLADE_RAL_DECLARE_KERNELS(f64)
BLADE_RAL_DECLARE_KERNELS(f16)
BLADE_RAL_DECLARE_KERNELS(bf16)
#undef BLADE_RAL_DECLARE_KERNELS

// sort: `values` and `indices` (int64) of `input` sorted along `dimension`, ascending or
// descending, by PyTorch's own sort (stable when `stable`), so ties and NaN come out in
// eager's order; with `k` > 0, only the first k along the dim, by PyTorch's topk (sorted).
// aten::sort, argsort and topk lower to it. One symbol per element type of `input`: f32,
// f64, f16, bf16, i32, i64.
#define BLADE_RAL_DECLARE_SORT(suffix)                                                       \
  void blade_ral_sort_##suffix(BLADE_RAL_MEMREF(input), BLADE_RAL_MEMREF(values),            \
                               BLADE_RAL_MEMREF(indices), int64_t dimension,                 \
                               int64_t descending, int64_t stable, int64_t k);
BLADE_RAL_DECLARE_SORT(f32)
BLADE_RAL_DECLARE_SORT(f64)
BLADE_RAL_DECLARE_SORT(f16)
BLADE_RAL_DECLARE_SORT(bf16)
BLADE_RAL_DECLARE_SORT(i32)
BLADE_RAL_DECLARE_SORT(i64)
#undef BLADE_RAL_DECLARE_SORT
}
