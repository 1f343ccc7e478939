// The host CPU's features as /proc/cpuinfo names them (avx512f, avx512_bf16, amx_int8, ...),
// read once, by one parser, for the whole process: the compiler records in each engine the
// features its code may use (blade.codegen.llvm.native.host_cpu_features, which asks
// blade._C.host_cpu_flags), the runtime refuses code that needs one this host lacks
// (missing_cpu_features), and its own kernels ask here which instructions they may use.
#pragma once

#include <istream>
#include <set>
#include <string>

namespace blade::ral {

// The flags of the first "flags" (x86) or "Features" (Arm) line of text in /proc/cpuinfo's
// format; empty when there is none.
std::set<std::string> parse_cpu_flags(std::istream& cpuinfo);

// This host's flags: parse_cpu_flags of /proc/cpuinfo, read on first use (empty when it
// cannot be read).
const std::set<std::string>& host_cpu_flags();

// Whether this host has `feature`, e.g. has_cpu_feature("avx512f").
bool has_cpu_feature(const std::string& feature);

// This host's x86 family (CPUID's, extended family added) where its vendor is AMD, else 0:
// for kernel shapes tuned to one AMD generation (25: Zen 3 and Zen 4).
int amd_cpu_family();

// The features `required` lists (comma-separated) that this host lacks, comma-separated;
// empty when it has them all.
std::string missing_cpu_features(const std::string& required);

}  // namespace blade::ral
