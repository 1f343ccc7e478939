// C++ tests of the runtime (libblade_ral), without Python: specs, signatures, code loading,
// the allocator and library-call ABI, and saved engines run from libtorch (correct results,
// fallbacks, tampered files, many threads, load/unload cycles). `make test-asan` runs them
// under AddressSanitizer + LeakSanitizer; tests/ral/test_ral_cpp.py runs them in `make test`.
//
//   ral_tests FIXTURE_DIR     (fixtures from tests/ral/make_fixtures.py)
#include "ral/compiled_code.h"
#include "ral/cpu_features.h"
#include "ral/engine.h"
#include "ral/guard.h"
#include "ral/int8_kernels.h"
#include "ral/kernel_calls.h"
#include "ral/kernel_errors.h"
#include "ral/kernel_trials.h"
#include "ral/prepared_weights.h"
#include "ral/ral_abi.h"
#include "ral/ral_kernels.h"
#include "ral/signing.h"
#include "ral/task_runs.h"
#include "ral/tensor_spec.h"
#include "ral/winograd.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <ATen/Parallel.h>
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_failures = 0;
std::string g_fixtures;

#define EXPECT(cond)                                                                     \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::cerr << "  FAILED " << __FILE__ << ":" << __LINE__ << ": " #cond "\n";       \
      ++g_failures;                                                                      \
    }                                                                                    \
  } while (0)

#define EXPECT_THROWS_WITH(statement, text)                                              \
  do {                                                                                   \
    std::string message_;                                                                \
    try {                                                                                \
      statement;                                                                         \
    } catch (const std::exception& e) {                                                  \
      message_ = e.what();                                                               \
    }                                                                                    \
    if (message_.find(text) == std::string::npos) {                                      \
      std::cerr << "  FAILED " << __FILE__ << ":" << __LINE__ << ": " #statement         \
                << " should throw an error containing '" << (text) << "', got '"         \
                << message_.substr(0, 2000) << "'\n";                                     \
      ++g_failures;                                                                      \
    }                                                                                    \
  } while (0)

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

int open_fds() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) {
      ++count;
    }
    ::closedir(dir);
  }
  return count;
}

std::vector<c10::IValue> load_list(const std::string& name) {
  std::ifstream in(g_fixtures + "/" + name, std::ios::binary);
  TORCH_CHECK(in, "cannot open fixture ", name, " in ", g_fixtures);
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  c10::IValue value = torch::pickle_load(bytes);
  TORCH_CHECK(value.isList(), name, " must hold a list");
  std::vector<c10::IValue> items;
  for (const c10::IValue& item : value.toListRef()) {
    items.push_back(item);
  }
  return items;
}

torch::jit::Module load_model(const std::string& name) {
  return torch::jit::load(g_fixtures + "/" + name);
}

c10::intrusive_ptr<blade::ral::Engine> engine_of(const torch::jit::Module& module) {
  return module.attr("blade_engine_0").toCustomClass<blade::ral::Engine>();
}

c10::intrusive_ptr<blade::ral::Guard> guard_of(const torch::jit::Module& module) {
  return module.attr("blade_guard").toCustomClass<blade::ral::Guard>();
}

bool same_outputs(const c10::IValue& actual, const std::vector<c10::IValue>& expected) {
  std::vector<c10::IValue> items;
  if (actual.isTuple()) {
    items = actual.toTupleRef().elements().vec();
  } else {
    items.push_back(actual);
  }
  if (items.size() != expected.size()) {
    return false;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!at::allclose(items[i].toTensor(), expected[i].toTensor(), 1e-5, 1e-5)) {
      return false;
    }
  }
  return true;
}

// --- specs and signatures -----------------------------------------------------------------

void test_specs_round_trip_and_explain_mismatches() {
  using namespace blade::ral;
  auto specs = parse_specs("float32[4,?,768];int64[];bool[3]");
  EXPECT(specs.size() == 3);
  EXPECT(format_specs(specs) == "float32[4,?,768];int64[];bool[3]");
  EXPECT(specs[0].mismatch(at::zeros({4, 5, 768})).empty());
  EXPECT(specs[0].mismatch(at::zeros({4, 9, 768})).empty());  // dynamic dim
  EXPECT(contains(specs[0].mismatch(at::zeros({4, 5, 767})), "size of dim 2 is 767, expected 768"));
  EXPECT(contains(specs[0].mismatch(at::zeros({4, 5})), "rank"));
  EXPECT(contains(specs[0].mismatch(at::zeros({4, 5, 768}, at::kDouble)),
                  "dtype is float64, expected float32"));
  EXPECT(specs[1].mismatch(at::scalar_tensor(3, at::kLong)).empty());
  EXPECT_THROWS_WITH(parse_specs("float32[4,x]"), "dimension 'x' is neither a size, '?' nor a symbol");
  EXPECT_THROWS_WITH(parse_specs("complex7[4]"), "complex7");
}

void test_symbols_tie_dynamic_dims_together() {
  using namespace blade::ral;
  auto specs = parse_specs("float32[s0,s1,8];float32[s0,1,1,s1]");
  EXPECT(format_specs(specs) == "float32[s0,s1,8];float32[s0,1,1,s1]");
  EXPECT(!specs[0].is_static());
  EXPECT(specs[0].mismatch(at::zeros({3, 7, 8})).empty());
  EXPECT(signature_mismatch(specs, {at::zeros({3, 7, 8}), at::zeros({3, 1, 1, 7})}).empty());
  EXPECT(contains(signature_mismatch(specs, {at::zeros({3, 7, 8}), at::zeros({3, 1, 1, 6})}),
                  "size of dim 3 of input 1 is 6, but the compiled code needs it equal to dim 1 "
                  "of input 0 (7; both are s1)"));
}

void test_signatures_cover_every_field_and_need_a_trusted_key() {
  using namespace blade::ral;
  auto digest_of = [](std::initializer_list<std::string> fields) {
    FieldHasher hasher;
    for (const auto& field : fields) {
      hasher.add(field);
    }
    return hasher.finish();
  };
  // Fields are framed: moving a byte from one field to the next changes the digest.
  EXPECT(digest_of({"ab", "c"}) != digest_of({"a", "bc"}));
  Digest digest = digest_of({"code", "specs"});
  // The fixtures' key (this machine's, under the same XDG_CONFIG_HOME) signs and is trusted.
  std::string signature = sign_digest(digest, "");
  EXPECT(verify_digest(digest, signature, nullptr).empty());
  Digest other = digest;
  other[5] ^= 1;
  EXPECT(contains(verify_digest(other, signature, nullptr), "does not match its contents"));
  std::string flipped = signature;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  EXPECT(contains(verify_digest(digest, flipped, nullptr), "does not match its contents"));
  std::string untrusted;
  std::string stranger = std::string("ed25519:") + std::string(64, '7') + ":" +
                         std::string(128, '0');
  EXPECT(contains(verify_digest(digest, stranger, &untrusted), "does not trust"));
  EXPECT(untrusted == std::string(64, '7'));
  EXPECT(contains(verify_digest(digest, "", nullptr), "not signed"));
  EXPECT(contains(verify_digest(digest, "ed25519:xyz", nullptr), "malformed"));
  EXPECT_THROWS_WITH(trust_public_key("xyz"), "64 hex digits");
  // Chunked hashing sees every byte, across chunk boundaries too.
  std::vector<uint8_t> bytes((size_t{4} << 20) + 3, 7);
  Digest whole = chunked_sha256(bytes.data(), bytes.size());
  for (size_t at : {size_t{0}, size_t{4} << 20, bytes.size() - 1}) {
    bytes[at] ^= 1;
    EXPECT(whole != chunked_sha256(bytes.data(), bytes.size()));
    bytes[at] ^= 1;
  }
}

void test_garbage_code_is_refused_without_leaking_descriptors() {
  int before = open_fds();
  std::vector<uint8_t> garbage(1000, 0x5a);
  for (int i = 0; i < 20; ++i) {
    EXPECT_THROWS_WITH(blade::ral::CompiledCode(garbage.data(), garbage.size(), "junk"),
                       "could not be loaded");
  }
  EXPECT(open_fds() == before);
}

// --- the ABI generated code calls ---------------------------------------------------------

void test_allocator_balances() {
  int64_t live = blade_ral_live_allocations();
  std::vector<void*> blocks;
  for (size_t size : {size_t{1}, size_t{64}, size_t{1 << 20}}) {
    blocks.push_back(_mlir_memref_to_llvm_alloc(size));
    blocks.push_back(_mlir_memref_to_llvm_aligned_alloc(64, size));
  }
  EXPECT(blade_ral_live_allocations() == live + 6);
  for (void* block : blocks) {
    EXPECT(block != nullptr);
    EXPECT(reinterpret_cast<uintptr_t>(block) % 16 == 0);
    _mlir_memref_to_llvm_free(block);
  }
  EXPECT(blade_ral_live_allocations() == live);
}

void test_freed_buffers_are_reused_and_released() {
  blade_ral_release_cached_memory();
  EXPECT(blade_ral_cached_bytes() == 0);
  void* first = _mlir_memref_to_llvm_alloc(1 << 20);
  _mlir_memref_to_llvm_free(first);
  EXPECT(blade_ral_cached_bytes() >= (1 << 20));
  // The same size again, and a slightly smaller one, get the cached block back...
  void* again = _mlir_memref_to_llvm_alloc(1 << 20);
  EXPECT(again == first);
  EXPECT(blade_ral_cached_bytes() == 0);
  _mlir_memref_to_llvm_free(again);
  void* smaller = _mlir_memref_to_llvm_alloc((1 << 20) - 4096);
  EXPECT(smaller == first);
  // ...a much smaller one does not take it (it would waste more than half of it).
  void* tiny = _mlir_memref_to_llvm_alloc(1000);
  EXPECT(tiny != first);
  std::memset(smaller, 1, (1 << 20) - 4096);  // all of it is usable (ASan checks)
  _mlir_memref_to_llvm_free(smaller);
  _mlir_memref_to_llvm_free(tiny);
  blade_ral_release_cached_memory();
  EXPECT(blade_ral_cached_bytes() == 0);
}

template <int Rank>
struct Descriptor {
  void* allocated;
  void* aligned;
  int64_t offset;
  int64_t sizes[Rank];
  int64_t strides[Rank];
};

template <int Rank>
Descriptor<Rank> describe(const at::Tensor& t) {
  Descriptor<Rank> d{};
  d.allocated = d.aligned = t.data_ptr();
  for (int i = 0; i < Rank; ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  return d;
}

// memref.copy as the generated code calls it, into `view(base)`: afterwards `base` must
// equal a copy made by ATen (the view holds `src`, nothing outside it changed).
void expect_memref_copy(const at::Tensor& src, at::Tensor base,
                        const std::function<at::Tensor(const at::Tensor&)>& view) {
  at::Tensor expected = base.clone();
  view(expected).copy_(src);
  at::Tensor dst = view(base);
  const int64_t rank = src.dim();
  auto descriptor = [rank](const at::Tensor& t) {
    std::vector<int64_t> d(3 + 2 * rank);
    d[0] = d[1] = reinterpret_cast<int64_t>(t.data_ptr());
    for (int64_t k = 0; k < rank; ++k) {
      d[3 + k] = t.size(k);
      d[3 + rank + k] = t.stride(k);
    }
    return d;
  };
  std::vector<int64_t> s_desc = descriptor(src), t_desc = descriptor(dst);
  BladeUnrankedMemRef source{rank, s_desc.data()};
  BladeUnrankedMemRef target{rank, t_desc.data()};
  memrefCopy(static_cast<int64_t>(src.element_size()), &source, &target);
  EXPECT(at::equal(base, expected));
}

// The output tiles winograd_conv3x3 takes on this CPU: F(4x4, 3x3) needs AVX-512.
std::vector<int64_t> winograd_tiles() {
  if (blade::ral::has_cpu_feature("avx512f")) {
    return {2, 4};
  }
  return {2};
}

// Winograd's F(2x2, 3x3) and F(4x4, 3x3) against PyTorch's direct convolution: odd and
// even sizes (tiles that hang over the bottom and right edges), a batch, bias and ReLU or
// neither, channel counts that are not multiples of a vector, on one thread and on
// several; more output channels than tiles (each thread a chunk of them, the last one
// short).
void test_winograd_convolution_matches_direct() {
  struct Case {
    int64_t n, c, h, w, k;
    bool bias, relu;
  };
  const Case cases[] = {{2, 16, 9, 7, 24, true, true}, {1, 33, 6, 11, 17, false, false},
                        {3, 64, 28, 28, 64, true, false}, {1, 20, 1, 1, 16, true, true},
                        {1, 40, 5, 6, 200, true, true}};
  for (const int64_t tile : winograd_tiles()) {
    for (int threads : {1, 3}) {
      at::set_num_threads(threads);
      for (const Case& t : cases) {
        at::manual_seed(t.n * 1000 + t.c);
        const at::Tensor x =
            at::randn({t.n, t.c, t.h, t.w}).contiguous(at::MemoryFormat::ChannelsLast);
        const at::Tensor w = at::randn({t.k, t.c, 3, 3}) * 0.2;
        const at::Tensor b = at::randn({t.k});
        at::Tensor expected = at::conv2d(x, w, t.bias ? b : at::Tensor(), 1, 1);
        if (t.relu) {
          expected = at::relu(expected);
        }
        const at::Tensor transformed = blade::ral::winograd_weight(w, tile);
        at::Tensor out = at::full({t.n, t.h, t.w, t.k}, std::nan(""));   // NHWC
        const bool ran = blade::ral::winograd_conv3x3(
            x.data_ptr<float>(), t.n, t.h, t.w, t.c, transformed.data_ptr<float>(), tile,
            w.data_ptr<float>(), t.k, t.bias ? b.data_ptr<float>() : nullptr, t.relu,
            out.data_ptr<float>());
        EXPECT(ran);
        const at::Tensor got = out.permute({0, 3, 1, 2});
        EXPECT(at::allclose(got, expected, 1e-4, 1e-4));
      }
    }
  }
  at::set_num_threads(2);
}

// F(4x4, 3x3) where its tiles cover the image well (ResNet-50's 56 x 56 and 28 x 28 layers
// at batch 1, its 14 x 14 and 7 x 7 ones at batch 8) on AVX-512; F(2x2, 3x3) where 4x4
// tiles are too few or overhang too much (14 x 14 and 7 x 7 at batch 1, 7 x 7 at batch 4)
// and on CPUs without AVX-512.
void test_winograd_tile_by_image_size() {
  const int64_t large = blade::ral::has_cpu_feature("avx512f") ? 4 : 2;
  EXPECT(blade::ral::winograd_tile(1, 56, 56) == large);
  EXPECT(blade::ral::winograd_tile(1, 28, 28) == large);
  EXPECT(blade::ral::winograd_tile(8, 7, 7) == large);
  EXPECT(blade::ral::winograd_tile(8, 14, 14) == large);
  EXPECT(blade::ral::winograd_tile(4, 7, 7) == 2);
  EXPECT(blade::ral::winograd_tile(1, 14, 14) == 2);
  EXPECT(blade::ral::winograd_tile(1, 7, 7) == 2);
  EXPECT(blade::ral::winograd_tile(1, 1, 1) == 2);
}

// An inf or a NaN in the input lands where the direct convolution puts +-inf and NaN (the
// transforms alone would subtract inf from inf in every output of its tiles), on tiles at
// the edges too, with the output channels in one piece and in a chunk per thread; an input
// mostly inf is declined.
void keeps_inf_and_nan_where_direct_does(int64_t k, int64_t tile) {
  const int64_t n = 2, c = 32, h = 17, w = 15;  // 144 tiles
  at::manual_seed(5);
  const at::Tensor weight = at::randn({k, c, 3, 3}) * 0.2;
  const at::Tensor bias = at::randn({k});
  const at::Tensor transformed = blade::ral::winograd_weight(weight, tile);
  const double inf = std::numeric_limits<double>::infinity();
  for (bool relu : {false, true}) {
    at::Tensor x = at::randn({n, c, h, w}).contiguous(at::MemoryFormat::ChannelsLast);
    x.index_put_({0, 3, 4, 2}, inf);
    x.index_put_({1, 0, 16, 14}, -inf);   // the last row and column: a partial tile
    x.index_put_({1, 7, 0, 0}, std::nan(""));
    at::Tensor expected = at::conv2d(x, weight, bias, 1, 1);
    if (relu) {
      expected = at::relu(expected);
    }
    at::Tensor out = at::zeros({n, h, w, k});
    EXPECT(blade::ral::winograd_conv3x3(x.data_ptr<float>(), n, h, w, c,
                                        transformed.data_ptr<float>(), tile,
                                        weight.data_ptr<float>(),
                                        k, bias.data_ptr<float>(), relu, out.data_ptr<float>()));
    const at::Tensor got = out.permute({0, 3, 1, 2});
    EXPECT(at::equal(got.isnan(), expected.isnan()));
    EXPECT(at::equal(got.isposinf(), expected.isposinf()));
    EXPECT(at::equal(got.isneginf(), expected.isneginf()));
    const at::Tensor finite = expected.isfinite();
    EXPECT(at::allclose(got.masked_select(finite), expected.masked_select(finite), 1e-4, 1e-4));
  }
  const at::Tensor all_inf = at::full({n, h, w, c}, inf);
  at::Tensor out = at::zeros({n, h, w, k});
  EXPECT(!blade::ral::winograd_conv3x3(all_inf.data_ptr<float>(), n, h, w, c,
                                       transformed.data_ptr<float>(), tile,
                                       weight.data_ptr<float>(),
                                       k, bias.data_ptr<float>(), false, out.data_ptr<float>()));
}

void test_winograd_convolution_keeps_inf_and_nan_where_direct_does() {
  at::set_num_threads(2);
  for (const int64_t tile : winograd_tiles()) {
    // one piece; more channels than tiles: 2 chunks of 80
    for (const int64_t k : {40, 160}) {
      keeps_inf_and_nan_where_direct_does(k, tile);
    }
  }
}

void test_memref_copy_of_every_layout() {
  using at::indexing::Slice;
  auto interior = [](const at::Tensor& t) {  // a padded NHWC buffer's inside
    return t.index({Slice(), Slice(1, -1), Slice(1, -1), Slice()});
  };
  auto whole = [](const at::Tensor& t) { return t; };
  // Large (split over the threads): a pooling pad copy, with a batch of two and of one.
  expect_memref_copy(at::randn({2, 112, 112, 64}), at::full({2, 114, 114, 64}, -7.0), interior);
  expect_memref_copy(at::randn({1, 60, 60, 8}), at::full({1, 62, 62, 8}, -7.0), interior);
  // One contiguous run, in chunks with a partial last one.
  expect_memref_copy(at::randn({1000, 333}), at::full({1000, 333}, -7.0), whole);
  // A transpose (runs of one element), large and small.
  expect_memref_copy(at::randn({300, 500}).t(), at::full({500, 300}, -7.0), whole);
  expect_memref_copy(at::randn({5, 3}).t(), at::full({3, 5}, -7.0), whole);
  // Small and strided on both sides; other element sizes; nothing to copy.
  expect_memref_copy(at::randn({4, 9}).index({Slice(), Slice(at::indexing::None, at::indexing::None, 2)}),
                     at::full({6, 7}, -7.0),
                     [](const at::Tensor& t) { return t.index({Slice(1, 5), Slice(1, 6)}); });
  expect_memref_copy(at::arange(200000, at::kLong).reshape({400, 500}),
                     at::full({402, 500}, -7, at::kLong),
                     [](const at::Tensor& t) { return t.index({Slice(1, -1)}); });
  expect_memref_copy(at::ones({3, 5, 7}, at::kByte), at::zeros({3, 5, 7}, at::kByte), whole);
  expect_memref_copy(at::randn({0, 4}), at::full({0, 4}, -7.0), whole);
}

void test_matmul_library_call() {
  at::Tensor a = at::randn({5, 7});
  at::Tensor b = at::randn({3, 7});  // used transposed
  at::Tensor out = at::empty({5, 3});
  auto da = describe<2>(a);
  auto db = describe<2>(b);
  auto dout = describe<2>(out);
  blade_ral_matmul_f32(2, &da, 2, &db, 2, &dout, /*transpose_b=*/1);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out, at::matmul(a, b.t()), 1e-5, 1e-5));

  // Shapes that do not fit: an error is recorded for this thread, nothing is thrown.
  at::Tensor wrong = at::full({4, 4}, 7.0);
  auto dwrong = describe<2>(wrong);
  blade_ral_matmul_f32(2, &da, 2, &db, 2, &dwrong, 1);
  std::string error = blade::ral::take_kernel_error();
  EXPECT(contains(error, "the output buffer has shape [4, 4], the result has shape [5, 3]"));
  EXPECT(at::equal(wrong, at::full({4, 4}, 7.0)));  // untouched, not resized
  EXPECT(wrong.sizes() == at::IntArrayRef({4, 4}));
  EXPECT(blade::ral::take_kernel_error().empty());  // taking it clears it
}

void test_sort_library_call() {
  // Ties everywhere: the kernel is PyTorch's sort and topk, so indices match eager's.
  at::Tensor x = at::randint(-2, 3, {4, 9}, at::kInt);
  at::Tensor values = at::empty({4, 9}, at::kInt);
  at::Tensor indices = at::empty({4, 9}, at::kLong);
  auto dx = describe<2>(x);
  auto dv = describe<2>(values);
  auto di = describe<2>(indices);
  blade_ral_sort_i32(2, &dx, 2, &dv, 2, &di, /*dimension=*/1, /*descending=*/1, 0, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  auto [want_values, want_indices] = at::sort(x, 1, /*descending=*/true);
  EXPECT(at::equal(values, want_values) && at::equal(indices, want_indices));

  at::Tensor top = at::empty({4, 3}, at::kInt);
  at::Tensor top_indices = at::empty({4, 3}, at::kLong);
  auto dt = describe<2>(top);
  auto dti = describe<2>(top_indices);
  blade_ral_sort_i32(2, &dx, 2, &dt, 2, &dti, 1, /*descending=*/0, 0, /*k=*/3);
  EXPECT(blade::ral::take_kernel_error().empty());
  auto [top_values, top_want] = at::topk(x, 3, 1, /*largest=*/false);
  EXPECT(at::equal(top, top_values) && at::equal(top_indices, top_want));

  // Buffers of another shape: an error for this thread, nothing written.
  blade_ral_sort_i32(2, &dx, 2, &dv, 2, &di, 1, 0, 0, /*k=*/3);
  EXPECT(contains(blade::ral::take_kernel_error(),
                  "the output buffer has shape [4, 9], the result has shape [4, 3]"));
  blade_ral_sort_i32(2, &dx, 2, &dt, 2, &dti, /*dimension=*/2, 0, 0, 0);
  EXPECT(contains(blade::ral::take_kernel_error(), "dimension 2 of a tensor of rank 2"));
}

void test_kernel_calls_run_pytorch_ops_from_a_table() {
  using blade::ral::KernelCallTable;
  // kthvalue(x, k=2, dim=1, keepdim=False), then cumprod(x, dim=0, dtype=None).
  KernelCallTable table(
      "aten::kthvalue float32 float32,int64 T0 i2 i1 b0\n"
      "aten::cumprod float32 float32 T0 i0 N");
  EXPECT(table.size() == 2);
  at::Tensor x = at::randn({4, 6});
  at::Tensor values = at::empty({4});
  at::Tensor indices = at::empty({4}, at::kLong);
  at::Tensor products = at::empty({4, 6});
  auto dx = describe<2>(x);
  auto dv = describe<1>(values);
  auto di = describe<1>(indices);
  auto dp = describe<2>(products);
  {
    blade::ral::ActiveKernelCalls active(&table);
    blade_ral_kernel_call_3(0, 2, &dx, 1, &dv, 1, &di);
    EXPECT(blade::ral::take_kernel_error().empty());
    blade_ral_kernel_call_2(1, 2, &dx, 2, &dp);
    EXPECT(blade::ral::take_kernel_error().empty());
    // A result buffer of another size: an error for this thread, the fallback runs.
    blade_ral_kernel_call_2(0, 2, &dx, 1, &dv);
    EXPECT(contains(blade::ral::take_kernel_error(), "the call takes 1 + 2"));
    blade_ral_kernel_call_2(1, 2, &dx, 1, &dv);
    EXPECT(contains(blade::ral::take_kernel_error(), "the engine was compiled for"));
    blade_ral_kernel_call_2(7, 2, &dx, 2, &dp);
    EXPECT(contains(blade::ral::take_kernel_error(), "call 7 of a table of 2"));
  }
  auto [want_values, want_indices] = at::kthvalue(x, 2, 1);
  EXPECT(at::equal(values, want_values) && at::equal(indices, want_indices));
  EXPECT(at::equal(products, at::cumprod(x, 0)));
  // Outside an engine call no table is active.
  blade_ral_kernel_call_2(1, 2, &dx, 2, &dp);
  EXPECT(contains(blade::ral::take_kernel_error(), "no kernel call table is active"));

  // Malformed tables are refused whole, naming the line.
  EXPECT_THROWS_WITH(KernelCallTable("aten::no_such_op float32 float32 T0"), "has no op");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod float32 float32 T0 i0"), "takes 3 arguments");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod float32 float32 T1 i0 N"), "tensor operand 1");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod float32 float32 T0 ix N"), "not an integer");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod complex7 float32 T0 i0 N"), "unknown dtype");
  EXPECT_THROWS_WITH(KernelCallTable("aten::add_.Tensor float32 float32 T0 T0 i1"), "writes into");
  EXPECT_THROWS_WITH(KernelCallTable("prim::Print float32 float32 T0"),
                     "neither an aten op nor one of Blade's int8 ops");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod"), "kernel call 0");
  // NHWC buffers: float32 operands and results of Blade's int8 convolutions only.
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod float32:nhwc float32 T0 i0 N"),
                     "takes no NHWC buffers");
  EXPECT_THROWS_WITH(KernelCallTable("aten::cumprod float32 float32:nhwcx T0 i0 N"),
                     "unknown dtype");
  if (blade::ral::int8_weight_limit() > 0) {
    // A float32 input and result as NHWC buffers: taken.
    EXPECT(KernelCallTable("blade::quantized_conv2d float32:nhwc,int8,float32,float32 "
                           "float32:nhwc T0 T1 T2 N I1,1 I0,0 I1,1 i1 T3 N s6e6f6e65")
               .size() == 1);
    EXPECT_THROWS_WITH(
        KernelCallTable("blade::quantized_conv2d int8:nhwc,int8,float32,float32 float32 "
                        "T0 T1 T2 N I1,1 I0,0 I1,1 i1 T3 N s6e6f6e65"),
        "only float32 buffers may be NHWC");
  }
}

void test_matmul_by_a_param_uses_its_packed_copy() {
  // oneDNN's kernel on every call (no trial against MKL's sgemm, which could win and free
  // the copy on this CPU).
  blade::ral::set_kernel_trials(false);
  at::Tensor weight = at::randn({48, 32});  // a linear layer's [out, in] weight
  blade::ral::PreparedWeights prepared({weight}, /*bf16=*/false);
  at::Tensor x = at::randn({2, 10, 32});
  at::Tensor out = at::empty({2, 10, 48});
  auto dx = describe<3>(x);
  auto dw = describe<2>(weight);
  auto dout = describe<3>(out);
  {
    blade::ral::ActivePreparedWeights active(&prepared);
    for (int call = 0; call < 3; ++call) {
      // oneDNN adds its product into the buffer it writes: whatever the buffer held before
      // (NaN here) must not show through.
      out.fill_(std::numeric_limits<float>::quiet_NaN());
      blade_ral_matmul_f32(3, &dx, 2, &dw, 3, &dout, /*transpose_b=*/1);
      EXPECT(blade::ral::take_kernel_error().empty());
      EXPECT(at::allclose(out, at::matmul(x, weight.t()), 1e-4, 1e-4));
    }
    EXPECT(prepared.packed_count() == 1);  // prepared once, for 20 rows

    // Rows further apart than they are long (a column slice): MKL's packed GEMM, which
    // takes a row stride, instead of oneDNN's dense rows; a second copy.
    at::Tensor padded = at::randn({20, 40});
    at::Tensor rows = padded.slice(1, 0, 32);
    at::Tensor out3 = at::full({20, 48}, std::numeric_limits<float>::quiet_NaN());
    auto drows = describe<2>(rows);
    auto dout3 = describe<2>(out3);
    blade_ral_matmul_f32(2, &drows, 2, &dw, 2, &dout3, 1);
    EXPECT(blade::ral::take_kernel_error().empty());
    EXPECT(at::allclose(out3, at::matmul(rows, weight.t()), 1e-4, 1e-4));
    EXPECT(prepared.packed_count() == 2);

    // Rows that do not fold to one matrix (a strided slice) multiply unpacked, correctly.
    at::Tensor wide = at::randn({2, 10, 64});
    at::Tensor slice = wide.slice(2, 0, 32).transpose(0, 1);  // [10, 2, 32], rows interleaved
    at::Tensor out2 = at::empty({10, 2, 48});
    auto ds = describe<3>(slice);
    auto dout2 = describe<3>(out2);
    blade_ral_matmul_f32(3, &ds, 2, &dw, 3, &dout2, 1);
    EXPECT(at::allclose(out2, at::matmul(slice, weight.t()), 1e-4, 1e-4));
    EXPECT(prepared.packed_count() == 2);
  }
  // Not a param (another tensor with the same shape), or no engine running: not packed.
  at::Tensor other = at::randn({48, 32});
  auto dother = describe<2>(other);
  blade::ral::ActivePreparedWeights active(&prepared);
  blade_ral_matmul_f32(3, &dx, 2, &dother, 3, &dout, 1);
  EXPECT(at::allclose(out, at::matmul(x, other.t()), 1e-4, 1e-4));
  EXPECT(prepared.packed_count() == 2);
  blade::ral::set_kernel_trials(true);
}

void test_a_released_weight_is_written_back_before_a_plain_read() {
  blade::ral::set_kernel_trials(false);  // oneDNN's copy, on any CPU
  std::vector<at::Tensor> params{at::randn({512, 256})};  // [out, in]: 512 KiB, whole pages
  const at::Tensor original = params[0].clone();
  blade::ral::PreparedWeights prepared(params, /*bf16=*/false);
  prepared.set_weight_only({0});
  at::Tensor x = at::randn({64, 256});
  at::Tensor out = at::empty({64, 512});
  auto dx = describe<2>(x);
  auto dw = describe<2>(params[0]);
  auto dout = describe<2>(out);
  const at::Tensor expected = at::matmul(x, original.t());
  const auto multiply = [&] {
    blade::ral::ActivePreparedWeights active(&prepared);
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    blade_ral_matmul_f32(2, &dx, 2, &dw, 2, &dout, /*transpose_b=*/1);
    EXPECT(blade::ral::take_kernel_error().empty());
    EXPECT(at::allclose(out, expected, 1e-4, 1e-4));
  };
  multiply();
  EXPECT(prepared.release_due());
  {
    at::Tensor holder = params[0];  // held by someone else: kept
    prepared.release_plain_weights();
    EXPECT(prepared.released_bytes() == 0);
  }
  prepared.release_plain_weights();
  EXPECT(prepared.released_bytes() >= 512 * 256 * 4 - 2 * 4096);
  multiply();  // through the copy
  EXPECT(prepared.released_bytes() > 0);
  // Rows further apart than they are long: MKL's packed GEMM, whose pack is made from the
  // weight as it is, which is written back first.
  at::Tensor padded = at::randn({64, 300});
  at::Tensor rows = padded.slice(1, 0, 256);
  at::Tensor out2 = at::empty({64, 512});
  auto drows = describe<2>(rows);
  auto dout2 = describe<2>(out2);
  {
    blade::ral::ActivePreparedWeights active(&prepared);
    blade_ral_matmul_f32(2, &drows, 2, &dw, 2, &dout2, 1);
  }
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(prepared.released_bytes() == 0);
  EXPECT(at::equal(params[0], original));
  EXPECT(at::allclose(out2, at::matmul(rows, original.t()), 1e-4, 1e-4));
  prepared.release_plain_weights();  // written back once: kept from then on
  EXPECT(prepared.released_bytes() == 0);
  blade::ral::set_kernel_trials(true);
}

void test_matmul_by_an_untransposed_param_prepares_its_transpose() {
  at::Tensor weight = at::randn({32, 24});  // x @ w: [in, out]
  blade::ral::PreparedWeights prepared({weight}, /*bf16=*/false);
  at::Tensor x = at::randn({16, 32});
  at::Tensor out = at::full({16, 24}, std::numeric_limits<float>::quiet_NaN());
  auto dx = describe<2>(x);
  auto dw = describe<2>(weight);
  auto dout = describe<2>(out);
  blade::ral::ActivePreparedWeights active(&prepared);
  for (int call = 0; call < 2; ++call) {
    blade_ral_matmul_f32(2, &dx, 2, &dw, 2, &dout, /*transpose_b=*/0);
    EXPECT(blade::ral::take_kernel_error().empty());
    EXPECT(at::allclose(out, at::matmul(x, weight), 1e-4, 1e-4));
  }
  EXPECT(prepared.packed_count() == 1);
}

at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& mask, double scale) {
  return at::matmul(at::softmax(at::matmul(q, k.transpose(-1, -2)) * scale + mask, -1), v);
}

void test_attention_library_call() {
  // float32 runs Blade's fused kernel; strided q (heads of a fused projection), a padding
  // mask broadcast over heads and queries, a ragged key count, and one query row whose
  // mask excludes every key (NaN, as softmax gives unfused, or 0 with zero_masked_rows).
  at::Tensor projection = at::randn({2, 37, 3 * 16});
  at::Tensor q = projection.slice(2, 0, 16).view({2, 37, 2, 8}).transpose(1, 2);
  at::Tensor k = at::randn({2, 2, 37, 8});
  at::Tensor v = at::randn({2, 2, 37, 5});
  at::Tensor mask = at::zeros({2, 1, 37, 37});
  mask.select(0, 1).select(1, 4).fill_(-std::numeric_limits<float>::infinity());
  mask.select(0, 0).slice(2, 30).fill_(-1e4);
  at::Tensor out = at::empty({2, 2, 37, 5});
  auto dq = describe<4>(q);
  auto dk = describe<4>(k);
  auto dv = describe<4>(v);
  auto dmask = describe<4>(mask);
  auto dout = describe<4>(out);
  blade_ral_attention_masked_f32(4, &dq, 4, &dk, 4, &dv, 4, &dmask, 4, &dout, 0, 0, 0.3, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  at::Tensor expected = reference_attention(q, k, v, mask, 0.3);
  EXPECT(at::isnan(out.select(0, 1).select(1, 4)).all().item<bool>());
  EXPECT(at::allclose(out, expected, 1e-4, 1e-5, /*equal_nan=*/true));
  // With zero_masked_rows (scaled_dot_product_attention's semantics) that row is 0.
  at::Tensor expected_zeroed = expected.nan_to_num(0.0);
  blade_ral_attention_masked_f32(4, &dq, 4, &dk, 4, &dv, 4, &dmask, 4, &dout, 0, 0, 0.3, 1);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::equal(out.select(0, 1).select(1, 4), at::zeros({2, 5})));
  EXPECT(at::allclose(out, expected_zeroed, 1e-4, 1e-5));

  // float64 takes PyTorch's own kernels (its fused one needs v's head size to be q's).
  at::Tensor out64 = at::empty({2, 2, 37, 5}, at::kDouble);
  at::Tensor q64 = q.to(at::kDouble), k64 = k.to(at::kDouble), v64 = v.to(at::kDouble);
  at::Tensor mask64 = mask.to(at::kDouble);
  auto dq64 = describe<4>(q64);
  auto dk64 = describe<4>(k64);
  auto dv64 = describe<4>(v64);
  auto dmask64 = describe<4>(mask64);
  auto dout64 = describe<4>(out64);
  blade_ral_attention_masked_f64(4, &dq64, 4, &dk64, 4, &dv64, 4, &dmask64, 4, &dout64, 0, 0,
                                 0.3, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out64, expected.to(at::kDouble), 1e-4, 1e-5, /*equal_nan=*/true));
  blade_ral_attention_masked_f64(4, &dq64, 4, &dk64, 4, &dv64, 4, &dmask64, 4, &dout64, 0, 0,
                                 0.3, 1);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out64, expected_zeroed.to(at::kDouble), 1e-4, 1e-5));
  // float64 with v's head size equal to q's: PyTorch's fused kernel, whose 0 rows stay 0
  // with zero_masked_rows and become NaN without.
  at::Tensor v64_square = at::randn({2, 2, 37, 8}, at::kDouble);
  at::Tensor out64_square = at::empty({2, 2, 37, 8}, at::kDouble);
  auto dv64_square = describe<4>(v64_square);
  auto dout64_square = describe<4>(out64_square);
  const at::Tensor expected_square =
      reference_attention(q64, k64, v64_square, mask64, 0.3);
  for (int64_t zero_rows : {0, 1}) {
    blade_ral_attention_masked_f64(4, &dq64, 4, &dk64, 4, &dv64_square, 4, &dmask64, 4,
                                   &dout64_square, 0, 0, 0.3, zero_rows);
    EXPECT(blade::ral::take_kernel_error().empty());
    EXPECT(at::allclose(out64_square,
                        zero_rows != 0 ? expected_square.nan_to_num(0.0) : expected_square,
                        1e-4, 1e-5, /*equal_nan=*/true));
    EXPECT(at::isnan(out64_square.select(0, 1).select(1, 4)).all().item<bool>() ==
           (zero_rows == 0));
  }

  // k stored transposed ([..., head dim, keys]), no mask.
  at::Tensor k_t = k.transpose(-1, -2).contiguous();
  auto dkt = describe<4>(k_t);
  blade_ral_attention_f32(4, &dq, 4, &dkt, 4, &dv, 4, &dout, /*transpose_k=*/1, 0, 0.3, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out, reference_attention(q, k, v, at::zeros({1}), 0.3), 1e-4, 1e-5));

  // A negative scale, on the ragged key count (exp_rows applies it, not the GEMM).
  blade_ral_attention_masked_f32(4, &dq, 4, &dk, 4, &dv, 4, &dmask, 4, &dout, 0, 0, -0.3, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out, reference_attention(q, k, v, mask, -0.3), 1e-4, 1e-5,
                      /*equal_nan=*/true));
  // q and v with unit stride along their columns: MKL's sgemm reads them as they are.
  at::Tensor q_columns = at::randn({2, 2, 8, 37}).transpose(-1, -2);
  at::Tensor v_columns = at::randn({2, 2, 5, 37}).transpose(-1, -2);
  auto dq_columns = describe<4>(q_columns);
  auto dv_columns = describe<4>(v_columns);
  blade_ral_attention_masked_f32(4, &dq_columns, 4, &dk, 4, &dv_columns, 4, &dmask, 4, &dout,
                                 0, 0, 0.3, 0);
  EXPECT(blade::ral::take_kernel_error().empty());
  EXPECT(at::allclose(out, reference_attention(q_columns, k, v_columns, mask, 0.3), 1e-4,
                      1e-5, /*equal_nan=*/true));

  // A mask that does not broadcast to the scores: an error, and nothing written.
  at::Tensor wrong_mask = at::zeros({3, 1, 1, 37});
  auto dwrong = describe<4>(wrong_mask);
  out.fill_(7.0);
  blade_ral_attention_masked_f32(4, &dq, 4, &dk, 4, &dv, 4, &dwrong, 4, &dout, 0, 0, 0.3, 0);
  EXPECT(contains(blade::ral::take_kernel_error(),
                  "the mask [3, 1, 1, 37] does not broadcast to the scores [2, 2, 37, 37]"));
  EXPECT(at::equal(out, at::full({2, 2, 37, 5}, 7.0)));
}

void test_conv2d_with_bias_and_relu_library_call() {
  // NHWC data viewed as NCHW with channels_last strides, as the generated code passes it.
  at::Tensor x = at::randn({2, 5, 9, 4}).permute({0, 3, 1, 2});  // N, C=4, H=5, W=9
  at::Tensor w = at::randn({6, 4, 3, 3});
  at::Tensor bias = at::randn({1, 1, 6});  // any shape with one value per channel
  at::Tensor out_nhwc = at::full({2, 5, 9, 6}, 3.0);
  auto dx = describe<4>(x.permute({0, 2, 3, 1}));
  auto dw = describe<4>(w);
  auto db = describe<3>(bias);
  auto dout = describe<4>(out_nhwc);
  for (int64_t relu : {0, 1}) {
    blade_ral_conv2d_nhwc_bias_f32(4, &dx, 4, &dw, 3, &db, 4, &dout, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                   relu);
    EXPECT(blade::ral::take_kernel_error().empty());
    at::Tensor expected = at::conv2d(x, w, bias.reshape({-1}), 1, 1);
    expected = relu != 0 ? at::relu(expected) : expected;
    EXPECT(at::allclose(out_nhwc.permute({0, 3, 1, 2}), expected, 1e-4, 1e-4));
  }
  // A bias of the wrong length: an error naming both counts.
  at::Tensor short_bias = at::randn({5});
  auto dshort = describe<1>(short_bias);
  blade_ral_conv2d_nhwc_bias_f32(4, &dx, 4, &dw, 1, &dshort, 4, &dout, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                 1);
  EXPECT(contains(blade::ral::take_kernel_error(), "a bias of 5 values for 6 output channels"));
}

void mark_rows(int64_t begin, int64_t end, void** arguments) {
  auto* counts = static_cast<std::atomic<int>*>(arguments[0]);
  for (int64_t i = begin; i < end; ++i) {
    counts[i].fetch_add(1);
  }
}

void test_cpu_flags_are_read_from_x86_and_arm_cpuinfo() {
  std::istringstream x86(
      "processor\t: 0\nflags\t\t: fpu avx2 avx512f\nvmx flags\t: vnmi\n"
      "processor\t: 1\nflags\t\t: fpu\n");
  EXPECT((blade::ral::parse_cpu_flags(x86) == std::set<std::string>{"fpu", "avx2", "avx512f"}));
  std::istringstream arm("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\n");
  EXPECT((blade::ral::parse_cpu_flags(arm) == std::set<std::string>{"fp", "asimd", "sve"}));
  std::istringstream neither("processor\t: 0\nflagship: yes\nflags\n");
  EXPECT(blade::ral::parse_cpu_flags(neither).empty());
}

void test_parallel_for_covers_every_row_once() {
  for (int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    std::vector<std::atomic<int>> counts(1000);
    void* arguments[] = {counts.data()};
    blade_ral_parallel_for(1000, 7, mark_rows, arguments);
    bool once = true;
    for (auto& c : counts) {
      once = once && c.load() == 1;
    }
    EXPECT(once);
  }
}

// Every task exactly once, whatever the threads. The thread that takes task 0 as its run's
// owner holds it until every other thread that started has run out of tasks: they take the
// rest of its run from the back. Nested in a parallel region, one thread runs every run.
void test_task_runs_take_every_task_once() {
  for (int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    for (int64_t count : {1, 2, 7, 64}) {
      std::vector<std::atomic<int>> taken(count);
      std::vector<std::thread::id> by(count);
      std::atomic<int> started{0}, idle{0};
      std::atomic<bool> held{false};
      std::thread::id holder;
      blade::ral::run_task_runs(count, [&](const auto& take) {
        started.fetch_add(1);
        int64_t task = 0, end = 0;
        bool first = true;
        while (take(task, end)) {
          EXPECT(task < end && end <= count);
          taken[task].fetch_add(1);
          by[task] = std::this_thread::get_id();
          if (first && task == 0 && end > 1) {  // run 0's owner, from its front
            holder = std::this_thread::get_id();
            held = true;
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while ((started.load() < 2 || idle.load() < started.load() - 1) &&
                   std::chrono::steady_clock::now() < deadline) {
              std::this_thread::yield();
            }
          }
          first = false;
        }
        idle.fetch_add(1);
      });
      bool once = true;
      for (auto& t : taken) {
        once = once && t.load() == 1;
      }
      EXPECT(once);
      const int64_t runs = std::min<int64_t>(threads, count);
      if (held && started.load() > 1) {
        for (int64_t t = 1; t < (count + runs - 1) / runs; ++t) {
          EXPECT(by[t] != holder);
        }
      }
    }
  }
  at::set_num_threads(2);
  std::vector<std::atomic<int>> taken(50);
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end_region) {
    for (int64_t region = begin; region < end_region; ++region) {
      blade::ral::run_task_runs(25, [&](const auto& take) {
        int64_t task = 0, end = 0;
        while (take(task, end)) {
          taken[25 * region + task].fetch_add(1);
        }
      });
    }
  });
  bool once = true;
  for (auto& t : taken) {
    once = once && t.load() == 1;
  }
  EXPECT(once);
}

// --- saved engines --------------------------------------------------------------------------

void test_saved_model_runs_compiled_code() {
  auto module = load_model("model.pt");
  auto inputs = load_list("inputs.pt");
  auto expected = load_list("expected.pt");
  auto engine = engine_of(module);
  EXPECT(engine->is_compiled());
  EXPECT(engine->load_error().empty());
  int64_t live = blade_ral_live_allocations();
  for (int i = 0; i < 200; ++i) {
    EXPECT(same_outputs(module.forward(inputs), expected));
  }
  EXPECT(blade_ral_live_allocations() == live);
  EXPECT(engine->stats().calls == 200);
  EXPECT(engine->stats().fallbacks == 0);
}

// The code of a dynamic engine allocates its outputs; the tensors made of them free them.
void test_dynamic_engine_serves_every_batch_and_frees_its_outputs() {
  auto module = load_model("dynamic.pt");
  auto inputs = load_list("dynamic_inputs.pt");
  auto expected = load_list("dynamic_expected.pt");
  auto engine = engine_of(module);
  EXPECT(engine->is_compiled());
  EXPECT(contains(engine->input_specs(), "s0"));
  int64_t live = blade_ral_live_allocations();
  for (int round = 0; round < 50; ++round) {
    for (size_t i = 0; i + 1 < inputs.size(); i += 2) {
      std::vector<c10::IValue> pair{inputs[i], inputs[i + 1]};
      auto out = module.forward(pair).toTuple();
      for (size_t k = 0; k < 2; ++k) {
        EXPECT(at::allclose(out->elements()[k].toTensor(), expected[i + k].toTensor(), 1e-5,
                            1e-5));
      }
    }
  }
  EXPECT(blade_ral_live_allocations() == live);
  EXPECT(engine->stats().fallbacks == 0);
  EXPECT(engine->stats().calls == 150);
}

// An engine that writes into the states it is given: after each call they hold what eager
// leaves in them; states that share memory are refused by the guard.
void test_engine_writes_into_its_inputs() {
  auto module = load_model("states.pt");
  auto inputs = load_list("states_inputs.pt");
  auto expected = load_list("states_expected.pt");
  auto engine = engine_of(module);
  EXPECT(engine->is_compiled());
  EXPECT(engine->writes().find(';') != std::string::npos);  // both states
  std::vector<c10::IValue> mine;
  for (const auto& input : inputs) {
    mine.push_back(input.toTensor().clone());
  }
  int64_t live = blade_ral_live_allocations();
  for (int call = 0; call < 2; ++call) {
    EXPECT(at::allclose(module.forward(mine).toTensor(), expected[call].toTensor(), 1e-5,
                        1e-5));
  }
  for (int state = 0; state < 2; ++state) {
    EXPECT(at::allclose(mine[state].toTensor(), expected[2 + state].toTensor(), 1e-5, 1e-5));
  }
  EXPECT(blade_ral_live_allocations() == live);
  EXPECT(engine->stats().calls == 2 && engine->stats().fallbacks == 0);
  std::vector<c10::IValue> shared = mine;
  shared[1] = shared[0];
  module.forward(shared);
  EXPECT(contains(guard_of(module)->last_fallback_reason(), "shares memory with input 1"));
  EXPECT(engine->stats().calls == 2);
}

// int8 kernel calls (uint8 handed between convolutions, a residual add folded into one, a
// uint8 max pooling): the saved model's own results, every call, nothing left allocated.
void test_int8_engine_runs_its_kernel_calls() {
  if (!std::ifstream(g_fixtures + "/int8.pt")) {
    std::cout << "  (no int8.pt: this CPU has no int8 kernels)\n";
    return;
  }
  auto module = load_model("int8.pt");
  auto inputs = load_list("int8_inputs.pt");
  auto expected = load_list("int8_expected.pt");
  auto engine = engine_of(module);
  EXPECT(engine->is_compiled());
  int64_t live = blade_ral_live_allocations();
  for (int i = 0; i < 20; ++i) {
    EXPECT(at::allclose(module.forward(inputs).toTensor(), expected[0].toTensor(), 1e-5,
                        1e-5));
  }
  EXPECT(blade_ral_live_allocations() == live);
  EXPECT(engine->stats().calls == 20 && engine->stats().fallbacks == 0);
}

void test_wrong_inputs_fall_back_or_raise_per_mode() {
  auto module = load_model("model.pt");
  std::vector<c10::IValue> wrong{at::randn({3, 8}), at::randn({3, 16})};
  auto out = module.forward(wrong).toTuple();
  EXPECT(out->elements()[0].toTensor().sizes() == at::IntArrayRef({3, 16}));
  auto guard = guard_of(module);
  EXPECT(guard->fallbacks() == 1);
  EXPECT(contains(guard->last_fallback_reason(), "size of dim 0 is 3, expected 4"));
  EXPECT(engine_of(module)->stats().calls == 0);
  // The engine itself, given such inputs, runs its subgraph (it takes y, then x).
  auto engine = engine_of(module);
  auto direct = engine->execute({at::randn({3, 16}), at::randn({3, 8})});
  EXPECT(direct.size() == 2 && direct[0].size(0) == 3);
  EXPECT(engine->stats().fallbacks == 1);
  EXPECT(contains(engine->last_fallback_reason(), "size of dim 0 is 3, expected 4"));

  auto strict = load_model("strict.pt");
  EXPECT_THROWS_WITH(strict.forward(wrong), "optimized for (float32[4,8];float32[4,16])");
  EXPECT_THROWS_WITH(strict.forward(wrong), "got (float32[3,8];float32[3,16])");
  EXPECT_THROWS_WITH(engine_of(strict)->execute({at::randn({3, 16}), at::randn({3, 8})}),
                     "blade_engine_0");
}

void test_tampered_engines_fall_back_with_the_reason() {
  auto inputs = load_list("tanh_input.pt");
  auto expected = load_list("tanh_expected.pt");
  struct Case {
    const char* file;
    const char* reason;
  };
  for (const Case& c :
       {Case{"flipped.pt", "does not match its contents"}, Case{"future.pt", "format"}}) {
    auto module = load_model(c.file);
    auto engine = engine_of(module);
    EXPECT(!engine->is_compiled());
    EXPECT(contains(engine->load_error(), c.reason));
    EXPECT(same_outputs(module.forward(inputs), expected));
    EXPECT(engine->stats().fallbacks == 1);
  }
}

// Every file of hostile/ (make_fixtures.py): the engine refuses its code, the foreign
// library's constructor never runs, and the model gives eager's results through its subgraph.
void test_hostile_files_never_run_their_code() {
  auto inputs = load_list("tanh_input.pt");
  auto expected = load_list("tanh_expected.pt");
  int seen = 0;
  if (DIR* dir = ::opendir((g_fixtures + "/hostile").c_str())) {
    while (dirent* entry = ::readdir(dir)) {
      std::string file = entry->d_name;
      if (file.size() < 4 || file.substr(file.size() - 3) != ".pt") {
        continue;
      }
      ++seen;
      auto module = load_model("hostile/" + file);
      auto engine = engine_of(module);
      if (engine->is_compiled() || engine->load_error().empty()) {
        std::cerr << "  hostile/" << file << " was not refused\n";
      }
      EXPECT(!engine->is_compiled());
      EXPECT(!engine->load_error().empty());
      EXPECT(same_outputs(module.forward(inputs), expected));
      EXPECT(engine->stats().fallbacks == 1);
    }
    ::closedir(dir);
  }
  EXPECT(seen >= 7);
  std::ifstream marker(g_fixtures + "/hostile_marker");
  EXPECT(!marker.good());
}

void test_foreign_model_runs_once_its_key_is_trusted() {
  std::ifstream in(g_fixtures + "/foreign_key.txt");
  std::string key;
  in >> key;
  auto inputs = load_list("tanh_input.pt");
  auto expected = load_list("foreign_expected.pt");
  {
    auto module = load_model("foreign.pt");
    EXPECT(!engine_of(module)->is_compiled());
    EXPECT(contains(engine_of(module)->load_error(), "signed by key " + key));
    EXPECT(same_outputs(module.forward(inputs), expected));
  }
  blade::ral::trust_public_key(key);
  auto module = load_model("foreign.pt");
  EXPECT(engine_of(module)->is_compiled());
  EXPECT(same_outputs(module.forward(inputs), expected));
  EXPECT(engine_of(module)->stats().fallbacks == 0);
}

void test_four_threads_share_one_module() {
  auto module = load_model("model.pt");
  auto inputs = load_list("inputs.pt");
  auto expected = load_list("expected.pt");
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        // Each thread its own inputs too: same values, different storage.
        std::vector<c10::IValue> own{inputs[0].toTensor().clone(), inputs[1].toTensor().clone()};
        try {
          if (!same_outputs(module.forward(own), expected)) {
            ++wrong[t];
          }
        } catch (const std::exception& e) {
          ++wrong[t];
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (int t = 0; t < 4; ++t) {
    EXPECT(wrong[t] == 0);
  }
  EXPECT(engine_of(module)->stats().calls == 400);
  EXPECT(engine_of(module)->stats().fallbacks == 0);
}

void test_loading_and_unloading_releases_code() {
  auto inputs = load_list("inputs.pt");
  auto expected = load_list("expected.pt");
  {  // first load: libtorch's own one-time state is created here, not counted below
    auto module = load_model("model.pt");
    module.forward(inputs);
  }
  int fds = open_fds();
  for (int i = 0; i < 30; ++i) {
    auto module = load_model("model.pt");
    EXPECT(same_outputs(module.forward(inputs), expected));
  }
  EXPECT(open_fds() == fds);  // each engine's memory file closed with its code
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " FIXTURE_DIR  (tests/ral/make_fixtures.py)\n";
    return 2;
  }
  g_fixtures = argv[1];
  const std::vector<std::pair<const char*, std::function<void()>>> tests = {
      {"specs_round_trip_and_explain_mismatches", test_specs_round_trip_and_explain_mismatches},
      {"symbols_tie_dynamic_dims_together", test_symbols_tie_dynamic_dims_together},
      {"signatures_cover_every_field_and_need_a_trusted_key",
       test_signatures_cover_every_field_and_need_a_trusted_key},
      {"hostile_files_never_run_their_code", test_hostile_files_never_run_their_code},
      {"foreign_model_runs_once_its_key_is_trusted",
       test_foreign_model_runs_once_its_key_is_trusted},
      {"garbage_code_is_refused_without_leaking_descriptors",
       test_garbage_code_is_refused_without_leaking_descriptors},
      {"allocator_balances", test_allocator_balances},
      {"freed_buffers_are_reused_and_released", test_freed_buffers_are_reused_and_released},
      {"memref_copy_of_every_layout", test_memref_copy_of_every_layout},
      {"winograd_convolution_matches_direct", test_winograd_convolution_matches_direct},
      {"winograd_tile_by_image_size", test_winograd_tile_by_image_size},
      {"winograd_convolution_keeps_inf_and_nan_where_direct_does",
       test_winograd_convolution_keeps_inf_and_nan_where_direct_does},
      {"matmul_library_call", test_matmul_library_call},
      {"sort_library_call", test_sort_library_call},
      {"kernel_calls_run_pytorch_ops_from_a_table",
       test_kernel_calls_run_pytorch_ops_from_a_table},
      {"matmul_by_a_param_uses_its_packed_copy", test_matmul_by_a_param_uses_its_packed_copy},
      {"a_released_weight_is_written_back_before_a_plain_read",
       test_a_released_weight_is_written_back_before_a_plain_read},
      {"matmul_by_an_untransposed_param_prepares_its_transpose",
       test_matmul_by_an_untransposed_param_prepares_its_transpose},
      {"attention_library_call", test_attention_library_call},
      {"conv2d_with_bias_and_relu_library_call", test_conv2d_with_bias_and_relu_library_call},
      {"cpu_flags_are_read_from_x86_and_arm_cpuinfo",
       test_cpu_flags_are_read_from_x86_and_arm_cpuinfo},
      {"parallel_for_covers_every_row_once", test_parallel_for_covers_every_row_once},
      {"task_runs_take_every_task_once", test_task_runs_take_every_task_once},
      {"saved_model_runs_compiled_code", test_saved_model_runs_compiled_code},
      {"engine_writes_into_its_inputs", test_engine_writes_into_its_inputs},
      {"int8_engine_runs_its_kernel_calls", test_int8_engine_runs_its_kernel_calls},
      {"wrong_inputs_fall_back_or_raise_per_mode", test_wrong_inputs_fall_back_or_raise_per_mode},
      {"dynamic_engine_serves_every_batch_and_frees_its_outputs",
       test_dynamic_engine_serves_every_batch_and_frees_its_outputs},
      {"tampered_engines_fall_back_with_the_reason", test_tampered_engines_fall_back_with_the_reason},
      {"four_threads_share_one_module", test_four_threads_share_one_module},
      {"loading_and_unloading_releases_code", test_loading_and_unloading_releases_code},
  };
  int failed_tests = 0;
  for (const auto& [name, test] : tests) {
    int before = g_failures;
    try {
      test();
    } catch (const std::exception& e) {
      std::cerr << "  FAILED: unexpected exception: " << e.what() << "\n";
      ++g_failures;
    }
    bool ok = g_failures == before;
    failed_tests += ok ? 0 : 1;
    std::cout << (ok ? "PASS " : "FAIL ") << name << std::endl;
  }
  std::cout << tests.size() - failed_tests << " passed, " << failed_tests << " failed"
            << std::endl;
  return failed_tests == 0 ? 0 : 1;
}
