"""examples/cpp/blade_run: built against the torch wheel's libtorch and Blade's runtime,
runs a model saved in this test, and its outputs equal eager's."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import blade

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cpp"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x, y):
        return torch.relu(self.fc(x)) * torch.sigmoid(y)


@pytest.mark.skipif(shutil.which("cmake") is None and
                    not (Path(sys.executable).parent / "cmake").exists(),
                    reason="cmake is installed by the project's set-up")
def test_blade_run_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = Model().eval()
    x, y = torch.randn(4, 8), torch.randn(4, 16)
    optimized = blade.optimize(model, (x, y))
    assert blade.report(optimized).coverage == 1.0
    torch.jit.save(optimized, str(tmp_path / "model.pt"))
    torch.save([x, y], str(tmp_path / "inputs.pt"))

    cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    build = tmp_path / "build"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    subprocess.run([cmake, "-S", str(EXAMPLE), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                    f"-DPython3_EXECUTABLE={sys.executable}"],
                   check=True, capture_output=True, env=env)
    subprocess.run([cmake, "--build", str(build), "-j2"], check=True, capture_output=True,
                   env=env)
    run = subprocess.run([str(build / "blade_run"), str(tmp_path / "model.pt"),
                          str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    # The guard let the call in and the engine ran its compiled code in the C++ process.
    assert "blade_guard: calls=1 fallbacks=0\n" in run.stderr, run.stderr
    assert "blade_engine_0: calls=1 fallbacks=0" in run.stderr, run.stderr
    with torch.no_grad():
        torch.testing.assert_close(torch.load(str(tmp_path / "outputs.pt")), model(x, y))
    # Inputs unlike the example's: the guard says it sent the call to the unspecialized
    # model, and why.
    torch.save([torch.randn(3, 8), torch.randn(3, 16)], str(tmp_path / "other.pt"))
    run = subprocess.run([str(build / "blade_run"), str(tmp_path / "model.pt"),
                          str(tmp_path / "other.pt"), str(tmp_path / "outputs.pt")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "blade_guard: calls=1 fallbacks=1 (last: input 0: size of dim 0 is 3, expected 4)" \
        in run.stderr, run.stderr
    assert "blade_engine_0: calls=0 fallbacks=0" in run.stderr, run.stderr
