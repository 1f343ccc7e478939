"""IR dumps (`Config(dump_dir=...)` or the BLADE_DUMP_DIR environment variable) and progress
on long compilations.

Layout of a dump directory:

    graph/00_freeze.txt ... NN_<pass>.txt    the graph after each pass of the TorchScript-
                                             level pipeline, in order (blade.frontend.pipeline)
    blade_engine_N/0_torchscript.txt         the cluster's TorchScript subgraph
                   1_torch.mlir              Blade's import into the torch dialect
                   passes/NN_<pass>.mlir     the module after each pass of the codegen
                                             pipeline, in order (blade.codegen.pipeline),
                                             printed by MLIR's pass manager; when a
                                             pass fails, the last is what it got
                   2_llvm.ll                 LLVM IR, as LLVM compiles it
                   timings.json              seconds per pass, import and native code
                   error.txt                 why the cluster fell back, if it did
    report.txt                               the report of the optimized module
"""
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import torch

DUMP_ENV = "BLADE_DUMP_DIR"


class Dumper:
    """Writes dumps under one directory; every method does nothing when dumping is off."""

    def __init__(self, directory: Optional[str]):
        self.root = Path(directory) if directory else None
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def for_config(dump_dir: Optional[str]) -> "Dumper":
        """Config.dump_dir, else the BLADE_DUMP_DIR environment variable, else no dumps."""
        return Dumper(dump_dir or os.environ.get(DUMP_ENV) or None)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def graph_pass(self, index: int, name: str, graph: torch._C.Graph) -> None:
        """The graph after pass number `index`, `name` (blade.frontend.pipeline)."""
        if self.root is None:
            return
        directory = self.root / "graph"
        directory.mkdir(exist_ok=True)
        (directory / f"{index:02d}_{name}.txt").write_text(str(graph))

    def cluster(self, name: str) -> "ClusterDump":
        return ClusterDump(self.root / name if self.root is not None else None)

    def text(self, filename: str, text: str) -> None:
        if self.root is not None:
            (self.root / filename).write_text(text)


class ClusterDump:
    def __init__(self, directory: Optional[Path]):
        self.directory = directory
        self.seconds: Dict[str, float] = {}
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def write(self, filename: str, text: str) -> None:
        if self.directory is not None:
            (self.directory / filename).write_text(text)

    def passes_directory(self) -> Optional[Path]:
        """Where the codegen pipeline prints the module after each pass."""
        if self.directory is None:
            return None
        passes = self.directory / "passes"
        passes.mkdir(exist_ok=True)
        return passes

    def finish(self, seconds: Dict[str, float], error: Optional[str] = None) -> None:
        self.write("timings.json", json.dumps(seconds, indent=2) + "\n")
        if error is not None:
            self.write("error.txt", error + "\n")


class Progress:
    """What `optimize` is doing, on stderr, from its first second: the front-end stages
    (script or trace, freeze, simplify, types, cluster), then a bar of the clusters as they
    finish, each line with the seconds since optimize began. One line rewritten in place on
    a terminal; a line per step otherwise.

    Example:
        >>> progress = Progress(enabled=True)
        >>> progress.stage("freeze")
        >>> progress.begin(12, "compiling clusters"); progress.step("blade_engine_0")
    """

    def __init__(self, enabled: bool, width: int = 24):
        self.enabled, self.width = enabled, width
        self.total, self.done, self.label = 0, 0, ""
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    @staticmethod
    def wanted(setting: Optional[bool]) -> bool:
        """Config.progress: None shows progress when stderr is a terminal, not under pytest."""
        if setting is not None:
            return setting
        return sys.stderr.isatty() and "PYTEST_CURRENT_TEST" not in os.environ

    def stage(self, name: str) -> None:
        self._show(f"{name}...", last=False)

    def begin(self, total: int, label: str) -> None:
        self.total, self.done, self.label = total, 0, label

    def step(self, what: str) -> None:
        if self.total == 0:
            return
        self.done += 1
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        self._show(f"{self.label} [{bar}] {self.done}/{self.total} {what}",
                   last=self.done == self.total)

    def finish(self) -> None:
        """Ends a line left open on a terminal."""
        if self.enabled and self.tty and (self.total == 0 or self.done < self.total):
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()

    def _show(self, text: str, last: bool) -> None:
        if not self.enabled:
            return
        line = f"[blade {time.perf_counter() - self.start:5.1f}s] {text}"
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + line + ("\n" if last else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
