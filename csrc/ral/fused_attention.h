// Attention in one parallel loop: softmax(q @ k^T * scale + mask) @ v for float32.
//
// Each task takes a block of query rows of one (batch, head): a GEMM (oneDNN's brgemm
// microkernel, or MKL's sgemm for column-major q or v) multiplies the block by k^T into a
// scratch block of scores that stays in cache, the softmax runs over those rows in place
// (vectorized exp), and a second GEMM multiplies the probabilities by v straight into the
// output. The scores never reach memory, there is one parallel region instead of one
// per step, and nothing is allocated or copied for the result.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace blade::ral {

// While a Bf16AttentionProducts(true) is alive on a thread, fused_attention_f32 on that
// thread multiplies bfloat16 operands (float32 sums, a float32 softmax) where the CPU has
// AVX512-BF16 and they are faster there than float32 ones (AMX-BF16 tiles, or dot products
// measured once per process: bf16_attention_faster): int8 engines run their attention so
// (Config(precision="int8")), as OpenVINO runs the float parts of its int8 models in
// bfloat16 on such CPUs.
bool bf16_attention_supported();
bool bf16_attention_faster();
// Tests make every int8 engine's attention take bf16 products where supported (kAlways)
// or none (kNever), to compare the two.
enum class Bf16Attention { kWhenFaster, kAlways, kNever };
void set_bf16_attention(Bf16Attention mode);
// Tests turn the AMX tiles off (false) so that an AMX CPU runs the AVX512-BF16 products
// too.
void set_bf16_attention_amx(bool allowed);

class Bf16AttentionProducts {
 public:
  // even_if_slower: the bf16 products where supported, faster or not (tests).
  explicit Bf16AttentionProducts(bool enabled, bool even_if_slower = false);
  ~Bf16AttentionProducts();
  Bf16AttentionProducts(const Bf16AttentionProducts&) = delete;
  Bf16AttentionProducts& operator=(const Bf16AttentionProducts&) = delete;

 private:
  bool previous_;
};

// q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev] and out [B, H, L, Ev], float32, any
// strides that leave each [rows, cols] matrix with one unit stride (out: along its last
// dim); `mask` broadcasts to [B, H, L, S] with unit stride along S. Writes all of `out`
// and returns true, or returns false having written nothing when q or v is column-major
// and MKL's sgemm is not in the process, or a layout or size is outside what the GEMMs
// take (the caller then runs PyTorch's own fused attention). A row whose mask is -inf everywhere comes out 0 with
// `zero_masked_rows` (PyTorch's scaled_dot_product_attention), else NaN (softmax's 0/0).
bool fused_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double scale,
                         bool zero_masked_rows, at::Tensor& out);

}  // namespace blade::ral
