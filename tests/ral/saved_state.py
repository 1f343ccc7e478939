"""Reads and rewrites the engines' pickled state inside a saved model, as an attacker with a
hex editor could: the tests of hostile files (test_hostile_files.py, make_fixtures.py) edit
any field of an engine, not only those the runtime would write itself.

A TorchScript archive's data.pkl is a pickle (protocol 2) whose globals are TorchScript's own
(`__torch__...`, `torch._utils _rebuild_tensor_v2`, ...) and whose tensors are persistent ids
naming archive members. It is read here into plain Python values plus `Call` objects (one per
global applied to arguments, or created and then given a state) and written back without
memo, which TorchScript's unpickler reads as well."""
import io
import pickle
import struct
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

ENGINE_CLASS = ("__torch__.torch.classes.blade", "Engine")
GUARD_CLASS = ("__torch__.torch.classes.blade", "Guard")
# Positions in Engine::State (csrc/ral/engine.h).
VERSION, NAME, MODE, FALLBACK_IR, PARAMS, INPUT_SPECS, OUTPUT_SPECS, META, CODE = range(9)


class Global:
    """A global named without being called (a storage type inside a persistent id)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class Call:
    """`module.name` applied to `args` (REDUCE), or created empty and given `state` (NEWOBJ,
    BUILD)."""

    def __init__(self, module: str, name: str, args=(), state=None, created=False):
        self.module, self.name, self.args = module, name, args
        self.state, self.created = state, created


class PersistentId:
    def __init__(self, pid):
        self.pid = pid


class _Reader(pickle.Unpickler):
    def find_class(self, module, name):
        class Recorded:
            def __new__(cls, *args):
                call = object.__new__(cls)
                call.args, call.created, call.state = args, True, None
                return call

            def __init__(self, *args):
                self.args, self.created = args, False

            def __setstate__(self, state):
                self.state = state

        Recorded.module, Recorded.name = module, name
        return Recorded

    def persistent_load(self, pid):
        return PersistentId(pid)


def _as_calls(value):
    """The reader's Recorded classes and objects as Global and Call, recursively."""
    if isinstance(value, type) and hasattr(value, "module"):
        return Global(value.module, value.name)
    if hasattr(value, "module") and hasattr(value, "created"):
        return Call(value.module, value.name, _as_calls(value.args), _as_calls(value.state),
                    value.created)
    if isinstance(value, PersistentId):
        return PersistentId(_as_calls(value.pid))
    if isinstance(value, tuple):
        return tuple(_as_calls(v) for v in value)
    if isinstance(value, list):
        return [_as_calls(v) for v in value]
    if isinstance(value, dict):
        return {_as_calls(k): _as_calls(v) for k, v in value.items()}
    return value


def load_pickle(data: bytes):
    return _as_calls(_Reader(io.BytesIO(data)).load())


def dump_pickle(value) -> bytes:
    out = io.BytesIO()
    out.write(b"\x80\x02")
    _write(out, value)
    out.write(b".")
    return out.getvalue()


def _write(out, value) -> None:
    if value is None:
        out.write(b"N")
    elif value is True or value is False:
        out.write(b"\x88" if value else b"\x89")
    elif isinstance(value, int):
        if -2 ** 31 <= value < 2 ** 31:
            out.write(b"J" + struct.pack("<i", value))
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            out.write(b"\x8a" + bytes([len(raw)]) + raw)
    elif isinstance(value, float):
        out.write(b"G" + struct.pack(">d", value))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out.write(b"X" + struct.pack("<I", len(raw)) + raw)
    elif isinstance(value, tuple):
        if not value:
            out.write(b")")
            return
        out.write(b"(")
        for item in value:
            _write(out, item)
        out.write(b"t")
    elif isinstance(value, list):
        out.write(b"]")
        if value:
            out.write(b"(")
            for item in value:
                _write(out, item)
            out.write(b"e")
    elif isinstance(value, dict):
        out.write(b"}")
        if value:
            out.write(b"(")
            for k, v in value.items():
                _write(out, k)
                _write(out, v)
            out.write(b"u")
    elif isinstance(value, PersistentId):
        _write(out, value.pid)
        out.write(b"Q")
    elif isinstance(value, Global):
        out.write(b"c" + f"{value.module}\n{value.name}\n".encode())
    elif isinstance(value, Call):
        out.write(b"c" + f"{value.module}\n{value.name}\n".encode())
        _write(out, tuple(value.args or ()))
        if value.created:
            out.write(b"\x81")
            if value.state is not None:
                _write(out, value.state)
                out.write(b"b")
        else:
            out.write(b"R")
    else:
        raise TypeError(f"cannot write {type(value).__name__} into a TorchScript pickle")


def engines(value, cls=ENGINE_CLASS) -> List[Call]:
    """The objects of class `cls` (Blade's Engine by default) inside a loaded data.pkl, in
    order."""
    found = []
    if isinstance(value, Call):
        if (value.module, value.name) == cls:
            found.append(value)
        for part in (value.args, value.state):
            found += engines(part, cls)
    elif isinstance(value, (list, tuple)):
        for item in value:
            found += engines(item, cls)
    elif isinstance(value, dict):
        for item in value.values():
            found += engines(item, cls)
    return found


def byte_tensor(storage_key: str, size: int) -> Call:
    """A uint8 tensor of `size` elements whose bytes are archive member data/<storage_key>."""
    storage = PersistentId(("storage", Global("torch", "ByteStorage"), storage_key, "cpu", size))
    return Call("torch._utils", "_rebuild_tensor_v2",
                args=(storage, 0, (size,), (1,), False,
                      Call("collections", "OrderedDict", args=())))


def rewrite_engines(source: Path, target: Path,
                    edit: Callable[[List, Dict[str, bytes]], Optional[List]],
                    cls=ENGINE_CLASS) -> int:
    """Writes `source` to `target` with each engine's state passed through
    `edit(state, new_members)`: `state` is the list of Engine::State's fields (see the
    positions above), and `new_members` maps storage keys to bytes for new archive members
    (data/<key>); `edit` returns the new state, or None to leave the engine alone. Returns
    how many engines were edited. `cls` names another class to edit instead (the Guard)."""
    with zipfile.ZipFile(source) as src:
        pickle_name = next(n for n in src.namelist() if n.endswith("/data.pkl"))
        prefix = pickle_name[:-len("data.pkl")]
        root = load_pickle(src.read(pickle_name))
        new_members: Dict[str, bytes] = {}
        edited = 0
        for engine in engines(root, cls):
            new = edit(list(engine.state), new_members)
            if new is not None:
                engine.state = tuple(new)
                edited += 1
        with zipfile.ZipFile(target, "w") as dst:
            for item in src.infolist():
                data = dump_pickle(root) if item.filename == pickle_name else \
                    src.read(item.filename)
                dst.writestr(item, data)
            for key, data in new_members.items():
                dst.writestr(f"{prefix}data/{key}", data)
    return edited


def member_bytes(path: Path, tensor: Call) -> bytes:
    """The bytes of the archive member a saved uint8 tensor (`byte_tensor`'s shape) reads."""
    key = tensor.args[0].pid[2]
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith(f"/data/{key}"))
        return archive.read(name)


def evil_library(directory: Path, marker: Path) -> bytes:
    """The bytes of a shared library whose constructor creates `marker` the moment it is
    loaded, and which exports the entry point an engine's code has: what an attacker puts
    in place of an engine's code."""
    source = directory / "evil.c"
    source.write_text(textwrap.dedent(f"""
        #include <fcntl.h>
        #include <unistd.h>
        __attribute__((constructor)) static void pwned(void) {{
          int fd = open("{marker}", O_CREAT | O_WRONLY, 0644);
          if (fd >= 0) close(fd);
        }}
        void blade_entry(void** args) {{ (void)args; }}
    """))
    library = directory / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library.read_bytes()
