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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """examples/cpp configured and built once: (build directory, environment)."""
    if shutil.which("cmake") is None and not (Path(sys.executable).parent / "cmake").exists():
        pytest.fail("cmake is installed by the project's set-up (requirements.txt)")
    cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    build = tmp_path_factory.mktemp("cpp") / "build"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    subprocess.run([cmake, "-S", str(EXAMPLE), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                    f"-DPython3_EXECUTABLE={sys.executable}"],
                   check=True, capture_output=True, env=env)
    subprocess.run([cmake, "--build", str(build), "-j2"], check=True, capture_output=True,
                   env=env)
    return build, env


def test_blade_run_matches_eager(tmp_path, built):
    build, env = built
    torch.manual_seed(0)
    model = Model().eval()
    x, y = torch.randn(4, 8), torch.randn(4, 16)
    optimized = blade.optimize(model, (x, y))
    assert blade.report(optimized).coverage == 1.0
    torch.jit.save(optimized, str(tmp_path / "model.pt"))
    torch.save([x, y], str(tmp_path / "inputs.pt"))

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


@pytest.mark.skipif(not blade.int8_supported(), reason="this CPU has no int8 kernels")
def test_blade_run_runs_an_int8_model(tmp_path, built, monkeypatch):
    """A Config(precision="int8") model in the C++ process: the int8 op and its packed
    weights come with libblade_ral, and the engine runs compiled."""
    from blade.frontend import quantize

    monkeypatch.setattr(quantize, "MIN_MACS", 0)  # a small model: quantize it anyway
    build, env = built
    torch.manual_seed(0)
    model = Model().eval()
    x, y = torch.randn(4, 8), torch.randn(4, 16)
    calibration = [(torch.randn(4, 8), torch.randn(4, 16)) for _ in range(4)]
    optimized = blade.optimize(model, (x, y), blade.Config(precision="int8",
                                                            calibration=calibration))
    report = blade.report(optimized)
    assert report.int8["layers"] == ["fc"] and report.coverage == 1.0, str(report)
    with torch.no_grad():
        expected = optimized(x, y)
    torch.jit.save(optimized, str(tmp_path / "int8.pt"))
    torch.save([x, y], str(tmp_path / "inputs.pt"))
    run = subprocess.run([str(build / "blade_run"), str(tmp_path / "int8.pt"),
                          str(tmp_path / "inputs.pt"), str(tmp_path / "outputs.pt")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "blade_engine_0: calls=1 fallbacks=0" in run.stderr, run.stderr
    torch.testing.assert_close(torch.load(str(tmp_path / "outputs.pt")), expected,
                               rtol=1e-6, atol=1e-6)


def _serve(build, env, tmp_path, model_path, requests, threads=4):
    torch.save(requests, str(tmp_path / "requests.pt"))
    run = subprocess.run([str(build / "blade_serve"), str(model_path),
                          str(tmp_path / "requests.pt"), str(threads),
                          str(tmp_path / "outputs.pt")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stderr, torch.load(str(tmp_path / "outputs.pt"))


def test_blade_serve_shares_one_model_between_threads(tmp_path, built):
    """A libtorch process serving requests of several lengths from 4 threads at once,
    with one dynamic engine: every answer equals eager's, every call ran compiled code;
    and in a process that does not trust the signing key, the engine refuses its code,
    says why, and the answers come from its TorchScript fallback."""
    build, env = built
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
    optimized = blade.optimize(layer, (torch.randn(2, 12, 32),),
                               blade.Config(dynamic_dims={"src": [1]}))
    report = blade.report(optimized)
    assert len(report.clusters) == 1 and report.coverage == 1.0, str(report)
    model_path = tmp_path / "layer.pt"
    torch.jit.save(optimized, str(model_path))
    requests = [torch.randn(2, 5 + i % 7, 32) for i in range(24)]

    stderr, outputs = _serve(build, env, tmp_path, model_path, requests)
    assert "requests=24 threads=4" in stderr, stderr
    assert "blade_guard: calls=24 fallbacks=0" in stderr, stderr
    assert "blade_engine_0: calls=24 fallbacks=0" in stderr, stderr
    with torch.no_grad():
        for request, output in zip(requests, outputs):
            torch.testing.assert_close(output, layer(request), rtol=1e-4, atol=1e-4)

    untrusted = dict(env, XDG_CONFIG_HOME=str(tmp_path / "another_machine"))
    untrusted.pop("BLADE_TRUSTED_KEYS", None)
    stderr, outputs = _serve(build, untrusted, tmp_path, model_path, requests[:6], threads=2)
    key = blade.signing_public_key()
    assert "blade_engine_0: calls=6 fallbacks=6 (last: the engine is signed by key " \
           f"{key}, which this process does not trust" in stderr, stderr
    # A C++ service is told what to do in C++ terms.
    assert f'blade::ral::trust_public_key("{key}")' in stderr, stderr
    assert "blade.trust_key" not in stderr, stderr
    with torch.no_grad():
        for request, output in zip(requests, outputs):
            torch.testing.assert_close(output, layer(request), rtol=1e-4, atol=1e-4)
