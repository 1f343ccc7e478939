#include "ral/tensor_spec.h"

#include <c10/util/Exception.h>

#include <map>
#include <sstream>
#include <utility>

namespace blade::ral {
namespace {

struct DtypeName {
  at::ScalarType dtype;
  const char* name;
};

constexpr DtypeName kDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"},
    {at::kBFloat16, "bfloat16"}, {at::kLong, "int64"}, {at::kInt, "int32"},
    {at::kShort, "int16"}, {at::kChar, "int8"}, {at::kByte, "uint8"}, {at::kBool, "bool"},
};

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) {
    return "undefined";
  }
  std::ostringstream out;
  out << dtype_name(t.scalar_type()) << "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    out << (d ? "," : "") << t.size(d);
  }
  out << "]";
  if (!t.device().is_cpu()) {
    out << "@" << t.device();
  }
  return out.str();
}

}  // namespace

std::vector<std::pair<std::string, std::string>> spec_dtypes() {
  std::vector<std::pair<std::string, std::string>> dtypes;
  for (const auto& entry : kDtypeNames) {
    dtypes.emplace_back(entry.name, c10::toString(entry.dtype));
  }
  return dtypes;
}

const char* dtype_name(at::ScalarType dtype) {
  for (const auto& entry : kDtypeNames) {
    if (entry.dtype == dtype) {
      return entry.name;
    }
  }
  return c10::toString(dtype);
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& entry : kDtypeNames) {
    if (name == entry.name) {
      return entry.dtype;
    }
  }
  TORCH_CHECK(false, "blade: unknown dtype '", name, "' in an engine signature");
}

std::string TensorSpec::str() const {
  if (any) {
    return "*";
  }
  if (none) {
    return "None";
  }
  std::ostringstream out;
  out << dtype_name(dtype) << "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    out << (d ? "," : "");
    if (symbols[d] != kNoSymbol) {
      out << "s" << symbols[d];
    } else if (sizes[d] == kDynamicDim) {
      out << "?";
    } else {
      out << sizes[d];
    }
  }
  out << "]";
  return out.str();
}

std::string TensorSpec::mismatch(const at::Tensor& t, SlowPathKind* kind) const {
  SlowPathKind found = SlowPathKind::kSize;
  std::ostringstream why;
  if (any) {
    return "";
  }
  if (none) {
    if (!t.defined()) {
      return "";
    }
    found = SlowPathKind::kUndefined;
    why << "is a tensor, expected None";
  } else if (!t.defined()) {
    found = SlowPathKind::kUndefined;
    why << "the tensor is undefined";
  } else if (!t.device().is_cpu()) {
    found = SlowPathKind::kDevice;
    why << "device is " << t.device() << ", expected cpu";
  } else if (t.scalar_type() != dtype) {
    found = SlowPathKind::kDtype;
    why << "dtype is " << dtype_name(t.scalar_type()) << ", expected " << dtype_name(dtype);
  } else if (t.dim() != static_cast<int64_t>(sizes.size())) {
    found = SlowPathKind::kRank;
    why << "rank is " << t.dim() << ", expected " << sizes.size();
  } else {
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] != kDynamicDim && sizes[d] != t.size(static_cast<int64_t>(d))) {
        why << "size of dim " << d << " is " << t.size(static_cast<int64_t>(d)) << ", expected "
            << sizes[d];
        break;
      }
    }
  }
  if (kind != nullptr) {
    *kind = found;
  }
  return why.str();
}

bool TensorSpec::is_static() const {
  for (int64_t s : sizes) {
    if (s == kDynamicDim) {
      return false;
    }
  }
  return true;
}

namespace {

// Empty when every symbol names dimensions of one size in `tensors` (which already satisfy
// `specs` one by one), otherwise a sentence naming two dimensions that differ.
std::string symbol_mismatch(const std::vector<TensorSpec>& specs,
                            const std::vector<at::Tensor>& tensors) {
  // symbol -> (input, dim) where it was first seen
  std::map<int64_t, std::pair<size_t, size_t>> first;
  for (size_t i = 0; i < specs.size() && i < tensors.size(); ++i) {
    const auto& spec = specs[i];
    for (size_t d = 0; d < spec.symbols.size(); ++d) {
      if (spec.symbols[d] == TensorSpec::kNoSymbol) {
        continue;
      }
      auto [it, inserted] = first.emplace(spec.symbols[d], std::make_pair(i, d));
      if (inserted) {
        continue;
      }
      auto [j, e] = it->second;
      const int64_t here = tensors[i].size(static_cast<int64_t>(d));
      const int64_t there = tensors[j].size(static_cast<int64_t>(e));
      if (here != there) {
        std::ostringstream why;
        why << "size of dim " << d << " of input " << i << " is " << here
            << ", but the compiled code needs it equal to dim " << e << " of input " << j
            << " (" << there << "; both are s" << spec.symbols[d] << ")";
        return why.str();
      }
    }
  }
  return "";
}

}  // namespace

SignatureMismatch check_signature(const std::vector<TensorSpec>& specs,
                                  const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != specs.size()) {
    return {"expected " + std::to_string(specs.size()) + " inputs, got " +
                std::to_string(tensors.size()),
            SlowPathKind::kInputCount, -1};
  }
  // Whether this signature has dynamic dims: then a static dim of another size was kept
  // static on purpose or for want of a better example, and the fix is not "dynamic=True".
  bool dynamic = false;
  for (const auto& spec : specs) {
    for (int64_t size : spec.sizes) {
      dynamic = dynamic || size == kDynamicDim;
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    SlowPathKind kind = SlowPathKind::kSize;
    auto why = specs[i].mismatch(tensors[i], &kind);
    if (!why.empty()) {
      if (kind == SlowPathKind::kSize && dynamic) {
        kind = SlowPathKind::kStaticDim;
      }
      return {"input " + std::to_string(i) + ": " + why, kind, static_cast<int64_t>(i)};
    }
  }
  return {symbol_mismatch(specs, tensors), SlowPathKind::kSharedSize, -1};
}

std::string signature_mismatch(const std::vector<TensorSpec>& specs,
                               const std::vector<at::Tensor>& tensors) {
  return check_signature(specs, tensors).why;
}

std::vector<TensorSpec> parse_specs(const std::string& text) {
  std::vector<TensorSpec> specs;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ';')) {
    if (item.empty()) {
      continue;
    }
    if (item == "*" || item == "None") {
      TensorSpec spec;
      spec.any = item == "*";
      spec.none = item == "None";
      specs.push_back(std::move(spec));
      continue;
    }
    auto open = item.find('[');
    TORCH_CHECK(open != std::string::npos && item.back() == ']',
                "blade: malformed tensor spec '", item, "', expected dtype[d0,d1,...]");
    TensorSpec spec;
    spec.dtype = dtype_from_name(item.substr(0, open));
    std::istringstream dims(item.substr(open + 1, item.size() - open - 2));
    std::string dim;
    while (std::getline(dims, dim, ',')) {
      if (dim == "?") {
        spec.sizes.push_back(kDynamicDim);
        spec.symbols.push_back(TensorSpec::kNoSymbol);
        continue;
      }
      // Symbols are numbered from s0 in order of appearance, so none exceeds the number of
      // dims; sizes are bounded so that no product of them overflows.
      if (dim.size() > 1 && dim.size() <= 6 && dim[0] == 's' &&
          dim.find_first_not_of("0123456789", 1) == std::string::npos) {
        spec.sizes.push_back(kDynamicDim);
        spec.symbols.push_back(std::stoll(dim.substr(1)));
        continue;
      }
      const bool digits = !dim.empty() && dim.size() <= 12 &&
                          dim.find_first_not_of("0123456789") == std::string::npos;
      TORCH_CHECK(digits, "blade: malformed tensor spec '", item, "': dimension '", dim,
                  "' is neither a size, '?' nor a symbol s<N> (sizes are below 10^12)");
      spec.sizes.push_back(std::stoll(dim));
      spec.symbols.push_back(TensorSpec::kNoSymbol);
    }
    TORCH_CHECK(spec.sizes.size() <= kMaxRank, "blade: malformed tensor spec '",
                item.substr(0, 200), "': more than ", kMaxRank, " dimensions");
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::string format_specs(const std::vector<TensorSpec>& specs) {
  std::string out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out += (i ? ";" : "") + specs[i].str();
  }
  return out;
}

std::string describe_tensors(const std::vector<at::Tensor>& tensors) {
  std::string out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    out += (i ? ";" : "") + describe_tensor(tensors[i]);
  }
  return out;
}

}  // namespace blade::ral
