"""From a cluster's torch-dialect function to a native shared library, held in memory as
bytes: the pass pipeline (blade.codegen.pipeline) to the LLVM dialect, the parallel
launchers and the entry point, then LLVM (blade.codegen.llvm.native) to objects and
`cc -shared` to the library.

The library exports `blade_entry(void** args)`: one pointer per memref descriptor, the
cluster's inputs, then its params, then its outputs (written in place).
"""
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Callable, List, Optional

from torch_mlir import ir
from torch_mlir._mlir_libs._torchMlir import register_dialect as register_torch_dialect

from blade._runtime import RUNTIME_LIBRARY
from blade.codegen import pipeline
from blade.codegen.cache import CompiledCluster
from blade.codegen.errors import CodegenError
from blade.codegen.llvm import abi, native
from blade.codegen.llvm.native import host_cpu_features
from torch_mlir._mlir_libs import _mlir, _stablehlo


def compile_torch_mlir(text: str, num_buffers: int, user_calls=(), dump=None,
                       parallel_loops: bool = True, returns_outputs: bool = False,
                       pool: Optional[native.CompilerPool] = None) -> CompiledCluster:
    """Compiles one torch-dialect function `main` into a shared library: `start_compiling`
    and its finish at once (see there for the arguments).

    Example:
        >>> compiled = compile_torch_mlir(imported.text, num_buffers=3)
    """
    return start_compiling(text, num_buffers, user_calls, dump, parallel_loops,
                           returns_outputs, pool)()


def start_compiling(text: str, num_buffers: int, user_calls=(), dump=None,
                    parallel_loops: bool = True, returns_outputs: bool = False,
                    pool: Optional[native.CompilerPool] = None
                    ) -> Callable[[], CompiledCluster]:
    """Compiles one torch-dialect function `main` into a shared library, in two steps:
    the pass pipeline now, LLVM's compilation on `pool`; returns the function that waits
    for LLVM's objects and links them (so that the caller can go on with the pipeline of
    other clusters).

    `num_buffers` is the number of memref arguments after bufferization: inputs, params and
    outputs together; with `returns_outputs` (outputs of dynamic size) main allocates and
    returns its outputs instead, and `num_buffers` counts inputs and params only.
    `user_calls` are the nodes the importer left to user converters. `parallel_loops` lets
    large loop nests run on PyTorch's intra-op threads.
    `dump` (a `dump.ClusterDump`) receives the IR after every pass as the pass manager
    prints it, so a failing pass leaves the IR that led to it, and the seconds of each.
    With a pool of workers, LLVM compiles the module in partitions (see blade.native);
    without, the whole module here, before this returns.
    """
    result = CompiledCluster(b"")
    dumping = dump is not None and dump.enabled
    register_passes()
    context = ir.Context()
    register_torch_dialect(context)
    with context:
        try:
            module = ir.Module.parse(text)
        except Exception as e:
            raise CodegenError.from_mlir("the imported torch-dialect IR does not parse",
                                         e) from None
        if dumping:
            dump.write("1_torch.mlir", str(module))
        options = pipeline.Options(
            num_buffers, returns_outputs=returns_outputs, parallel_loops=parallel_loops,
            user_calls=tuple(user_calls), avx512=_host_has_avx512())
        compilation = pipeline.Compilation(module, options)
        try:
            result.seconds.update(pipeline.run(compilation, pipeline.build(options),
                                               dump.passes_directory() if dumping else None))
        finally:
            if dump is not None:
                dump.seconds.update(result.seconds)
        result.statistics = compilation.statistics
        start = time.perf_counter()
        if dumping:
            dump.write("2_llvm.ll", abi.llvm_ir(module))
        try:
            if pool is None or pool.workers == 0:
                objects = [native.emit_object(module, str(RUNTIME_LIBRARY))]
            else:
                jobs = pool.submit(native.partition(module, pool.workers + 1))
        except native.NativeError as e:
            raise CodegenError(str(e)) from None

    def finish() -> CompiledCluster:
        try:
            linked = objects if pool is None or pool.workers == 0 else pool.wait(jobs)
        except native.NativeError as e:
            raise CodegenError(str(e)) from None
        with tempfile.TemporaryDirectory(prefix="blade-codegen-") as tmp:
            paths = []
            for i, data in enumerate(linked):
                paths.append(Path(tmp) / f"engine_{i}.o")
                paths[-1].write_bytes(data)
            lib = Path(tmp) / "engine.so"
            _link_shared_library(paths, lib)
            result.library = lib.read_bytes()
        # From the LLVM-dialect module to the library, waiting for the pool included.
        result.seconds["native"] = time.perf_counter() - start
        if dump is not None:
            dump.seconds["native"] = result.seconds["native"]
        return result

    return finish


def _link_shared_library(objects: List[Path], out: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CodegenError("no C compiler driver (cc) was found to link the engine's code")
    cmd = [compiler, "-shared", "-o", str(out), *map(str, objects),
           f"-L{RUNTIME_LIBRARY.parent}", "-lblade_ral", "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CodegenError(f"linking the engine's code failed: {proc.stderr.strip()}")


@functools.lru_cache(maxsize=None)
def register_passes() -> None:
    """StableHLO's passes by name (blade.codegen.pipeline names some); once."""

    _stablehlo.register_stablehlo_passes()
    _stand_in_dialect_modules()


# Dialects whose ops Blade's rewrites walk, and for which the torch-mlir wheel has no
# Python module.


# Dialects whose ops Blade's rewrites walk, and for which the torch-mlir wheel has no
# Python module.
_DIALECTS_WITHOUT_MODULES = ("stablehlo", "chlo")
_STAND_IN_PREFIX = "blade._mlir_dialects"


def _stand_in_dialect_modules() -> None:
    """MLIR's Python bindings look up the Python module of an op's dialect
    (`torch_mlir.dialects.<dialect>`) each time they hand out an op, and remember only
    the modules they found: every StableHLO op that Blade's rewrites visited was a failed
    import (tens of thousands in a ResNet-50's cluster). An empty module under a
    search prefix of Blade's own is found instead, once; the ops stay generic OpViews."""

    package = types.ModuleType(_STAND_IN_PREFIX)
    package.__path__ = []
    sys.modules.setdefault(_STAND_IN_PREFIX, package)
    for dialect in _DIALECTS_WITHOUT_MODULES:
        name = f"{_STAND_IN_PREFIX}.{dialect}"
        sys.modules.setdefault(name, types.ModuleType(name))
    if _STAND_IN_PREFIX not in _mlir.globals.dialect_search_modules:
        _mlir.globals.append_dialect_search_prefix(_STAND_IN_PREFIX)


def _host_has_avx512() -> bool:
    return "avx512f" in host_cpu_features().split(",")
