"""Build Blade: the C++ runtime (libblade_ral) and the pass bindings (blade._C) with CMake.

Build without pip's build isolation, against the torch already installed:
    pip install --no-build-isolation -e .
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the CMake project once, then places both libraries in the package."""

    def build_extension(self, ext):
        import pybind11
        import torch

        build_dir = Path(os.environ.get("BLADE_BUILD_DIR", ROOT / "build" / "cmake"))
        build_dir.mkdir(parents=True, exist_ok=True)
        # Both libraries are built into the source package, which an editable install
        # imports directly; a regular build also copies them next to the extension.
        out_dir = ROOT / "python" / "blade"
        build_type = os.environ.get("BLADE_BUILD_TYPE", "Release")
        configure = [
            "cmake", "-S", str(ROOT), "-B", str(build_dir),
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{pybind11.get_cmake_dir()}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DBLADE_OUTPUT_DIR={out_dir}",
        ]
        extra = os.environ.get("BLADE_CMAKE_ARGS")
        if extra:
            configure += extra.split()
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)])
        ext_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        if ext_dir != out_dir.resolve():
            ext_dir.mkdir(parents=True, exist_ok=True)
            for name in ("libblade_ral.so", Path(self.get_ext_filename("_C")).name):
                shutil.copy2(out_dir / name, ext_dir / name)


setup(
    name="blade",
    version="0.1.0",
    description="Blade: compiles TorchScript clusters through Torch-MLIR and StableHLO to native code",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("blade._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0"],
    extras_require={"compiler": ["torch-mlir==20261001"]},
    entry_points={
        "console_scripts": ["blade=blade.__main__:main", "blade-opt=blade.tools.opt:main"],
        # torch.compile(model, backend="blade") finds Blade without `import blade`.
        "torch_dynamo_backends": ["blade=blade.torch_compile:blade_backend"],
    },
)
