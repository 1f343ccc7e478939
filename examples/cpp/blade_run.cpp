// blade_run MODEL.pt INPUTS.pt OUTPUTS.pt
//
// Loads a model saved by blade.optimize (torch.jit.save), reads its inputs saved from
// Python with torch.save([t1, t2, ...], INPUTS.pt), runs forward, and writes the result
// with torch::pickle_save, which torch.load reads; the input guard's and each engine's call
// and fallback counts, with the last fallback's reason, go to stderr. Needs libtorch and
// Blade's runtime library only: no Python, MLIR or torch-mlir.
#include "example_io.h"

#include <vector>

using blade_example::print_counters;
using blade_example::read_list;
using blade_example::write_pickle;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt INPUTS.pt OUTPUTS.pt\n";
    return 2;
  }
  try {
    torch::jit::Module model = torch::jit::load(argv[1]);
    model.eval();
    const std::vector<c10::IValue> inputs =
        read_list(argv[2], "tensors (torch.save([t1, t2, ...], path))");
    torch::NoGradGuard no_grad;
    c10::IValue output = model.forward(inputs);
    print_counters(model);
    write_pickle(argv[3], output);
  } catch (const std::exception& e) {
    std::cerr << "blade_run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
