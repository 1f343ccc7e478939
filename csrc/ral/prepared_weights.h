// Weights prepared once per engine for PyTorch's kernels: oneDNN's reordered weights for
// GEMMs and NHWC convolutions, MKL's packed B operand for GEMMs oneDNN does not take,
// channels_last copies for NHWC convolutions whose weight gets no oneDNN copy, Winograd's
// form of 3x3 convolution weights.
//
// oneDNN (PyTorch's mkldnn convolution) reorders a plain weight into its blocked layout on
// every call; `onednn_weight` makes that reordered copy once per input size (what
// Inductor's frozen convolutions do). A GEMM by a weight runs as oneDNN's 1x1 convolution
// over the rows (matmul_kernels.cpp): measured on an AVX-512 AMD host at 2 threads, oneDNN's
// kernels took 0.55-0.85 of MKL's packed sgemm for the bert and mlp shapes, MKL taking its
// AVX2 code there; on an AVX2 host MKL's plain sgemm often wins, so each engine times the
// two on its first calls (next_kernel below).
//
// A linear layer's weight is a constant of the engine (a param), multiplied by a batch of
// rows on every call. MKL reorders the weight into its own blocked layout inside every
// sgemm call; `cblas_sgemm_pack` does it once, and `cblas_sgemm_compute` then multiplies
// by the packed copy (as TorchScript's frozen `mkl_linear` does). The packed copy is made
// by the engine's first call that multiplies by the weight and lives as long as the engine.
// MKL's packed layout depends on the number of rows, so each weight keeps packs for a few
// row counts (a dynamic engine's other batches run unpacked). Where libtorch has no MKL
// (mkl_functions.h), nothing is packed and matmuls run as before.
//
// An engine built with precision='bf16' multiplies and convolves by its weights in
// bfloat16 with float32 accumulation (about twice float32's throughput): on AVX512-BF16
// without AMX by Blade's kernel (float_conv.h) and a pack of each weight (`bf16_conv`,
// `bf16_linear`), which rounds the float32 rows or NHWC input as it reads them and writes
// the float32 sums; elsewhere by oneDNN's kernels and a bfloat16 copy (`bf16_matrix`, or
// `onednn_weight` with `bf16`), the input rounded on each call and the result (rounded to
// bfloat16 by oneDNN, as autocast's is) widened into the engine's float32 buffer. A
// convolution keeps that or its float32 kernels, whichever its precision trial finds
// faster. Everything else the engine computes stays float32.
//
// One class, three files: the copies (prepared_weights.cpp), the kernel trials that decide
// which copy a weight keeps (kernel_trials.cpp, kernel_trials.h) and the release of the
// plain values of weights only their copies are read from (weight_release.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace blade::ral {

// The most memory (bytes, process-wide) prepared copies may take; a copy that would go
// past it is not made, and its weight is used as it is (slower: oneDNN reorders it on
// every call, MKL packs it inside every sgemm). Negative: no limit (the default); 0: no
// copies. Copies made earlier stay.
void set_prepared_weights_limit(int64_t bytes);
// The bytes the prepared copies of all engines in this process hold.
int64_t prepared_weights_bytes();

// The int8_weight key of Blade's own int8 convolution pack (int8_conv.h): one for every
// input size, where oneDNN's keys start with the input's sizes.
inline const std::vector<int64_t> kInt8ConvKey{-1};
// And of Blade's int8 matrix-vector product (int8_gemv.h): a linear layer's few rows.
inline const std::vector<int64_t> kInt8GemvKey{-2};

// The input size in the key of oneDNN's copy of a weight (onednn_weight): a bfloat16
// copy's ends in -3, so that a convolution's float32 and bfloat16 copies never share one.
inline std::vector<int64_t> onednn_key_size(std::vector<int64_t> input_size, bool bf16) {
  if (bf16) {
    input_size.push_back(-3);
  }
  return input_size;
}

// The input size in the key of a linear layer's precision trial in a bf16 engine
// (PreparedWeights::run_trial with kBf16): its rows' [1, K, 1, rows] and -4, so that it
// never shares a key with the float32 path's own trial for those rows.
inline constexpr int64_t kMatmulPrecisionMark = -4;
inline std::vector<int64_t> matmul_precision_key(std::vector<int64_t> input_size) {
  input_size.push_back(kMatmulPrecisionMark);
  return input_size;
}

class PreparedWeights {
 public:
  PreparedWeights(const std::vector<at::Tensor>& params, bool bf16);
  ~PreparedWeights();
  PreparedWeights(const PreparedWeights&) = delete;
  PreparedWeights& operator=(const PreparedWeights&) = delete;

  // out[M, N] = lhs[M, K] @ op(rhs) with a packed rhs, where `rhs` is a param ([N, K] with
  // `transposed`, else [K, N]) and the 2-d operands have unit column stride and row strides
  // lda/ldc. False when this call cannot use a packed weight (the caller multiplies).
  bool matmul_f32(const float* lhs, int64_t lda, const at::Tensor& rhs, bool transposed,
                  float* out, int64_t ldc, int64_t m);

  // Whether the engine's GEMMs by its params run in bfloat16, and its convolutions in
  // bfloat16 where their precision trials keep it.
  bool bf16() const { return bf16_; }

  // A 2-d param as the [N, K] bfloat16 matrix a linear layer multiplies by (`weight` is
  // [N, K] when `transposed`, else [K, N]), made once; an undefined tensor when `weight` is
  // not a float32 param or the copy would pass the limit.
  at::Tensor bf16_matrix(const at::Tensor& weight, bool transposed);

  // A 2-d float32 param as the matrix op(weight) [K, N] (`weight` is [N, K] when
  // `transposed`, else [K, N]; a 1x1 convolution's [O, C, 1, 1] is [N, K]), made once for
  // every row count: what blocked_gemm reads. A copy is in column panels ([ceil(N / 64), K,
  // 64]: blocked_gemm.h's column_panels); an untransposed dense weight is the [K, N] matrix
  // already, returned as it is (the param itself, then never released). Undefined when
  // `weight` is not such a param or the copy would pass the limit.
  at::Tensor k_by_n(const at::Tensor& weight, bool transposed);

  // A param reordered into oneDNN's layout for convolving an input of `input_size`
  // ([N, C, H, W]): a convolution weight [O, I/groups, kh, kw], or a GEMM's 2-d rhs as the
  // 1x1 convolution weight [N, K, 1, 1] (rhs is [N, K] when `transposed`, else [K, N]).
  // Made once per input size, for at most a few; an undefined tensor when `weight` is not
  // a param or has all its copies (the caller then uses the weight as it is). With `bf16`
  // the copy is bfloat16, for a bfloat16 input, kept under its own key (a bf16 engine's
  // convolution may hold both while its precision trial runs: kBf16 below).
  at::Tensor onednn_weight(const at::Tensor& weight, bool transposed,
                           const std::vector<int64_t>& input_size,
                           const std::vector<int64_t>& padding,
                           const std::vector<int64_t>& stride,
                           const std::vector<int64_t>& dilation, int64_t groups,
                           bool bf16 = false);

  // A convolution weight in channels_last layout (what oneDNN reads for NHWC data), made
  // once if `weight` is a param; otherwise `weight` itself.
  at::Tensor channels_last(const at::Tensor& weight);

  // A float32 3x3 convolution weight in Winograd's form for output tiles of `tile`
  // (winograd.h), made once if `weight` is a param; otherwise an undefined tensor (the
  // caller convolves directly).
  at::Tensor winograd(const at::Tensor& weight, int64_t tile);
  // A depthwise convolution's float32 param [C, 1, kh, kw] as its filters [kh, kw, C]
  // (depthwise_conv.h), made once for every input size; undefined when `weight` is not
  // such a param or the copy would pass the limit.
  at::Tensor depthwise(const at::Tensor& weight);
  // A float32 convolution param [O, C, kh, kw] as Blade's bfloat16 kernel multiplies it
  // (float_conv.h), made once for every input size; undefined when `weight` is not such a
  // param or the copy would pass the limit.
  at::Tensor bf16_conv(const at::Tensor& weight);
  // The same param as Blade's float32 kernel multiplies it (float_conv.h).
  at::Tensor f32_conv(const at::Tensor& weight);
  // The same pack of a linear layer's [N, K] float32 param, as the [N, K, 1, 1] filter the
  // float32 tiles multiply rows by (matmul_kernels.cpp); undefined where f32_conv's would be.
  at::Tensor f32_linear(const at::Tensor& weight);
  // A 2-d float32 param as that pack of the 1x1 convolution weight [N, K, 1, 1] of the
  // linear layer multiplying by it (`weight` is [N, K] when `transposed`, else [K, N]),
  // made once for every row count; undefined as above.
  at::Tensor bf16_linear(const at::Tensor& weight, bool transposed);
  // An int8 weight as oneDNN's packed copy (`pack()`: onednn::qlinear_prepack or
  // qconv_prepack), made once per `key` (what else the packing depends on: a convolution's
  // input size, strides, input range) if `weight` is a param; otherwise an undefined
  // tensor (the caller packs it).
  at::Tensor int8_weight(const at::Tensor& weight, const std::vector<int64_t>& key,
                         const std::function<at::Tensor()>& pack);

  // Kernel trials (kernel_trials.cpp).
  //
  // Kernels with a second way to compute them: 3x3 convolutions (Winograd's algorithm or
  // oneDNN's direct one), 1x1 convolutions and GEMMs by a weight (MKL's sgemm on the
  // weight as it is, or oneDNN's convolution by its reordered copy; on AVX-512 a 1x1
  // convolution's alternative, and a linear layer's for more than a few rows, is Blade's
  // float32 kernel instead, kF32Tiles, float_conv.h).
  // Which is faster depends on the CPU as much as on the sizes: Winograd wins on large
  // images with few channels and loses on small ones with many, and where it wins moves
  // with the cache sizes; MKL's sgemm beats oneDNN's 1x1 convolution on AVX2 hosts, where
  // oneDNN's AVX-512 kernels beat MKL's AVX2 ones on AVX-512 hosts. (MKL's packed copies
  // are no alternative: larger than a BERT weight, where its sgemm needs no copy and was as
  // fast.) So the engine's own calls decide, per weight and oneDNN input size: the first
  // call runs both, untimed (each prepares its weight copy, and oneDNN creates its kernel),
  // the next time each on its staggered turns (kernel_trials.cpp), the alternative on the
  // calls between, then the faster stays and the other's copy is freed: from
  // kernel_trial_calls() calls on, a loaded model holds what it keeps (and gives back what
  // release_plain_weights can). Both give the result within float32 rounding (a precision
  // trial's: within bfloat16's).
  enum class Kernel { kOneDnn, kWinograd, kGemm, kDepthwise, kInt8Conv, kBf16, kF32Tiles };
  // int8 convolutions have a trial too: oneDNN's qconv2d (its pack in int8_weight, keyed by
  // input size) against Blade's kernel (int8_conv.h, its pack for every input size, under
  // the key kInt8ConvKey); the loser's pack is freed the same way. A bf16 engine's
  // convolutions have one of precision: oneDNN's in bfloat16 (kBf16, its bfloat16 copy)
  // against the float32 path (kOneDnn there: whichever float32 kernel that path's own
  // trial keeps), which wins where converting the activations costs more than the faster
  // products save (small and memory-bound layers); its key takes the flag a convolution's
  // never needs, kPrecisionTrial. Its linear layers have one too, keyed by
  // matmul_precision_key: bfloat16 wins on AMD's Zen 4/5 and loses on Intel's CPUs without
  // AMX, whose AVX512-BF16 dot products run at half the FMA rate.
  //
  // The kernel for this call: oneDNN's (with onednn_weight's copy for `onednn_transposed`
  // and `onednn_input_size`) or `alternative` (kWinograd, kGemm, kDepthwise, kInt8Conv,
  // kBf16, kF32Tiles). kOneDnn when `weight` is not a param, or for kGemm without MKL; with
  // trials off (set_kernel_trials), kOneDnn, or kBf16 for a precision trial. `timed`
  // (optional) says whether the call belongs to a running trial, whose caller then times it
  // (record_kernel_time) and asks onednn_run_pending; a decided trial's kernel comes after
  // one lookup, untimed.
  static constexpr bool kPrecisionTrial = true;
  Kernel next_kernel(const at::Tensor& weight, bool onednn_transposed,
                     const std::vector<int64_t>& onednn_input_size, Kernel alternative,
                     bool* timed = nullptr);
  // Whether this call, which ran the alternative, should also run oneDNN's kernel (the
  // first call of a trial runs both).
  bool onednn_run_pending(const at::Tensor& weight, bool onednn_transposed,
                          const std::vector<int64_t>& onednn_input_size);
  // The time a call took by `kernel` (ignored outside a trial and off the kernel's turns).
  void record_kernel_time(const at::Tensor& weight, bool onednn_transposed,
                          const std::vector<int64_t>& onednn_input_size, Kernel kernel,
                          double seconds);
  // One call of a trial's two kernels, as next_kernel says, timed: `run_alternative` (false
  // when it declines: counted as endless, so that the trial settles on the other), or
  // `run_onednn`, which also runs after the alternative on a trial's first call (the
  // callers say whose result stands).
  void run_trial(const at::Tensor& weight, bool onednn_transposed,
                 const std::vector<int64_t>& onednn_input_size, Kernel alternative,
                 c10::function_ref<bool()> run_alternative,
                 c10::function_ref<void()> run_onednn);

  // The trials so far, one line each, in the order they began: the weight's sizes, the
  // input size oneDNN's kernel is made for, each kernel's best timed call, and the kernel
  // kept ("undecided" until both have had their timed calls).
  std::vector<std::string> kernel_choices() const;

  // Gives the memory of copies freed since the last call back to the system (glibc keeps
  // freed heap blocks otherwise, and a trial's losers would stay in the process's
  // resident memory); the engine calls it after each call, and it costs nothing when no
  // trial has ended since.
  void return_freed_memory();

  // Weight release (weight_release.cpp).
  //
  // A weight whose every use by the engine goes through its oneDNN copy does not need its
  // plain values while the engine runs, only when something reads it as it is: the subgraph
  // (a fallback), `torch.jit.save`, `Engine.params()`, a kernel that takes it plain. Once an
  // engine's kernel trials have chosen oneDNN for such a weight, `release_plain_weights`
  // gives the memory of its values back to the system (madvise(MADV_DONTNEED) over the
  // whole pages it covers: the address stays, reading it would give zeros) when the engine
  // alone holds it (a loaded model; in the optimizing process the user's module holds its
  // parameters) and the code never reads it itself (CompiledCode::weight_arguments), and
  // `ensure_plain` writes the values back from the copy (oneDNN's reorder back to the plain
  // layout: a permutation, exact; checked bit for bit before anything is released) before
  // any of those reads. So a loaded model holds each such weight once, in oneDNN's layout.

  // The params (by index) the code reads only as the weight of its kernels (see above).
  void set_weight_only(const std::vector<size_t>& indices);
  // Whether release_plain_weights may find something to release since its last run
  // (cheap: the engine asks after each call).
  bool release_due() const { return release_due_.load(std::memory_order_relaxed); }
  // Releases the plain values of the weight-only params that qualify (see above). The
  // engine holds the same param vector as this object (both count as holders). The caller
  // guarantees that no call of the engine is running.
  void release_plain_weights();
  // Puts back the values of the released weight at `weight`'s data, if it is one, before
  // the caller reads it as it is; it is not released again.
  void ensure_plain(const at::Tensor& weight);
  // Puts back every released weight and releases none from now on (something outside the
  // engine's kernels is about to read the params: the subgraph, a save, a caller).
  void keep_plain();
  // The same for one param (the graph around the engine reads it: Engine::param).
  void keep_plain(const at::Tensor& weight);
  // The bytes of param memory given back (whole pages).
  int64_t released_bytes() const;

  // How many prepared copies exist, oneDNN's, MKL's and Winograd's (tests and the report
  // read it).
  int64_t packed_count() const;
  // The bytes those copies (and channels_last copies) hold, beside the weights themselves.
  int64_t prepared_bytes() const;

  // Whether `t` is one of the engine's params (its data, sizes and strides).
  bool is_param(const at::Tensor& t) const;

 private:
  // The copy of `weight` under `key` in `copies`: made by `make()` on the first call, if
  // `bytes` more fit the limit (the weight's values are put back first: make reads them),
  // and counted; an undefined tensor when they do not fit.
  template <typename Copies, typename Make>
  at::Tensor made_once(Copies& copies, const typename Copies::key_type& key,
                       const at::Tensor& weight, int64_t bytes, Make make);
  // Adds a new copy to this engine's and the process's bytes (mutex_ held).
  void count(const at::Tensor& copy);
  // Takes a freed copy off them (mutex_ held).
  void uncount(const at::Tensor& copy);
  // How many prepared copies of the weight at `data` exist (mutex_ held).
  size_t copies_of(const void* data) const;
  // rhs packed for m rows of op(rhs) [k, n]; null when rhs is not a param or has its packs.
  const float* packed(const at::Tensor& rhs, bool transposed, int64_t m, int64_t n, int64_t k);

  struct KernelTrial {
    Kernel alternative = Kernel::kWinograd;
    std::vector<int64_t> weight_sizes;
    size_t order = 0;  // how many trials began before it
    int64_t calls = 0;     // next_kernel's answers so far
    int runs[2] = {0, 0};  // oneDNN's, the alternative's; the untimed first included
    double best[2] = {0.0, 0.0};
    std::optional<Kernel> choice;
  };
  // (weight data, transposed, input size): a trial's key (a precision trial's flag is
  // kPrecisionTrial), and that of oneDNN's copy (onednn_; a bfloat16 copy's size by
  // onednn_key_size)
  using TrialKey = std::tuple<const void*, bool, std::vector<int64_t>>;
  // A key's view, to find a trial without copying the input size (calls look theirs up
  // several times each).
  static std::tuple<const void*, bool, const std::vector<int64_t>&> trial_key(
      const at::Tensor& weight, bool onednn_transposed,
      const std::vector<int64_t>& onednn_input_size) {
    return {weight.data_ptr(), onednn_transposed, onednn_input_size};
  }
  // Past the most trials an engine keeps: the kernel kept for the same weight at the
  // decided input size nearest in elements, else oneDNN's (a precision trial's:
  // bfloat16) (mutex_ held).
  Kernel settled_kernel(const void* data, bool onednn_transposed,
                        const std::vector<int64_t>& onednn_input_size,
                        Kernel alternative) const;
  // Frees the copy the losing kernel of a decided trial prepared (mutex_ held).
  void release_loser(const TrialKey& key, const KernelTrial& trial);

  // Puts back the released weight at `data` (mutex_ held); nothing when it is not one.
  void restore_locked(const void* data);
  // The oneDNN copy (with its key) to restore the weight at `data` from, when its kernels
  // allow releasing it now; null otherwise (mutex_ held).
  const std::pair<const TrialKey, at::Tensor>* release_source(const void* data) const;

  struct Released {
    at::Tensor weight;  // the param
    at::Tensor copy;    // its oneDNN copy (restored from)
    bool transposed;    // the copy's key: a 2-d weight is [N, K] when transposed, else [K, N]
    int64_t bytes;      // given back
  };

  std::vector<at::Tensor> params_;
  // Each param's index by its data (params keep their data while the engine lives): what
  // is_param looks up on every kernel call.
  std::unordered_multimap<const void*, size_t> params_by_data_;
  std::vector<bool> weight_only_;  // by param index
  std::map<const void*, Released> released_;
  std::set<const void*> kept_plain_;  // restored ones, never released again
  bool keep_all_plain_ = false;
  std::atomic<bool> any_released_{false};
  std::atomic<bool> release_due_{false};
  bool bf16_;
  mutable std::mutex mutex_;
  int64_t bytes_ = 0;  // of the copies below
  // (weight data, transposed, rows) -> packed bytes
  std::map<std::tuple<const void*, bool, int64_t>, at::Tensor> packs_;
  std::map<const void*, at::Tensor> channels_last_;  // weight data -> its channels_last copy
  // (weight data, output tile) -> its Winograd form
  std::map<std::pair<const void*, int64_t>, at::Tensor> winograd_;
  std::map<const void*, at::Tensor> depthwise_;      // weight data -> its [kh, kw, C] filters
  std::map<const void*, at::Tensor> bf16_convs_;     // weight data -> bf16_conv's pack
  std::map<const void*, at::Tensor> f32_convs_;      // weight data -> f32_conv's pack
  std::map<std::pair<const void*, bool>, at::Tensor> bf16_linears_;  // (data, transposed)
  // (weight data, key) -> oneDNN's int8 pack
  std::map<std::pair<const void*, std::vector<int64_t>>, at::Tensor> int8_;
  std::map<std::pair<const void*, bool>, at::Tensor> bf16_matrices_;  // (data, transposed)
  std::map<std::pair<const void*, bool>, at::Tensor> k_by_n_;  // (data, transposed)
  std::atomic<bool> freed_{false};  // set by release_loser, taken by return_freed_memory
  // oneDNN's copy's key -> the trial of its two kernels
  std::map<TrialKey, KernelTrial, std::less<>> trials_;  // found by trial_key's view
  std::map<TrialKey, at::Tensor> onednn_;  // oneDNN's copies, by the same key
};

// The prepared weights of the engine whose code runs on this thread (null outside a call);
// set for the duration of a call by ActivePreparedWeights.
PreparedWeights* active_prepared_weights();

class ActivePreparedWeights {
 public:
  explicit ActivePreparedWeights(PreparedWeights* weights);
  ~ActivePreparedWeights();
  ActivePreparedWeights(const ActivePreparedWeights&) = delete;
  ActivePreparedWeights& operator=(const ActivePreparedWeights&) = delete;

 private:
  PreparedWeights* previous_;
};

}  // namespace blade::ral
