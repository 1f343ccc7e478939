"""Compiled code, reused: clusters whose imported IR is identical share one compilation, in
one `optimize` and across processes.

Most of a model's compile time is code generation (LLVM's optimizer above all), and real
models repeat themselves: the 12 layers of a BERT encoder import to byte-identical
torch-dialect IR, because weights are params of the compiled code, not constants in it.
So code is keyed by everything that determines it: the imported IR and the arguments of
`codegen.compile_torch_mlir`, the host's CPU features, and a fingerprint of the compiler
itself (Blade's version and sources, the engine format, the torch-mlir
version).

- In one `optimize`, a key compiled once is not compiled again, and the engines that share
  it share one code tensor, which `torch.jit.save` writes once.
- Across processes, compiled code lives in a directory (`~/.cache/blade/code`, under
  `$XDG_CACHE_HOME` when set; `Config.cache_dir`, or the environment variable
  BLADE_CACHE_DIR, moves it, and "off" turns it off). An entry holds native code, so it is
  treated like an engine of a saved file: signed with the compiling key, and used only when
  it verifies against a key this process trusts; a corrupted, truncated or foreign entry is
  removed and compiled again. An entry also records the precisions under which its code
  passed the engine check (`mark_checked`), which other processes then trust as they trust
  the code. Entries are written to a private file and renamed into place,
  so concurrent processes see whole entries or none; the directory is kept under its size
  bound by removing the least recently used entries.
"""
import hashlib
import json
import os
import struct
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from blade import _C
from blade.report import CodeOrigin, CodeStatistics

CACHE_VARIABLE = "BLADE_CACHE_DIR"
DEFAULT_MAX_BYTES = 1 << 30
_MAGIC = b"blade compiled code 2\n"


@dataclass
class CompiledCluster:
    """What `codegen.compile_torch_mlir` makes of a cluster, and what an entry holds."""

    library: bytes
    seconds: Dict[str, float] = field(default_factory=dict)  # per pass, and native code
    # What a cache entry carries besides the code.
    statistics: CodeStatistics = field(default_factory=CodeStatistics)
    # The precisions (Config.precision) under which an engine running this code agreed
    # with TorchScript in an optimize's engine check (blade.self_check): an engine that
    # loads it from the cache under one of them is not run by the check again, as an
    # engine sharing the code of a checked engine in one optimize is not.
    checked: List[str] = field(default_factory=list)


@lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """Changes whenever the code Blade would generate for the same IR may change."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]  # python/blade
    for path in sorted(package.rglob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        torch_mlir = metadata.version("torch-mlir")
    except metadata.PackageNotFoundError:
        torch_mlir = "unknown"
    digest.update(f"{_C.ENGINE_FORMAT_VERSION} {torch_mlir}".encode())
    return digest.hexdigest()


@dataclass
class CodeCache:
    """What one `optimize` compiles through (see the module's docstring).

    Example:
        >>> cache = CodeCache.for_config(config)
        >>> compiled = cache.start(key, lambda: codegen.start_compiling(...))()
    """

    directory: Optional[Path]
    signing_key: str = ""
    max_bytes: int = DEFAULT_MAX_BYTES
    compiled: Dict[str, CompiledCluster] = field(default_factory=dict)
    # How each key's code was had: compiled, or from the directory.
    origin: Dict[str, CodeOrigin] = field(default_factory=dict)
    # Why directory entries were not used (corrupted, untrusted), for the report.
    rejected: Dict[str, str] = field(default_factory=dict)
    # One code tensor per key: engines sharing code share it, and the saved file holds it once.
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)
    # The first engine of this optimize to use each key (what the report says the others
    # share).
    first_user: Dict[str, str] = field(default_factory=dict)
    # Builds begun (`start`): what finishes each.
    _finishing: Dict[str, Callable[[], CompiledCluster]] = field(default_factory=dict)

    @classmethod
    def for_config(cls, config) -> "CodeCache":
        setting = config.cache_dir if config.cache_dir is not None else \
            os.environ.get(CACHE_VARIABLE)
        if setting == "off":
            directory = None
        elif setting:
            directory = Path(setting).expanduser()
        else:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
            directory = Path(base) / "blade" / "code"
        return cls(directory, config.signing_key or "", config.cache_max_bytes)

    @staticmethod
    def key(**fields) -> str:
        """The key of the code `compile_torch_mlir` makes from these arguments here."""
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(f"{compiler_fingerprint()}\n{text}".encode()).hexdigest()

    def start(self, key: str, start_build: Callable[[], Callable[[], CompiledCluster]]
              ) -> Callable[[], CompiledCluster]:
        """The function that gives the code of `key`: compiled earlier in this optimize,
        found in the directory, or built (and then stored). A build is begun now by
        `start_build()` and finished by the function it returns, so that the builds of
        several keys overlap; a key begun earlier in this optimize shares that build.

        Example:
            >>> finish = cache.start(key, lambda: codegen.start_compiling(...))
            >>> compiled = finish()   # later, once other clusters are begun too
        """
        if key in self._finishing:
            return self._finishing[key]
        self._look_up(key)
        if key in self.compiled:
            return lambda: self.compiled[key]
        finish_build = start_build()

        def finish() -> CompiledCluster:
            if key not in self.compiled:
                compiled = finish_build()
                self.origin[key] = CodeOrigin.COMPILED
                self._store(key, compiled)
                self.compiled[key] = compiled
            return self.compiled[key]

        self._finishing[key] = finish
        return finish

    def _look_up(self, key: str) -> None:
        """Takes `key`'s code from the directory, where it is, unless this optimize has it."""
        if key not in self.compiled and key not in self._finishing:
            found = self._load(key)
            if found is not None:
                self.origin[key] = CodeOrigin.COMPILE_CACHE
                self.compiled[key] = found

    def checked_before(self, key: Optional[str], precision: str) -> bool:
        """Whether `key`'s code comes from the directory and passed the engine check under
        `precision` in the optimize that compiled it (reads its entry once)."""
        if key is None:
            return False
        self._look_up(key)
        return self.origin.get(key) == CodeOrigin.COMPILE_CACHE and \
            precision in self.compiled[key].checked

    def mark_checked(self, key: str, precision: str) -> None:
        """Records that an engine running `key`'s code (compiled or loaded by this cache)
        agreed with TorchScript under `precision`, in its directory entry too."""
        compiled = self.compiled[key]
        if precision in compiled.checked:
            return
        compiled.checked.append(precision)
        self._store(key, compiled)

    def code_tensor(self, key: str) -> torch.Tensor:
        """The library of `key` as the uint8 tensor engines hold, one per key."""
        if key not in self.tensors:
            self.tensors[key] = torch.frombuffer(bytearray(self.compiled[key].library),
                                                 dtype=torch.uint8)
        return self.tensors[key]

    # --- the directory ---------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.code"

    def _load(self, key: str) -> Optional[CompiledCluster]:
        if self.directory is None:
            return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        compiled, why = _parse_entry(key, data)
        if compiled is None:
            self.rejected[key] = why
            try:  # compiled again and stored in its place
                path.unlink()
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return compiled

    def _store(self, key: str, compiled: CompiledCluster) -> None:
        if self.directory is None:
            return
        header = json.dumps({"statistics": compiled.statistics.as_dict(),
                             "checked": compiled.checked}).encode()
        body = _MAGIC + struct.pack("<QQ", len(header), len(compiled.library)) + header + \
            compiled.library
        signature = _C.sign_digest(_entry_digest(key, body), self.signing_key).encode()
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_whole(path, body, signature)
        except OSError as e:  # a cache that cannot be written only costs time
            self.rejected[key] = f"not stored: {e}"
            return
        self._evict()

    def _evict(self) -> None:
        # A private file an interrupted write left (its process killed between writing and
        # renaming) goes after an hour; entries being written now are younger.
        for path in self.directory.glob("*/.tmp-*"):
            try:
                if time.time() - path.stat().st_mtime > 3600:
                    path.unlink()
            except OSError:
                pass
        entries = []
        # Code entries, and the model entries beside them (blade.model_cache).
        for path in [*self.directory.glob("*/*.code"), *self.directory.glob("*/*.model")]:
            try:
                info = path.stat()
            except OSError:
                continue
            entries.append((info.st_mtime, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                path.unlink()
                total -= size
            except OSError:
                pass


def write_whole(path: Path, *parts) -> None:
    """Writes `parts` (bytes-like) to `path` through a private file in its directory, renamed
    into place: readers see the whole file or none. Raises OSError (the private file gone)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
        raise


def _entry_digest(key: str, body: bytes) -> bytes:
    # Its own domain: no entry's digest is an engine's (csrc/ral/engine.cpp hashes framed
    # fields that start with "blade engine").
    return hashlib.sha256(b"blade cache entry\0" + key.encode() + b"\0" + body).digest()


def _parse_entry(key: str, data: bytes):
    """(CompiledCluster, "") for a whole entry signed by a trusted key, else (None, why)."""
    fixed = len(_MAGIC) + 16
    if not data.startswith(_MAGIC) or len(data) < fixed:
        return None, "not a Blade cache entry"
    header_size, library_size = struct.unpack_from("<QQ", data, len(_MAGIC))
    end = fixed + header_size + library_size
    if end > len(data):
        return None, "truncated"
    why = _C.verify_digest(_entry_digest(key, data[:end]), data[end:].decode("ascii", "replace"))
    if why:
        return None, why
    try:
        header = json.loads(data[fixed:fixed + header_size])
        checked = header["checked"]
        if not isinstance(checked, list) or not all(isinstance(p, str) for p in checked):
            raise ValueError(f"checked is {checked!r}, not a list of precisions")
        compiled = CompiledCluster(data[fixed + header_size:end],
                                   statistics=CodeStatistics.from_dict(header["statistics"]),
                                   checked=checked)
    except (ValueError, KeyError, TypeError) as e:
        return None, f"malformed header: {e}"
    return compiled, ""
