"""What signing costs at load: `torch.jit.load` of a saved Blade model (whose engines verify
their signature, hashing their params and code, before mapping the code) against the same
model frozen and saved by TorchScript, side by side in one process, medians.

    python benchmarks/load_time.py [--layers 12] [--runs 7]

The model is a stack of nn.TransformerEncoderLayer(768, 12, 3072) with distinct weights, a
BERT-base-sized encoder, called on [1, 128, 768]. The load of the Blade model is split into
the time its engines spend verifying (each engine's constructor checks its signature) and
the rest.
"""
import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

import blade

warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")


def median_seconds(fn, runs):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    layers = [torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
              for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(1, 128, 768)
    with tempfile.TemporaryDirectory() as tmp:
        plain_path, blade_path = Path(tmp) / "plain.pt", Path(tmp) / "blade.pt"
        with torch.no_grad():
            plain = torch.jit.freeze(torch.jit.trace(model, (x,)))
        torch.jit.save(plain, str(plain_path))
        optimized = blade.optimize(model, (x,))
        torch.jit.save(optimized, str(blade_path))
        engines = [getattr(optimized, c.name) for c in blade.report(optimized).clusters
                   if c.compiled]
        params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6

        def verify_all():
            for engine in engines:  # what each engine's constructor does on load
                state = engine.__getstate__()[0]
                meta = dict(line.split("=", 1) for line in state[7].splitlines())
                torch.classes.blade.Engine(state[1], state[8], state[5], state[6], state[3],
                                           state[4], state[2], meta["cpu_features"],
                                           meta["signature"],
                                           meta.get("precision", "float32"))

        for _ in range(2):  # page cache, lazy initialization
            torch.jit.load(str(plain_path))
            torch.jit.load(str(blade_path))
        plain_s = median_seconds(lambda: torch.jit.load(str(plain_path)), args.runs)
        blade_s = median_seconds(lambda: torch.jit.load(str(blade_path)), args.runs)
        engine_s = median_seconds(verify_all, args.runs)
        print(f"{args.layers}-layer encoder, {params_mb:.0f} MB of weights, "
              f"{len(engines)} engines")
        print(f"  torch.jit.load, frozen TorchScript: {plain_s:.3f} s")
        print(f"  torch.jit.load, Blade (signed):     {blade_s:.3f} s")
        print(f"  of which engines built, verified and mapped (from memory): {engine_s:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
