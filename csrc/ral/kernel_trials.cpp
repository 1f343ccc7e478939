// Kernel trials (kernel_trials.h): which of a weight's two kernels an engine keeps, and
// the copy the other prepared freed (PreparedWeights::next_kernel, prepared_weights.h).
#include "ral/kernel_trials.h"

#include "ral/float_conv.h"
#include "ral/mkl_functions.h"
#include "ral/prepared_weights.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace blade::ral {
namespace {

// Timed calls per kernel in a trial (after an untimed first: next_kernel), the best of
// which counts, and the most trials an engine keeps (a dynamic engine sees many input
// sizes; past this many the others run untried the kernel the weight's nearest decided
// size kept: settled_kernel). One timed call each let a burst of load on a shared host
// pick the slower kernel for the engine's life.
constexpr int kTimedTrialRuns = 3;
constexpr size_t kMaxTrials = 256;
// Each kernel of a trial is timed on its own turns, one call in kOneDnnSpread each,
// staggered by the trial's order: while one layer times oneDNN's kernel the layers around
// it (trials begin in the order layers run) run the alternative, as they will where it
// wins; the alternative's turn is half a spread later. Timed on the same calls in every
// layer at once, each kernel ran beside its own kind, a context the engine rarely keeps:
// oneDNN's int8 convolutions timed faster so than they then ran beside Blade's.
constexpr int64_t kOneDnnSpread = 4;

thread_local bool one_kernel_per_call = false;
std::atomic<bool> kernel_trials{true};

// What a weight runs untried (trials off, or past kMaxTrials with no size decided):
// oneDNN's, the usual winner on AVX-512 CPUs (where MKL may run its AVX2 code at half the
// speed); a precision trial's bfloat16, the precision asked for.
PreparedWeights::Kernel untried(PreparedWeights::Kernel alternative) {
  using Kernel = PreparedWeights::Kernel;
  return alternative == Kernel::kBf16 ? Kernel::kBf16 : Kernel::kOneDnn;
}

}  // namespace

void set_kernel_trials(bool enabled) { kernel_trials.store(enabled, std::memory_order_relaxed); }

int64_t kernel_trial_calls() { return 1 + kTimedTrialRuns * kOneDnnSpread; }

PreparedWeights::Kernel PreparedWeights::next_kernel(
    const at::Tensor& weight, bool onednn_transposed,
    const std::vector<int64_t>& onednn_input_size, Kernel alternative, bool* timed) {
  if (timed != nullptr) {
    *timed = false;
  }
  if (alternative == Kernel::kGemm && mkl_functions().sgemm == nullptr) {
    return Kernel::kOneDnn;  // no sgemm without MKL
  }
  const bool trials = kernel_trials.load(std::memory_order_relaxed);
  if (trials) {  // a decided trial's kernel after one lookup (trials are of params only)
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = trials_.find(trial_key(weight, onednn_transposed, onednn_input_size));
    if (it != trials_.end() && it->second.choice.has_value()) {
      return *it->second.choice;
    }
  }
  if (!is_param(weight)) {
    return Kernel::kOneDnn;  // nothing prepared without a param
  }
  if (!trials) {
    return untried(alternative);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = trials_.find(trial_key(weight, onednn_transposed, onednn_input_size));
  if (it == trials_.end()) {
    if (trials_.size() >= kMaxTrials) {
      return settled_kernel(weight.data_ptr(), onednn_transposed, onednn_input_size,
                            alternative);
    }
    KernelTrial trial;
    trial.alternative = alternative;
    trial.weight_sizes = weight.sizes().vec();
    trial.order = trials_.size();
    it = trials_
             .emplace(TrialKey(weight.data_ptr(), onednn_transposed, onednn_input_size), trial)
             .first;
  }
  KernelTrial& trial = it->second;
  if (trial.choice.has_value()) {  // decided since the lookup above
    return *trial.choice;
  }
  if (timed != nullptr) {
    *timed = true;
  }
  // The alternative first (the caller then runs oneDNN's too: onednn_run_pending; where it
  // may not, oneDNN's untimed first is the next call), then oneDNN's on its staggered
  // turns until timed enough, the alternative on the rest.
  const int64_t call = trial.calls++;
  if (trial.runs[1] == 0) {
    return trial.alternative;
  }
  if (trial.runs[0] == 0) {
    return Kernel::kOneDnn;
  }
  const bool onednn_turn = (call + static_cast<int64_t>(trial.order)) % kOneDnnSpread == 0;
  return onednn_turn && trial.runs[0] <= kTimedTrialRuns ? Kernel::kOneDnn : trial.alternative;
}

PreparedWeights::Kernel PreparedWeights::settled_kernel(
    const void* data, bool onednn_transposed, const std::vector<int64_t>& onednn_input_size,
    Kernel alternative) const {
  const auto elements = [](const std::vector<int64_t>& sizes) {
    int64_t product = 1;
    for (const int64_t size : sizes) {
      product *= size;
    }
    return product;
  };
  const int64_t wanted = elements(onednn_input_size);
  std::optional<Kernel> kept;
  int64_t distance = 0;
  for (const auto& [key, trial] : trials_) {
    if (std::get<0>(key) != data || std::get<1>(key) != onednn_transposed ||
        !trial.choice.has_value()) {
      continue;
    }
    const int64_t apart = std::abs(elements(std::get<2>(key)) - wanted);
    if (!kept.has_value() || apart < distance) {
      kept = trial.choice;
      distance = apart;
    }
  }
  return kept.value_or(untried(alternative));  // no size of this weight decided yet
}

bool PreparedWeights::onednn_run_pending(const at::Tensor& weight, bool onednn_transposed,
                                         const std::vector<int64_t>& onednn_input_size) {
  if (one_kernel_per_call || !is_param(weight)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = trials_.find(trial_key(weight, onednn_transposed, onednn_input_size));
  return it != trials_.end() && !it->second.choice.has_value() && it->second.runs[0] == 0 &&
         it->second.runs[1] > 0;
}

void PreparedWeights::record_kernel_time(const at::Tensor& weight, bool onednn_transposed,
                                         const std::vector<int64_t>& onednn_input_size,
                                         Kernel kernel, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = trials_.find(trial_key(weight, onednn_transposed, onednn_input_size));
  if (it == trials_.end() || it->second.choice.has_value()) {
    return;
  }
  const TrialKey& key = it->first;
  KernelTrial& trial = it->second;
  const int k = kernel == Kernel::kOneDnn ? 0 : 1;
  // After the untimed first, each kernel's calls count on its turns only (see
  // kOneDnnSpread), until timed enough: the two spread alike over the trial's calls.
  const int64_t phase = (trial.calls - 1 + static_cast<int64_t>(trial.order)) % kOneDnnSpread;
  if (trial.runs[k] > 0 &&
      (phase != (k == 0 ? 0 : kOneDnnSpread / 2) || trial.runs[k] > kTimedTrialRuns)) {
    return;
  }
  if (trial.runs[k]++ > 0) {  // the first call prepared the weight: not timed
    trial.best[k] = trial.runs[k] == 2 ? seconds : std::min(trial.best[k], seconds);
  }
  if (trial.runs[0] > kTimedTrialRuns && trial.runs[1] > kTimedTrialRuns) {
    trial.choice = trial.best[1] <= trial.best[0] ? trial.alternative : Kernel::kOneDnn;
    release_loser(key, trial);
    release_due_.store(!keep_all_plain_, std::memory_order_relaxed);
  }
}

void PreparedWeights::run_trial(const at::Tensor& weight, bool onednn_transposed,
                                const std::vector<int64_t>& onednn_input_size,
                                Kernel alternative, c10::function_ref<bool()> run_alternative,
                                c10::function_ref<void()> run_onednn) {
  bool timed = false;
  const Kernel kernel =
      next_kernel(weight, onednn_transposed, onednn_input_size, alternative, &timed);
  if (!timed) {  // decided (or untried): the kernel, untimed; a declining alternative's
    if (kernel != alternative || !run_alternative()) {  // call runs oneDNN's
      run_onednn();
    }
    return;
  }
  if (kernel == alternative) {
    Stopwatch stopwatch;
    const bool ran = run_alternative();
    record_kernel_time(weight, onednn_transposed, onednn_input_size, alternative,
                       ran ? stopwatch.seconds() : std::numeric_limits<double>::infinity());
    if (ran && !onednn_run_pending(weight, onednn_transposed, onednn_input_size)) {
      return;
    }
  }
  Stopwatch stopwatch;
  run_onednn();
  record_kernel_time(weight, onednn_transposed, onednn_input_size, Kernel::kOneDnn,
                     stopwatch.seconds());
}

void PreparedWeights::release_loser(const TrialKey& key, const KernelTrial& trial) {
  const void* data = std::get<0>(key);
  const bool transposed = std::get<1>(key);
  bool erased = false;
  const auto erase = [&](auto& copies, const auto& at) {
    auto copy = copies.find(at);
    if (copy != copies.end()) {
      uncount(copy->second);
      copies.erase(copy);
      erased = true;
    }
  };
  // Every copy in `copies` whose key `matches`.
  const auto erase_all = [&](auto& copies, const auto& matches) {
    for (auto copy = copies.begin(); copy != copies.end();) {
      const bool loser = matches(copy->first);
      if (loser) {
        uncount(copy->second);
        erased = true;
      }
      copy = loser ? copies.erase(copy) : std::next(copy);
    }
  };
  // The weight's Winograd forms, one per output tile.
  const auto its_winograd = [&](const auto& form) { return form.first == data; };
  // Whether another trial of this weight with the same alternative keeps, or may still
  // keep, `kernel`.
  const auto others_keep = [&](Kernel kernel) {
    return std::any_of(trials_.begin(), trials_.end(), [&](const auto& other) {
      return std::get<0>(other.first) == data && other.first != key &&
             other.second.alternative == trial.alternative &&
             other.second.choice.value_or(kernel) == kernel;
    });
  };
  const std::vector<int64_t>& size = std::get<2>(key);
  if (trial.alternative == Kernel::kBf16 && !size.empty() &&
      size.back() == kMatmulPrecisionMark) {
    // A linear layer's precision trial: the loser's oneDNN copy for these rows, and its
    // copies for every row count once no other row count keeps or tries it.
    const bool bf16_won = trial.choice == Kernel::kBf16;
    const std::vector<int64_t> rows_size(size.begin(), size.end() - 1);
    erase(onednn_, std::make_tuple(data, transposed, onednn_key_size(rows_size, !bf16_won)));
    if (!bf16_won && !others_keep(Kernel::kBf16)) {
      erase(bf16_linears_, std::make_pair(data, transposed));
      erase(bf16_matrices_, std::make_pair(data, transposed));
    }
    if (bf16_won && !others_keep(Kernel::kOneDnn)) {
      erase(f32_convs_, data);
      erase(k_by_n_, std::make_pair(data, transposed));
      erase_all(packs_, [&](const auto& pack) {
        return std::get<0>(pack) == data && std::get<1>(pack) == transposed;
      });
    }
  } else if (trial.alternative == Kernel::kBf16) {
    // A convolution's precision trial: the loser's oneDNN copy for this size.
    const bool bf16_won = trial.choice == Kernel::kBf16;
    erase(onednn_, std::make_tuple(data, false, onednn_key_size(size, !bf16_won)));
    if (!bf16_won && !others_keep(Kernel::kBf16)) {
      erase(bf16_convs_, data);  // Blade's bfloat16 pack serves every size
    }
    if (bf16_won && !others_keep(Kernel::kOneDnn)) {
      // The float32 path's other copies serve every size (its own trial, left undecided,
      // made them): freed once no size of the weight runs or tries float32.
      erase_all(winograd_, its_winograd);
      erase(f32_convs_, data);
      erase(channels_last_, data);
      erase(k_by_n_, std::make_pair(data, true));
    }
  } else if (trial.choice != Kernel::kOneDnn) {
    erase(onednn_, key);
    if (trial.alternative == Kernel::kInt8Conv && !others_keep(Kernel::kOneDnn)) {
      // oneDNN's int8 packs of the weight (one per input size and range for a convolution,
      // one for a linear layer's every row count), once no other input size keeps or
      // tries oneDNN's; never the matrix-vector product's (int8_gemv.h), no trial's.
      erase_all(int8_, [&](const auto& pack) {
        return pack.first == data && pack.second != kInt8ConvKey &&
               pack.second != kInt8GemvKey;
      });
    }
  } else if (std::none_of(trials_.begin(), trials_.end(), [&](const auto& other) {
               // oneDNN won. The alternative's copy serves every input size of the weight
               // (Winograd's forms, the depthwise filters, Blade's float32 pack,
               // blocked_gemm's [K, N] copy; MKL's
               // sgemm reads the weight as it is): freed once no size still uses or tries
               // it (a dynamic engine's size past its oneDNN copies makes [K, N] again).
               return std::get<0>(other.first) == data &&
                      other.second.alternative == trial.alternative &&
                      (trial.alternative != Kernel::kGemm ||
                       std::get<1>(other.first) == transposed) &&
                      other.second.choice != Kernel::kOneDnn;
             })) {
    switch (trial.alternative) {
      case Kernel::kWinograd: erase_all(winograd_, its_winograd); break;
      case Kernel::kDepthwise: erase(depthwise_, data); break;
      case Kernel::kGemm:
        // A 1x1 convolution's [K, N] copy is its [O, C] weight's, kept as transposed.
        erase(k_by_n_, std::make_pair(data, transposed || trial.weight_sizes.size() == 4));
        break;
      case Kernel::kInt8Conv: erase(int8_, std::make_pair(data, kInt8ConvKey)); break;
      case Kernel::kF32Tiles: erase(f32_convs_, data); break;
      case Kernel::kOneDnn:
      case Kernel::kBf16: break;  // handled above
    }
  }
  if (erased) {
    freed_.store(true, std::memory_order_relaxed);
  }
}

namespace {

// As the report names them; kGemm is trial_gemm's (MKL's sgemm or few_rows_gemm on the
// weight as it is, or blocked_gemm on a small weight's [K, N] copy).
const char* kernel_name(PreparedWeights::Kernel kernel) {
  switch (kernel) {
    case PreparedWeights::Kernel::kOneDnn: return "oneDNN";
    case PreparedWeights::Kernel::kWinograd: return "Winograd";
    case PreparedWeights::Kernel::kGemm: return "plain-weight GEMM";
    case PreparedWeights::Kernel::kDepthwise: return "Blade depthwise";
    case PreparedWeights::Kernel::kInt8Conv: return "Blade int8";
    case PreparedWeights::Kernel::kF32Tiles: return "Blade float32";
    case PreparedWeights::Kernel::kBf16:  // Blade's where it runs (float_conv.h)
      return bf16_conv_available() ? "Blade bfloat16" : "oneDNN bfloat16";
  }
  return "?";
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::ostringstream text;
  text << c10::IntArrayRef(sizes);
  return text.str();
}

}  // namespace

std::vector<std::string> PreparedWeights::kernel_choices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<size_t, std::string>> lines;
  for (const auto& [key, trial] : trials_) {
    // A float32 path that its precision trial left for bfloat16 (undecided, unused): a
    // convolution's (keyed by kPrecisionTrial) or a linear layer's (matmul_precision_key).
    const auto left_for_bf16 = [&](const TrialKey& precision_key) {
      const auto precision_trial = trials_.find(precision_key);
      return precision_trial != trials_.end() &&
             precision_trial->second.choice == Kernel::kBf16;
    };
    if (trial.alternative != Kernel::kBf16 &&
        ((!std::get<1>(key) &&
          left_for_bf16(TrialKey(std::get<0>(key), kPrecisionTrial, std::get<2>(key)))) ||
         left_for_bf16(TrialKey(std::get<0>(key), std::get<1>(key),
                                matmul_precision_key(std::get<2>(key)))))) {
      continue;
    }
    std::ostringstream line;
    // A precision trial's flag is no transposition, and its kOneDnn is the float32 path;
    // a linear layer's input size ends in its mark, not printed.
    const bool precision = trial.alternative == Kernel::kBf16;
    std::vector<int64_t> input_size = std::get<2>(key);
    if (precision && !input_size.empty() && input_size.back() == kMatmulPrecisionMark) {
      input_size.pop_back();
    }
    line << "weight " << sizes_text(trial.weight_sizes)
         << (std::get<1>(key) && !precision ? " (transposed)" : "") << ", input "
         << sizes_text(input_size) << ": ";
    const Kernel kernels[2] = {Kernel::kOneDnn, trial.alternative};
    for (int k = 0; k < 2; ++k) {
      line << (k > 0 ? ", " : "")
           << (precision && k == 0 ? "float32" : kernel_name(kernels[k])) << " ";
      if (trial.runs[k] > 1) {
        line << std::fixed << std::setprecision(3) << trial.best[k] * 1e3 << " ms";
      } else {
        line << "untimed";
      }
    }
    line << " -> "
         << (!trial.choice.has_value()                          ? "undecided"
             : precision && *trial.choice == Kernel::kOneDnn ? "float32"
                                                              : kernel_name(*trial.choice));
    lines.emplace_back(trial.order, line.str());
  }
  std::sort(lines.begin(), lines.end());
  std::vector<std::string> result;
  result.reserve(lines.size());
  for (auto& entry : lines) {
    result.push_back(std::move(entry.second));
  }
  return result;
}

void PreparedWeights::return_freed_memory() {
  if (freed_.exchange(false, std::memory_order_relaxed)) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
}

OneKernelPerCall::OneKernelPerCall() : previous_(one_kernel_per_call) {
  one_kernel_per_call = true;
}

OneKernelPerCall::~OneKernelPerCall() { one_kernel_per_call = previous_; }

}  // namespace blade::ral
