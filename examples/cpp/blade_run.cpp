// blade_run MODEL.pt INPUTS.pt OUTPUTS.pt
//
// Loads a model saved by blade.optimize (torch.jit.save), reads its inputs saved from
// Python with torch.save([t1, t2, ...], INPUTS.pt), runs forward, and writes the result
// with torch::pickle_save, which torch.load reads; the input guard's and each engine's call
// and fallback counts, with the last fallback's reason, go to stderr. Needs libtorch and
// Blade's runtime library only: no Python, MLIR or torch-mlir.
#include <torch/script.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <string>
#include <iterator>
#include <vector>

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(std::string("cannot open ") + path);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt INPUTS.pt OUTPUTS.pt\n";
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    model.eval();
    c10::IValue saved = torch::pickle_load(read_file(argv[2]));
    if (!saved.isList()) {
      std::cerr << "blade_run: " << argv[2] << " must hold a list of tensors "
                << "(torch.save([t1, t2, ...], path)), found " << saved.tagKind() << "\n";
      return 1;
    }
    std::vector<c10::IValue> inputs;
    for (const c10::IValue& item : saved.toListRef()) {
      inputs.push_back(item);
    }
    torch::NoGradGuard no_grad;
    c10::IValue output = model.forward(inputs);
    // What Blade did: the input guard's calls and the calls it sent to the unspecialized
    // model (inputs unlike the example inputs), then each engine's compiled calls and calls
    // that fell back to TorchScript, each with the reason of the last fallback.
    for (const auto& attr : model.named_attributes(/*recurse=*/false)) {
      const bool guard = attr.name == "blade_guard";
      if ((guard || attr.name.rfind("blade_engine_", 0) == 0) && attr.value.isObject()) {
        torch::jit::Object object(attr.value.toObject());
        const int64_t fallbacks = object.run_method("fallbacks").toInt();
        std::cerr << attr.name << ": calls=" << object.run_method("calls").toInt()
                  << " fallbacks=" << fallbacks;
        if (fallbacks > 0) {
          std::string reason = object.run_method("last_fallback_reason").toStringRef();
          std::cerr << " (last: " << reason << ")";
        }
        std::cerr << "\n";
      }
    }
    std::vector<char> bytes = torch::pickle_save(output);
    std::ofstream out(argv[3], std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::cerr << "blade_run: cannot write " << argv[3] << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "blade_run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
