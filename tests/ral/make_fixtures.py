"""Saves the models the C++ runtime tests (tests/ral/ral_tests.cpp) load.

    python tests/ral/make_fixtures.py OUT_DIR

model.pt: a Linear (library call), elementwise ops and a reduction in one engine;
inputs.pt / expected.pt: a list of inputs and eager's outputs for it; strict.pt: the same
model with Config(fallback="error"); flipped.pt: an engine whose code fails its checksum;
future.pt: an engine from a format version this runtime does not know; dynamic.pt: the
model with Config(dynamic=True), and dynamic_inputs.pt / dynamic_expected.pt: inputs of
three batch sizes (x, y of each, in turn) and eager's outputs for each.
"""
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import blade  # noqa: E402
from helpers import (bump_format_version, flip_code_bytes, save_tampered,  # noqa: E402
                     TanhChain)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x, y):
        h = torch.relu(self.fc(x)) * torch.sigmoid(y)
        return h + x.sum(dim=1, keepdim=True), torch.tanh(y) - h


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Model().eval()
    x, y = torch.randn(4, 8), torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        optimized = blade.optimize(model, (x, y))
        report = blade.report(optimized)
        assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
        torch.jit.save(optimized, str(out / "model.pt"))
        strict = blade.optimize(model, (x, y), blade.Config(fallback="error"))
        torch.jit.save(strict, str(out / "strict.pt"))
        torch.save([x, y], str(out / "inputs.pt"))
        with torch.no_grad():
            torch.save(list(model(x, y)), str(out / "expected.pt"))
        for name, change in (("flipped", flip_code_bytes), ("future", bump_format_version)):
            scratch = out / name
            scratch.mkdir(exist_ok=True)
            path, tanh_input, changed = save_tampered(scratch, None, change)
            assert changed == 1, name
            path.rename(out / f"{name}.pt")
        dynamic = blade.optimize(model, (x, y), blade.Config(dynamic=True))
        assert "s0" in blade.report(dynamic).clusters[0].inputs, str(blade.report(dynamic))
        torch.jit.save(dynamic, str(out / "dynamic.pt"))
        batches = [(torch.randn(n, 8), torch.randn(n, 16)) for n in (1, 7, 33)]
        with torch.no_grad():
            torch.save([t for pair in batches for t in pair], str(out / "dynamic_inputs.pt"))
            torch.save([t for pair in batches for t in model(*pair)],
                       str(out / "dynamic_expected.pt"))
        torch.save([tanh_input], str(out / "tanh_input.pt"))
        torch.save([TanhChain()(tanh_input)], str(out / "tanh_expected.pt"))
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUT_DIR")
    main(Path(sys.argv[1]))
