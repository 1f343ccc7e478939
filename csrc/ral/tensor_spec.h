// TensorSpec: what an engine assumes about one tensor (dtype, rank, static sizes, device).
//
// Specs travel as text, `float32[4,?,768]`, one spec per tensor joined by ';', so that the
// engine's signature is readable in a saved model and in error messages. A dynamic
// dimension is `?` (any size) or a named symbol `s0`, `s1`, ...: every dimension named by
// one symbol, across all the inputs of a signature, must have the same size, because the
// compiled code relies on it (two dims that meet in a broadcast, say).
#pragma once

#include "ral/slow_path.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace blade::ral {

constexpr int64_t kDynamicDim = -1;
constexpr size_t kMaxRank = 16;

struct TensorSpec {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;  // kDynamicDim where the size may vary between calls
  // Per dimension, the symbol that names it (>= 0), or kNoSymbol.
  std::vector<int64_t> symbols;
  // `*`: any tensor (an input whose type the example run did not record).
  bool any = false;
  // `None`: an optional tensor that must be absent (the graph was specialized to None).
  bool none = false;

  static constexpr int64_t kNoSymbol = -1;

  // Empty when `t` satisfies the spec, otherwise a sentence saying what differs (and, in
  // `kind`, what kind of difference it is).
  std::string mismatch(const at::Tensor& t, SlowPathKind* kind = nullptr) const;
  std::string str() const;
  bool is_static() const;
};

std::vector<TensorSpec> parse_specs(const std::string& text);
// Empty when `tensors` satisfy the signature `specs`: as many tensors, each matching its
// spec, and every symbol naming dimensions of one size. Otherwise a sentence saying what
// differs (the first input that does not match, or two dimensions that differ).
std::string signature_mismatch(const std::vector<TensorSpec>& specs,
                               const std::vector<at::Tensor>& tensors);

// signature_mismatch's sentence, with the kind of difference and the input it is in (-1
// for the number of inputs), for the slow-path warnings.
struct SignatureMismatch {
  std::string why;  // empty when the tensors match
  SlowPathKind kind = SlowPathKind::kSize;
  int64_t input = -1;
};
SignatureMismatch check_signature(const std::vector<TensorSpec>& specs,
                                  const std::vector<at::Tensor>& tensors);
std::string format_specs(const std::vector<TensorSpec>& specs);
// The signature of actual tensors, in the same notation, for error messages.
std::string describe_tensors(const std::vector<at::Tensor>& tensors);

const char* dtype_name(at::ScalarType dtype);
// Every dtype specs name, in table order: (its name, its ScalarType's name: "Float").
// blade.partition.dtypes.DTYPES is the definition; tests/test_cli.py checks this against it.
std::vector<std::pair<std::string, std::string>> spec_dtypes();
at::ScalarType dtype_from_name(const std::string& name);

}  // namespace blade::ral
