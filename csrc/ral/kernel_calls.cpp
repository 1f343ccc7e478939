#include "ral/kernel_calls.h"

#include "ral/call_profile.h"
#include "ral/int8_kernels.h"
#include "ral/kernel_errors.h"
#include "ral/layout_kernels.h"
#include "ral/library_call.h"
#include "ral/offered_buffers.h"
#include "ral/signing.h"
#include "ral/tensor_spec.h"
#include "ral/text.h"

#include <c10/util/Exception.h>

#include <ATen/core/enum_tag.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>
#include <string_view>
#include <system_error>

namespace blade::ral {
namespace {

thread_local const KernelCallTable* active_table = nullptr;

std::atomic<int64_t> placed_results{0};
std::atomic<int64_t> copied_results{0};

int64_t parse_int(const std::string& text) {
  TORCH_CHECK(!text.empty(), "an empty integer");
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  TORCH_CHECK(errno == 0 && end == text.c_str() + text.size(), "'", text,
              "' is not an integer");
  return static_cast<int64_t>(value);
}

// A float as Python's float.hex() writes it ("-0x1.8p+1", "inf", "nan"), whatever the
// process's locale.
double parse_float(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string magnitude = text.substr(negative ? 1 : 0);
  double value = 0.0;
  if (magnitude == "inf") {
    value = std::numeric_limits<double>::infinity();
  } else if (magnitude == "nan") {
    value = std::numeric_limits<double>::quiet_NaN();
  } else {
    TORCH_CHECK(magnitude.rfind("0x", 0) == 0, "'", text, "' is not a float");
    const char* first = magnitude.data() + 2;
    const char* last = magnitude.data() + magnitude.size();
    const auto [end, error] = std::from_chars(first, last, value, std::chars_format::hex);
    TORCH_CHECK(error == std::errc() && end == last && first != last, "'", text,
                "' is not a float");
  }
  return negative ? -value : value;
}

bool parse_bool(const std::string& text) {
  TORCH_CHECK(text == "0" || text == "1", "'", text, "' is not a bool (0 or 1)");
  return text == "1";
}

std::string parse_text(const std::string& hex) {
  std::vector<uint8_t> bytes;
  TORCH_CHECK(parse_hex(hex, hex.size() / 2, &bytes), "'", hex, "' is not hex bytes");
  return std::string(bytes.begin(), bytes.end());
}

// The dtypes of a call's operands or results, and which are NHWC buffers (`:nhwc`).
std::vector<c10::ScalarType> parse_dtypes(const std::string& text, std::vector<bool>* nhwc) {
  std::vector<c10::ScalarType> types;
  nhwc->clear();
  if (text == "-") {
    return types;
  }
  constexpr std::string_view kNhwc = ":nhwc";
  for (const auto& name : split(text, ',')) {
    const bool marked = name.size() > kNhwc.size() &&
                        name.compare(name.size() - kNhwc.size(), kNhwc.size(), kNhwc) == 0;
    types.push_back(dtype_from_name(marked ? name.substr(0, name.size() - kNhwc.size()) : name));
    nhwc->push_back(marked);
    TORCH_CHECK(!marked || types.back() == at::kFloat, "only float32 buffers may be NHWC, not ",
                name);
  }
  return types;
}

// A buffer as the op takes it: an NHWC one as the channels_last [N, C, H, W] view.
at::Tensor op_view(const BladeUnrankedMemRef* buffer, c10::ScalarType type, bool nhwc) {
  return shaped_view(buffer, type, nhwc ? ViewShape::kNchw : ViewShape::kAsIs);
}

template <typename T, typename Parse>
std::vector<T> parse_list(const std::string& items, Parse parse) {
  std::vector<T> values;
  if (!items.empty()) {
    for (const auto& item : split(items, ',')) {
      values.push_back(parse(item));
    }
  }
  return values;
}

// One argument of a call (see the header); a tensor operand sets `*tensor_operand`.
c10::IValue parse_argument(const std::string& text, size_t operands, int64_t* tensor_operand) {
  TORCH_CHECK(!text.empty(), "an empty argument");
  const std::string rest = text.substr(1);
  *tensor_operand = -1;
  switch (text[0]) {
    case 'T': {
      const int64_t index = parse_int(rest);
      TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < operands, "tensor operand ",
                  index, " of a call with ", operands);
      *tensor_operand = index;
      return c10::IValue();
    }
    case 'N':
      TORCH_CHECK(rest.empty(), "'", text, "' is not None");
      return c10::IValue();
    case 'b':
      return c10::IValue(parse_bool(rest));
    case 'i':
      return c10::IValue(parse_int(rest));
    case 'f':
      return c10::IValue(parse_float(rest));
    case 's':
      return c10::IValue(parse_text(rest));
    case 'D':
      return c10::IValue(c10::Device(parse_text(rest)));
    case 'I':
      return c10::IValue(parse_list<int64_t>(rest, parse_int));
    case 'F':
      return c10::IValue(parse_list<double>(rest, parse_float));
    case 'B': {
      c10::List<bool> values;
      for (bool value : parse_list<bool>(rest, parse_bool)) {
        values.push_back(value);
      }
      return c10::IValue(values);
    }
    default:
      TORCH_CHECK(false, "'", text, "' is not an argument");
  }
}

KernelCall parse_call(const std::string& line) {
  const auto fields = split(line, ' ');
  TORCH_CHECK(fields.size() >= 3, "a call needs an op and two dtype lists");
  KernelCall call;
  call.name = fields[0];
  const size_t dot = call.name.find('.');
  const std::string op_name = call.name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : call.name.substr(dot + 1);
  TORCH_CHECK(op_name.rfind("aten::", 0) == 0 || op_name == "blade::quantized_linear" ||
                  op_name == "blade::quantized_conv2d" ||
                  op_name == "blade::quantized_conv2d_add" ||
                  op_name == "blade::quantized_max_pool2d",
              "'", call.name, "' is neither an aten op nor one of Blade's int8 ops");
  // Checked here, where the code is loaded: an engine with int8 calls is refused on a CPU
  // that would run them slowly (the fallback runs them in float32, int8_kernels.h).
  TORCH_CHECK(op_name.rfind("blade::", 0) != 0 || int8_weight_limit() > 0, call.name,
              " needs a CPU with ", int8_features_needed(), "; this one has none of them");
  call.op = c10::Dispatcher::singleton().findSchema({op_name, overload});
  TORCH_CHECK(call.op.has_value(), "this PyTorch has no op '", call.name, "'");
  call.operand_types = parse_dtypes(fields[1], &call.operand_nhwc);
  call.result_types = parse_dtypes(fields[2], &call.result_nhwc);
  const bool convolution = op_name.rfind("blade::quantized_conv2d", 0) == 0;
  const auto marked = [](const std::vector<bool>& flags) {
    return std::find(flags.begin(), flags.end(), true) != flags.end();
  };
  TORCH_CHECK(convolution || (!marked(call.operand_nhwc) && !marked(call.result_nhwc)),
              call.name, " takes no NHWC buffers (only int8 convolutions do)");
  const auto& schema = call.op->schema();
  TORCH_CHECK(fields.size() - 3 == schema.arguments().size(), call.name, " takes ",
              schema.arguments().size(), " arguments, the call gives ", fields.size() - 3);
  TORCH_CHECK(schema.returns().size() == call.result_types.size(), call.name, " returns ",
              schema.returns().size(), " values, the call expects ",
              call.result_types.size());
  // The op must be a function of its operands: nothing written, nothing aliased.
  for (const auto& argument : schema.arguments()) {
    TORCH_CHECK(argument.alias_info() == nullptr, call.name,
                " writes into or returns a view of argument '", argument.name(), "'");
  }
  for (const auto& result : schema.returns()) {
    TORCH_CHECK(result.alias_info() == nullptr, call.name, " returns a view of an argument");
  }
  for (size_t i = 3; i < fields.size(); ++i) {
    int64_t operand = -1;
    call.constants.push_back(parse_argument(fields[i], call.operand_types.size(), &operand));
    call.tensor_operand.push_back(operand);
  }
  // quantized_linear's result is oneDNN's output, reshaped; a convolution's is when it is
  // uint8 (NHWC, as the buffer) or float32 into an NHWC buffer (channels_last, as the op
  // makes it); a float one for an NCHW buffer is laid out again.
  call.places_result =
      call.result_types.size() == 1 &&
      (op_name == "blade::quantized_linear" ||
       (convolution && (call.result_types[0] == at::kChar || call.result_nhwc[0])));
  return call;
}

// Copies shorter than this run on one thread.
constexpr int64_t kParallelCopyBytes = int64_t{1} << 20;

// `out` (the engine's contiguous buffer) = `result`.
void copy_result(at::Tensor& out, const at::Tensor& result) {
  if (result.dim() == 4 && result.scalar_type() == at::kFloat && out.is_contiguous() &&
      !result.is_contiguous() && result.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    channels_last_to_contiguous(result, out);
    return;
  }
  if (out.is_contiguous() && result.is_contiguous() &&
      out.scalar_type() == result.scalar_type()) {
    // Bytes as they are: a TensorIterator copy would cost a parallel region per call,
    // which for the small results of int8 layers costs more than the copy.
    const char* from = static_cast<const char*>(result.const_data_ptr());
    char* to = static_cast<char*>(out.data_ptr());
    const int64_t bytes = result.numel() * static_cast<int64_t>(result.element_size());
    at::parallel_for(0, bytes, kParallelCopyBytes, [&](int64_t begin, int64_t end) {
      std::memcpy(to + begin, from + begin, end - begin);
    });
    return;
  }
  out.copy_(result);
}

}  // namespace

KernelCallTable::KernelCallTable(const std::string& text) {
  const auto lines = split(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    try {
      calls_.push_back(parse_call(lines[i]));
      draws_random_numbers_ = draws_random_numbers_ ||
                              calls_.back().op->hasTag(at::Tag::nondeterministic_seeded);
      if (calls_.back().places_result) {
        offering_installed();  // when the code loads, rather than on its first call
      }
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "kernel call ", i, " ('", lines[i].substr(0, 200),
                  "') is refused: ", e.msg());
    }
  }
}

ActiveKernelCalls::ActiveKernelCalls(const KernelCallTable* table) : previous_(active_table) {
  active_table = table;
}

ActiveKernelCalls::~ActiveKernelCalls() { active_table = previous_; }

std::pair<int64_t, int64_t> kernel_call_result_counts() {
  return {placed_results.load(), copied_results.load()};
}

void run_kernel_call(int64_t index, const BladeUnrankedMemRef* buffers, int64_t count) {
  if (kernel_error_pending()) {
    return;  // the results are discarded: no more random numbers drawn, nothing run
  }
  try {
    TORCH_CHECK(active_table != nullptr, "no kernel call table is active on this thread");
    TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < active_table->size(), "call ",
                index, " of a table of ", active_table->size());
    const KernelCall& call = active_table->at(static_cast<size_t>(index));
    const size_t operands = call.operand_types.size();
    TORCH_CHECK(static_cast<size_t>(count) == operands + call.result_types.size(), call.name,
                ": the code passes ", count, " buffers, the call takes ", operands, " + ",
                call.result_types.size());
    torch::jit::Stack stack;
    stack.reserve(call.constants.size());
    // The operands' views kept between calls (kept_view): an engine's weights, scales and
    // ranges are the same buffers on every call, and wrapping each in a new tensor was most
    // of what a small int8 layer's call cost besides its work.
    for (size_t a = 0; a < call.constants.size(); ++a) {
      const int64_t operand = call.tensor_operand[a];
      stack.push_back(operand < 0
                          ? call.constants[a]
                          : c10::IValue(kept_view(&call, static_cast<int>(operand),
                                                  &buffers[operand],
                                                  call.operand_types[operand],
                                                  call.operand_nhwc[operand] ? ViewShape::kNchw
                                                                             : ViewShape::kAsIs)));
    }
    // Timed to the end of the try block while calls are profiled, keyed by the op and the
    // sizes of its tensor operands (e.g. an int8 convolution's input, weight and bias),
    // named before the call replaces the stack with its results.
    std::string profile_key;
    if (call_profiling()) {
      std::ostringstream name;
      name << call.name;
      for (const c10::IValue& argument : stack) {
        if (argument.isTensor()) {
          name << " " << argument.toTensor().sizes();
        }
      }
      profile_key = name.str();
    }
    const ProfiledCall profiled(
        [&profile_key, &call] { return profile_key.empty() ? call.name : profile_key; });
    at::Tensor placed;
    if (call.places_result && offering_installed()) {
      placed = op_view(&buffers[operands], call.result_types[0], call.result_nhwc[0]);
      ScopedOffer scoped(placed);
      call.op->callBoxed(stack);
    } else {
      call.op->callBoxed(stack);
    }
    TORCH_CHECK(stack.size() == call.result_types.size(), call.name, " returned ",
                stack.size(), " values, the call expects ", call.result_types.size());
    for (size_t r = 0; r < stack.size(); ++r) {
      TORCH_CHECK(stack[r].isTensor(), call.name, " returned a ", stack[r].tagKind(),
                  " as result ", r);
      const at::Tensor& result = stack[r].toTensor();
      TORCH_CHECK(result.layout() == at::kStrided && result.device().is_cpu(), call.name,
                  " gave result ", r, " with layout ", result.layout(), " on ",
                  result.device(), ", the engine takes dense CPU tensors");
      at::Tensor out = placed.defined() ? placed  // the one result, viewed once
                                        : op_view(&buffers[operands + r], call.result_types[r],
                                                  call.result_nhwc[r]);
      TORCH_CHECK(result.scalar_type() == out.scalar_type() && result.sizes() == out.sizes(),
                  call.name, " gave result ", r, " of ", result.scalar_type(), result.sizes(),
                  ", the engine was compiled for ", out.scalar_type(), out.sizes());
      bool made_here = false;
      if (placed.defined()) {
        made_here = settle(result, out, copy_result);
      } else {
        copy_result(out, result);
      }
      (made_here ? placed_results : copied_results).fetch_add(1, std::memory_order_relaxed);
    }
  } catch (const c10::Error& e) {  // the op's message, without PyTorch's C++ backtrace
    record_kernel_error(std::string("blade_ral_kernel_call: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    record_kernel_error(std::string("blade_ral_kernel_call: ") + e.what());
  } catch (...) {
    record_kernel_error("blade_ral_kernel_call: unknown error");
  }
}

}  // namespace blade::ral

// Each unpacks its memref arguments (BLADE_RAL_BUFFERS_<n>) into an array.
#define BLADE_RAL_UNPACK_1 {m0_rank, m0_descriptor}
#define BLADE_RAL_UNPACK_2 BLADE_RAL_UNPACK_1, {m1_rank, m1_descriptor}
#define BLADE_RAL_UNPACK_3 BLADE_RAL_UNPACK_2, {m2_rank, m2_descriptor}
#define BLADE_RAL_UNPACK_4 BLADE_RAL_UNPACK_3, {m3_rank, m3_descriptor}
#define BLADE_RAL_UNPACK_5 BLADE_RAL_UNPACK_4, {m4_rank, m4_descriptor}
#define BLADE_RAL_UNPACK_6 BLADE_RAL_UNPACK_5, {m5_rank, m5_descriptor}
#define BLADE_RAL_UNPACK_7 BLADE_RAL_UNPACK_6, {m6_rank, m6_descriptor}
#define BLADE_RAL_UNPACK_8 BLADE_RAL_UNPACK_7, {m7_rank, m7_descriptor}
#define BLADE_RAL_UNPACK_9 BLADE_RAL_UNPACK_8, {m8_rank, m8_descriptor}
#define BLADE_RAL_UNPACK_10 BLADE_RAL_UNPACK_9, {m9_rank, m9_descriptor}
#define BLADE_RAL_UNPACK_11 BLADE_RAL_UNPACK_10, {m10_rank, m10_descriptor}
#define BLADE_RAL_UNPACK_12 BLADE_RAL_UNPACK_11, {m11_rank, m11_descriptor}

extern "C" {
#define BLADE_RAL_DEFINE_KERNEL_CALL(n)                                      \
  void blade_ral_kernel_call_##n(int64_t call, BLADE_RAL_BUFFERS_##n) noexcept { \
    const BladeUnrankedMemRef buffers[] = {BLADE_RAL_UNPACK_##n};            \
    blade::ral::run_kernel_call(call, buffers, n);                           \
  }
BLADE_RAL_FOR_EACH_BUFFER_COUNT(BLADE_RAL_DEFINE_KERNEL_CALL)
#undef BLADE_RAL_DEFINE_KERNEL_CALL
}
