// What every library call (ral_kernels.h) does with its operands, whichever kernel family
// it belongs to (matmul_kernels.cpp, conv_kernels.cpp, attention_kernels.cpp,
// sort_kernels.cpp): each memref viewed in place as a tensor, the result's shape checked
// before anything is written, a weight the engine released put back before a kernel reads
// it as it is, and whatever the kernel throws recorded as the call's error
// (kernel_errors.h).
#pragma once

#include "ral/call_profile.h"
#include "ral/kernel_errors.h"
#include "ral/ral_kernels.h"

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

namespace blade::ral {

// A tensor of `scalar_type` viewing the memory a descriptor describes (no copy, not owned).
at::Tensor buffer_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type);

// The aligned address a descriptor holds (a call's weight's names the call in kept_view).
inline const void* buffer_address(const BladeUnrankedMemRef* memref) {
  return reinterpret_cast<const void*>(static_cast<const int64_t*>(memref->descriptor)[1]);
}

// How a buffer's view is shaped: as it is, or an NHWC buffer as the channels_last
// [N, C, H, W] tensor (a permutation).
enum class ViewShape { kAsIs, kNchw };

// buffer_view of `memref` shaped as `shape` says.
at::Tensor shaped_view(const BladeUnrankedMemRef* memref, c10::ScalarType scalar_type,
                       ViewShape shape);

// The view of `memref` as shaped_view makes it, kept between the calls of this thread for
// the library call `site` (e.g. its weight's address) and its operand number `operand`:
// an engine's buffers lie at the same addresses call after call, and making each view anew
// (a TensorImpl and its storage, a permutation through the dispatcher) was half of what a
// small convolution's call cost besides its work. A view
// is reused only while the buffer's descriptor (address, offset, sizes, strides), type and
// shape are the same, so it views exactly what a new one would; the views are only read
// and written through, never resized. The cache is cleared past a few thousand views.
const at::Tensor& kept_view(const void* site, int operand, const BladeUnrankedMemRef* memref,
                            c10::ScalarType scalar_type, ViewShape shape);

// ATen's out= variants resize an output of the wrong shape and copy_ broadcasts into one;
// the generated code's buffers must be written exactly, so shapes are checked first.
void check_result_shape(const char* what, const at::Tensor& out, at::IntArrayRef expected);

// `weight` as it is, for a kernel about to read it so: a weight the running engine released
// (its memory given back, prepared_weights.h) gets its values back first.
const at::Tensor& plain_weight(const at::Tensor& weight);

// Runs `fn`, recording what it throws as the error of the library call `what`; while calls
// are profiled (call_profile.h), its time goes under `profile_name()` (e.g. `what` and the
// operands' sizes).
template <typename NameFn, typename Fn>
void guarded(const char* what, NameFn&& profile_name, Fn&& fn) noexcept {
  try {
    const ProfiledCall<std::decay_t<NameFn>> profiled(profile_name);
    fn();
  } catch (const c10::Error& e) {  // its message, without PyTorch's C++ backtrace
    record_kernel_error(std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_kernel_error(std::string(what) + ": " + e.what());
  } catch (...) {
    record_kernel_error(std::string(what) + ": unknown error");
  }
}

// The same, its time profiled under `what`.
template <typename Fn>
void guarded(const char* what, Fn&& fn) noexcept {
  guarded(what, [what] { return std::string(what); }, std::forward<Fn>(fn));
}

}  // namespace blade::ral

// A memref's two arguments (BLADE_RAL_MEMREF) as one BladeUnrankedMemRef.
#define BLADE_RAL_UNRANKED(name) BladeUnrankedMemRef{name##_rank, name##_descriptor}

// X(suffix, scalar type) for each floating-point element type of the matmul, convolution
// and attention calls (ral_kernels.h).
#define BLADE_RAL_FOR_EACH_FLOAT_TYPE(X)                                                     \
  X(f32, c10::ScalarType::Float)                                                             \
  X(f64, c10::ScalarType::Double)                                                            \
  X(f16, c10::ScalarType::Half)                                                              \
  X(bf16, c10::ScalarType::BFloat16)
