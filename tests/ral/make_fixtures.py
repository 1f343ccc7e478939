"""Saves the models the C++ runtime tests (tests/ral/ral_tests.cpp) load.

    python tests/ral/make_fixtures.py OUT_DIR

model.pt: a Linear (library call), elementwise ops and a reduction in one engine;
inputs.pt / expected.pt: a list of inputs and eager's outputs for it; strict.pt: the same
model with Config(fallback="error"); flipped.pt: an engine whose code fails its checksum;
future.pt: an engine from a format version this runtime does not know; dynamic.pt: the
model with Config(dynamic=True), and dynamic_inputs.pt / dynamic_expected.pt: inputs of
three batch sizes (x, y of each, in turn) and eager's outputs for each. int8.pt (on a
CPU with int8 dot products): int8 convolutions handing on uint8, with int8_inputs.pt and
int8_expected.pt.
hostile/*.pt: TanhChain with its engine edited as an attacker would (a foreign library in
place of the code, with the original signature or re-signed by a key the tests do not
trust; specs, params, metadata edited), and hostile_marker the file the foreign library's
constructor would create; foreign.pt: a model signed by another machine's key, whose public
key is in foreign_key.txt.
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# The fixtures are signed with the key of whoever runs this (docs/security.md): the C++ tests
# trust it as their own when they run with the same XDG_CONFIG_HOME.
import blade  # noqa: E402
from helpers import (bump_format_version, flip_code_bytes, save_tampered,  # noqa: E402
                     TanhChain)
from saved_state import (INPUT_SPECS, META, OUTPUT_SPECS,  # noqa: E402
                         byte_tensor, evil_library, rewrite_engines)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x, y):
        h = torch.relu(self.fc(x)) * torch.sigmoid(y)
        return h + x.sum(dim=1, keepdim=True), torch.tanh(y) - h


def main(out: Path) -> None:
    out = out.resolve()  # the foreign machine's XDG_CONFIG_HOME must be absolute
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
        write_hostile_fixtures(out, out / "tanh.pt", tanh_input)
        write_state_fixtures(out)
        if blade.int8_supported():
            write_int8_fixtures(out)
    print(f"fixtures written to {out}")


class TwoStates(torch.nn.Module):
    """A recurrent step that updates the two states it is given in place."""

    def forward(self, h, c, x, w):
        h.mul_(0.5).add_(torch.tanh(x @ w))
        c.add_(h * 0.1)
        return torch.softmax(h + c, dim=-1) @ w.t()


def write_state_fixtures(out: Path) -> None:
    """states.pt (one engine that writes both states), states_inputs.pt, and
    states_expected.pt: eager's results of two calls on the same states and the states
    after them."""
    model = TwoStates()
    inputs = [torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 6), torch.randn(6, 8)]
    optimized = blade.optimize(model, [t.clone() for t in inputs])
    report = blade.report(optimized)
    assert report.coverage == 1.0 and len(report.clusters) == 1, str(report)
    torch.jit.save(optimized, str(out / "states.pt"))
    torch.save(inputs, str(out / "states_inputs.pt"))
    states = [t.clone() for t in inputs]
    with torch.no_grad():
        results = [model(*states) for _ in range(2)]
    torch.save(results + states[:2], str(out / "states_expected.pt"))


class Int8Blocks(torch.nn.Module):
    """A max-pooled stem and a residual block: int8 convolutions that hand on uint8, a
    residual add folded into one, a uint8 max pooling (frontend/int8_handoffs.py)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.conv1, self.conv2 = nn.Conv2d(32, 16, 1), nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 3, 2, 1)
        return torch.relu(self.conv2(torch.relu(self.conv1(y))) + y).mean((2, 3))


def write_int8_fixtures(out: Path) -> None:
    """int8.pt, int8_inputs.pt and int8_expected.pt (the optimized model's own results):
    only on a CPU with int8 dot products."""
    from blade.frontend import quantize
    quantize.MIN_MACS = 0  # small layers, quantized all the same
    model = Int8Blocks().eval()
    calibration = [torch.randn(2, 3, 20, 18) for _ in range(4)]
    optimized = blade.optimize(model, (calibration[0],), blade.Config(
        precision="int8", calibration=calibration))
    x = torch.randn(2, 3, 20, 18)
    with torch.no_grad():
        expected = optimized(x)
    report = blade.report(optimized)
    assert report.coverage == 1.0 and report.int8["residual_adds"] == 1, str(report)
    torch.jit.save(optimized, str(out / "int8.pt"))
    torch.save([x], str(out / "int8_inputs.pt"))
    torch.save([expected], str(out / "int8_expected.pt"))


def another_machines_key(out: Path) -> Path:
    """The signing key of a machine these tests do not trust (created in a process whose
    config directory is its own)."""
    config = out / "foreign-config"
    env = dict(os.environ, XDG_CONFIG_HOME=str(config))
    subprocess.run([sys.executable, "-c", "import blade; blade.signing_public_key()"],
                   env=env, check=True)
    return config / "blade" / "engine_signing_key.pem"


def write_hostile_fixtures(out: Path, tanh_model: Path, tanh_input) -> None:
    from blade import _C

    torch.jit.save(blade.optimize(TanhChain(), (tanh_input,)), str(tanh_model))
    hostile = out / "hostile"
    hostile.mkdir(exist_ok=True)
    foreign_key = another_machines_key(out)
    evil = evil_library(out, out / "hostile_marker")
    features = torch.jit.load(str(tanh_model)).blade_engine_0.cpu_features()

    def with_meta(state, key, value):
        lines = [line for line in state[META].splitlines() if not line.startswith(key + "=")]
        state[META] = "\n".join(lines + [f"{key}={value}"]) + "\n"
        return state

    def evil_code(state, members, key_path=None):
        members["9001"] = evil
        state[-1] = byte_tensor("9001", len(evil))
        if key_path is not None:
            code = torch.frombuffer(bytearray(evil), dtype=torch.uint8)
            params = torch.jit.load(str(tanh_model)).blade_engine_0.__getstate__()[0][4]
            with_meta(state, "signature", _C.sign_engine(
                state[1], code, state[INPUT_SPECS], state[OUTPUT_SPECS], state[3], params,
                state[2], features, str(key_path)))
        return state

    edits = {
        "evil_code": evil_code,
        "evil_code_resigned": lambda s, m: evil_code(s, m, foreign_key),
        "dynamic_input": lambda s, m: s.__setitem__(INPUT_SPECS, "float32[?,8]") or s,
        "huge_symbol": lambda s, m: s.__setitem__(INPUT_SPECS, "float32[s999999999,8]") or s,
        "any_input": lambda s, m: s.__setitem__(INPUT_SPECS, "*") or s,
        "shrunk_output": lambda s, m: s.__setitem__(OUTPUT_SPECS, "float32[1,1]") or s,
        "checksum_garbage": lambda s, m: with_meta(s, "signature", "abc"),
    }
    for name, edit in edits.items():
        assert rewrite_engines(tanh_model, hostile / f"{name}.pt", edit) == 1, name
    # A model another machine compiled, and the key that machine signs with.
    script = ("import torch, blade; torch.manual_seed(0); "
              "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval(); "
              f"torch.jit.save(blade.optimize(m, (torch.randn(4, 8),)), {str(out / 'foreign.pt')!r}); "
              f"torch.save([m(torch.load({str(out / 'tanh_input.pt')!r})[0]).detach()], "
              f"{str(out / 'foreign_expected.pt')!r}); print(blade.signing_public_key())")
    env = dict(os.environ, XDG_CONFIG_HOME=str(foreign_key.parent.parent))
    key = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                         capture_output=True, text=True).stdout.split()[-1]
    (out / "foreign_key.txt").write_text(key + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUT_DIR")
    main(Path(sys.argv[1]))
