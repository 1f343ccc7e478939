"""The runtime's C++ tests (tests/ral/ral_tests.cpp), built against the runtime this package
built and run on fixtures saved here. `make test-asan` runs the same tests under
AddressSanitizer + LeakSanitizer."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def cmake() -> str:
    return shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")


def test_ral_cpp_tests_pass(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    build = tmp_path / "build"
    subprocess.run([cmake(), "-S", str(HERE), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"],
                   check=True, capture_output=True, env=env)
    compiled = subprocess.run([cmake(), "--build", str(build), "-j2"], capture_output=True,
                              text=True, env=env)
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-4000:]
    subprocess.run([sys.executable, str(HERE / "make_fixtures.py"), str(tmp_path / "fixtures")],
                   check=True, capture_output=True, env=env)
    run = subprocess.run([str(build / "ral_tests"), str(tmp_path / "fixtures")],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = re.search(r"(\d+) passed, (\d+) failed", run.stdout)
    assert summary and int(summary.group(1)) >= 10 and summary.group(2) == "0", run.stdout
