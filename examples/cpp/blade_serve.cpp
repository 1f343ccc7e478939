// blade_serve MODEL.pt REQUESTS.pt THREADS OUTPUTS.pt
//
// The serving pattern of a libtorch process: the model saved by blade.optimize is loaded
// once and shared by THREADS worker threads, which take the requests (REQUESTS.pt, saved
// from Python with torch.save([request, ...]), each request a tensor or a list of tensors,
// the model's inputs) from a shared queue and run forward concurrently. The outputs go to
// OUTPUTS.pt as a tuple in request order (torch::pickle_save, which torch.load reads); latencies and
// the input guard's and engines' counters go to stderr.
//
// Engines run their compiled code only if the key that signed them is trusted here: the
// process's own key (under $XDG_CONFIG_HOME/blade), or keys listed in BLADE_TRUSTED_KEYS
// (docs/security.md). Otherwise they run their TorchScript subgraph and say why.
#include "example_io.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using blade_example::print_counters;
using blade_example::read_list;
using blade_example::write_pickle;

namespace {

// One request's inputs: a tensor, or a list of tensors.
std::vector<c10::IValue> request_inputs(const c10::IValue& request, size_t index) {
  if (request.isTensor()) {
    return {request};
  }
  if (request.isList()) {
    std::vector<c10::IValue> inputs;
    for (const c10::IValue& item : request.toListRef()) {
      inputs.push_back(item);
    }
    return inputs;
  }
  throw std::runtime_error("request " + std::to_string(index) +
                           " must be a tensor or a list of tensors, found " +
                           request.tagKind());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt REQUESTS.pt THREADS OUTPUTS.pt\n";
    return 2;
  }
  const int threads = std::atoi(argv[3]);
  if (threads < 1 || threads > 256) {
    std::cerr << "blade_serve: THREADS must be in [1, 256], got '" << argv[3] << "'\n";
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    model.eval();
    std::vector<std::vector<c10::IValue>> requests;
    for (const c10::IValue& request : read_list(argv[2], "requests")) {
      requests.push_back(request_inputs(request, requests.size()));
    }

    std::vector<c10::IValue> outputs(requests.size());
    std::vector<double> milliseconds(requests.size());
    std::atomic<size_t> next{0};
    std::mutex error_mutex;
    std::string first_error;
    auto worker = [&]() {
      c10::InferenceMode inference;  // per thread, as grad mode is
      for (size_t i = next++; i < requests.size(); i = next++) {
        try {
          const auto start = std::chrono::steady_clock::now();
          outputs[i] = model.forward(requests[i]);
          milliseconds[i] = std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start)
                                .count();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (first_error.empty()) {
            first_error = "request " + std::to_string(i) + ": " + e.what();
          }
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back(worker);
    }
    for (std::thread& thread : pool) {
      thread.join();
    }
    if (!first_error.empty()) {
      std::cerr << "blade_serve: " << first_error << "\n";
      return 1;
    }

    std::vector<double> sorted = milliseconds;
    std::sort(sorted.begin(), sorted.end());
    std::cerr << "requests=" << requests.size() << " threads=" << threads
              << " p50_ms=" << (sorted.empty() ? 0.0 : sorted[sorted.size() / 2]) << "\n";
    print_counters(model);

    // A tuple: torch.load (weights_only) reads it back without a type tag to trust.
    write_pickle(argv[4], c10::ivalue::Tuple::create(outputs));
  } catch (const std::exception& e) {
    std::cerr << "blade_serve: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
