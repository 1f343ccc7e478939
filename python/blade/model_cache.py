"""Whole models, reused: a second `optimize` of the same model, with the same example inputs
and Config, in any process, skips everything after scripting.

The compile cache (blade.codegen.cache) spares a warm optimize code generation, but not the
front end: freezing, simplifying, the run that records types, clustering and importing
took about 1.3 s of a warm optimize of a 12-layer BERT-base encoder. So an optimized model
is also kept whole, keyed by everything that determines it:

- the model's code: forward's graph as scripting made it, with every method and function
  it calls inlined. A model whose forward runs code its graph does not show (an
  interface's method, a forked function, Python) or calls an op of a library (whose
  implementation the key cannot see) is not kept;
- every attribute that code reads, by its path from the model (lists, tuples and dicts
  element by element): a tensor by its dtype, sizes, strides, offset and the SHA-256 of
  its storage's bytes, which storage it shares with which other (tied weights), anything
  else by its value (a value of another kind, a custom class object, say, and the model
  is not kept);
- the tensor constants, and the example inputs, the same way (the run that records types
  takes the branches their values take);
- the Config fields that change the result, the compiler (Blade's sources, its C++
  libraries, the torch and torch-mlir versions), the host's CPU features, torch's thread
  count, default dtype and determinism and mkldnn flags, and which converters are
  registered (with a user's converter or decomposition registered, models are not kept:
  their code is the user's Python).

An entry holds the optimized module as `torch.jit.save` writes it, but with the engines
emptied: per engine, its fields, the compile cache key and digest of its code, its own
digest, and where each of its params comes from, a view of one of the model's tensors (by
path) or, for a tensor optimize made (a folded constant), the tensor itself. Graph
constants and kept submodule attributes that view the model's tensors are written as
markers. On a hit the model's tensors take the markers' places and the engines are made
again from the compile cache's code and the model's tensors, signed over the digest the
entry recorded, so that the weights are shared with the model as on a cold optimize, are
stored once, in the model, and are not hashed again. An optimized model that keeps tensors
in a list, tuple or dict constant is not kept (the entry would hold copies of them), nor
is one some of whose clusters failed to compile.

Entries live beside the compile cache's (`<cache dir>/<xx>/<key>.model`), are signed like
them (they hold TorchScript code, and name native code), written whole by a rename (on a
thread, while optimize returns: `wait_for_writes`), count towards the same size bound
(one takes at most a quarter of it) and are evicted with them; one that does not verify,
or whose code is gone from the compile cache, is a miss, and the optimize that follows
writes it again. The report says "hit", or why a model was not kept.
"""
import dataclasses
import hashlib
import io
import json
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from blade import _C
from blade.codegen.cache import CodeCache, compiler_fingerprint, write_whole
from blade.report import REPORT_ATTRIBUTE, Report, amend_report
from blade.frontend.decomposition_registry import _USER
from blade.partition.registry import REGISTRY
from blade.codegen.llvm import native
from blade.dump import Dumper

_MAGIC = b"blade optimized model 1\n"
# Nodes that run code the inlined graph does not show: a method or function call left (an
# interface's), a forked or awaited subgraph's calls, an attribute written, Python.
_UNKEYED_KINDS = ("prim::CallMethod", "prim::CallFunction", "prim::SetAttr", "prim::fork",
                  "prim::awaitable", "prim::PythonOp", "aten::wait")
# Ops whose implementation the torch version (in the key) determines; any other namespace
# is a library's.
_KEYED_NAMESPACES = ("aten", "prim", "quantized", "prims")
SUFFIX = ".model"
# Config fields that do not change what optimize makes (signing_key: the engines are signed
# again, with the caller's key, on a hit).
_NOT_KEYED = ("verbose", "progress", "cache_dir", "cache_max_bytes", "cache_models",
              "compile_workers", "signing_key", "calibration")


class NotKept(Exception):
    """Why a model is not kept in the model cache (the optimize goes on without it)."""


@dataclasses.dataclass
class ModelKey:
    """A model's key, and its tensors by path (what an entry's params are views of)."""

    digest: str
    tensors: Dict[str, torch.Tensor]


class ModelCache:
    """The model entries of a compile cache directory (see the module's docstring).

    One per optimize. A failure of the cache never fails the optimize: it is a miss, or a
    model not kept, which the report says.

    Example:
        >>> models = ModelCache.for_config(config)
        >>> models.hash_ahead(model)                 # while it is scripted
        >>> optimized = models.look_up(scripted, inputs, config)  # None: a miss
        >>> models.keep(optimized)                   # after a cold optimize
    """

    def __init__(self, code_cache: CodeCache, active: bool = True):
        self.code_cache = code_cache
        # Whether models are kept: the cache directory is on, and Config.cache_models.
        self.active = active and code_cache.directory is not None
        self._key: Optional[ModelKey] = None  # look_up's, which keep stores under
        self._not_kept = ""  # why the model is not kept
        self._hashing: Optional[threading.Thread] = None
        # storage -> (digest, the tensor hashed, its version then), from `hash_ahead`
        self._hashed: Dict[Tuple[int, int], Tuple[bytes, torch.Tensor, int]] = {}

    def hash_ahead(self, model) -> None:
        """Begins hashing the storages of `model`'s parameters and buffers on a thread
        (the hashing itself runs without the GIL, on the intra-op threads), while the
        caller scripts it: `key` then takes the digests of the tensors it finds unchanged
        (the same tensor, the same version), and hashing leaves the key's critical path."""
        if not self.active or not isinstance(model, torch.nn.Module):
            return
        tensors = [t for t in (*model.parameters(), *model.buffers())
                   if isinstance(t, torch.Tensor) and t.device.type == "cpu" and
                   t.layout == torch.strided and not t.is_quantized]

        def hash_all():
            for t in tensors:
                storage = _storage_of(t)
                if storage not in self._hashed:
                    version = t._version
                    self._hashed[storage] = (_C.storage_digest(t), t, version)

        self._hashing = threading.Thread(target=hash_all, name="blade-model-cache-hashing")
        self._hashing.start()

    def _digests_hashed_ahead(self) -> Dict[Tuple[int, int], Tuple[bytes, torch.Tensor, int]]:
        if self._hashing is not None:
            self._hashing.join()
            self._hashing = None
        return self._hashed

    @classmethod
    def for_config(cls, config) -> "ModelCache":
        return cls(CodeCache.for_config(config), config.cache_models)

    def look_up(self, scripted, inputs: Tuple, config) -> Optional[torch.jit.ScriptModule]:
        """The optimized model of `scripted` (in eval mode) on `inputs` under `config`, from
        the cache; None for a miss, when `keep` writes it."""
        if not self.active:
            return None
        try:
            self._key = self.key(scripted, inputs, config)
        except NotKept as e:
            self._not_kept = str(e)
            return None
        except Exception as e:  # noqa: BLE001  (the cache never fails an optimize)
            self._not_kept = f"{type(e).__name__}: {e}"
            return None
        try:
            return self.load(self._key, config)
        except Exception:  # noqa: BLE001  (an entry that cannot be used: a miss, written again)
            return None

    def keep(self, optimized) -> None:
        """Writes the entry of the model `look_up` missed, or says in the report why not."""
        if self._key is not None:
            try:
                self.store(self._key, optimized)
                self._not_kept = ""
            except NotKept as e:
                self._not_kept = str(e)
            except Exception as e:  # noqa: BLE001  (the cache never fails an optimize)
                self._not_kept = f"{type(e).__name__}: {e}"
        if self._not_kept:
            amend_report(optimized, model_cache=f"not kept: {self._not_kept}")

    def _path(self, key: ModelKey) -> Path:
        return self.code_cache.directory / key.digest[:2] / f"{key.digest}{SUFFIX}"

    # --- the key ---------------------------------------------------------------------------

    def key(self, scripted, inputs: Tuple, config) -> ModelKey:
        """The key of optimizing `scripted` (in eval mode) on `inputs` under `config`;
        raises NotKept when something it depends on cannot be keyed."""

        if Dumper.for_config(config.dump_dir).enabled or config.dry_run or \
                config.preserved_attributes:
            raise NotKept("dumps, dry runs and preserved attributes are not kept")
        keyer = _Keyer(self._digests_hashed_ahead())
        keyer.parts.append(_registry_fingerprint())
        graph = scripted._c._get_method("forward").graph.copy()
        torch._C._jit_pass_inline(graph)
        for kind in _C.node_kinds(graph):
            if kind in _UNKEYED_KINDS:
                raise NotKept(f"forward runs what its graph does not show ({kind})")
            if kind.split("::")[0] not in _KEYED_NAMESPACES:
                # Its implementation (a torch.library op's Python, a C++ extension's) is
                # not in the key, and freezing may fold it into the weights.
                raise NotKept(f"forward calls {kind}, an op of a library the key cannot see")
        modules = {next(graph.inputs()): ("", scripted._c)}
        for node in graph.findAllNodes("prim::GetAttr", True):
            if node.input() not in modules:
                continue  # an attribute of an object an attribute holds: keyed with it
            path, owner = modules[node.input()]
            name = node.s("name")
            path = f"{path}.{name}" if path else name
            value = owner.getattr(name)
            if isinstance(value, torch._C.ScriptModule):
                modules[node.output()] = (path, value)
            else:
                keyer.add(f"attribute {path}", value, path)
        for value in modules:
            for use in value.uses():
                if use.user.kind() != "prim::GetAttr":
                    raise NotKept(f"a module is used by {use.user.kind()}, not only read from")
        if _C.tensors_in_containers(graph):
            raise NotKept("forward holds tensors in list, tuple or dict constants")
        for index, constant in enumerate(_C.tensor_constants(graph)):
            keyer.add("constant", constant, f"constant {index}")
        keyer.add("inputs", tuple(inputs), None)
        if config.calibration is not None:  # by content: its repr would hide the values
            keyer.add("calibration", list(config.calibration), None)
        fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_KEYED}
        keyer.parts.append(json.dumps(fields, sort_keys=True, default=repr))
        keyer.parts.append(_environment())
        # Without the numbers TorchScript gives a class it compiles again (a traced or
        # exported model's, each time), which would make every such key new.
        keyer.parts.append(re.sub(r"___torch_mangle_\d+\.", "", str(graph)))
        digest = hashlib.sha256("\n".join(keyer.parts).encode()).hexdigest()
        return ModelKey(digest, keyer.tensors)

    # --- reading ---------------------------------------------------------------------------

    def load(self, key: ModelKey, config) -> Optional[torch.jit.ScriptModule]:
        """The optimized model of `key`, its engines made again from the compile cache's code
        and the model's tensors; None when there is no entry; raises NotKept (or whatever a
        damaged but verified entry makes fail) when the entry cannot be used."""
        wait_for_writes()  # an entry this process is writing is read whole
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                # Read into torch's allocation (64-byte aligned), which the tensors the entry
                # holds then view: they are as aligned as any weight the code reads.
                data = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)
                if f.readinto(data.numpy()) != data.numel():
                    return None
        except OSError:
            return None
        meta, module_bytes, tensor_bytes = _parse_entry(key.digest, data)
        with torch.no_grad():
            module = self._rebuild(meta, module_bytes, tensor_bytes, key, config)
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return module

    def _rebuild(self, meta, module_bytes: bytes, tensor_bytes: bytes, key: ModelKey, config):
        # The code each engine of the entry ran, byte for byte (its digest is part of the
        # engine's, which the engines made below are signed over).
        codes = {}
        for fields in meta["engines"].values():
            code_key = fields["code_key"]
            if code_key not in codes:
                if self._code_digest(code_key) != fields["code_digest"]:
                    raise NotKept("the compile cache holds other code for its engines")
                codes[code_key] = self.code_cache.code_tensor(code_key)
        stored = _read_tensors(meta["stored"], tensor_bytes)
        module = torch.jit.load(io.BytesIO(module_bytes))
        constants = [_unmarked(c, meta["constants"], key.tensors, stored)
                     for c in _C.tensor_constants(module.graph)]
        _C.set_tensor_constants(module.graph, constants, retype=True)
        for owner, name, tensor in _tensor_attributes(module._c):
            owner.setattr(name, _unmarked(tensor, meta["constants"], key.tensors, stored))
        for name, fields in meta["engines"].items():
            params = [_resolve(ref, key.tensors, stored) for ref in fields["params"]]
            # The key holds the digests of the model's tensors, so each param is the one the
            # entry's engine had, and so is the engine's digest: nothing is hashed again.
            engine = _C.create_signed_engine(
                name, codes[fields["code_key"]], fields["input_specs"], fields["output_specs"],
                fields["fallback_ir"], params, config.fallback, fields["cpu_features"],
                config.precision, config.signing_key or "", fields["writes"],
                digest=bytes.fromhex(fields["digest"]))
            if not engine.is_compiled():
                raise NotKept(f"{name} does not load: {engine.load_error()}")
            module._c.setattr(name, engine)
        amend_report(module, model_cache="hit")
        return module

    def _code_digest(self, code_key: str) -> str:
        self.code_cache._look_up(code_key)
        if code_key not in self.code_cache.compiled:
            raise NotKept("the code of its engines is not in the compile cache")
        return _C.storage_digest(self.code_cache.code_tensor(code_key)).hex()

    # --- writing ---------------------------------------------------------------------------

    def store(self, key: ModelKey, module) -> None:
        """Keeps `module`, the result of a cold optimize of `key`'s model, when every engine's
        code is in the compile cache; a model that cannot be kept is not (NotKept)."""
        report = Report.from_json(module._c.getattr(REPORT_ATTRIBUTE))
        if report.compile_errors:
            # Maybe a passing failure (a compile worker killed): not kept for good.
            raise NotKept("some clusters failed to compile")
        by_storage = {}
        for path, tensor in key.tensors.items():
            by_storage.setdefault(_storage_of(tensor), path)
        engines, stored, blanks = {}, [], {}
        for cluster in report.clusters:
            if not cluster.compiled:
                continue
            if not cluster.code_key:
                raise NotKept(f"{cluster.name}'s code is not in the compile cache")
            engine = module._c.getattr(cluster.name)
            refs = []
            for param in engine.params():
                if not isinstance(param, torch.Tensor):
                    raise NotKept(f"{cluster.name} reads a weight that is not a plain tensor, "
                                  "which the cache cannot store")
                refs.append(_reference(param, by_storage, key.tensors, stored))
            if not engine.digest():
                raise NotKept(f"{cluster.name} was not verified")
            engines[cluster.name] = {
                "code_key": cluster.code_key, "digest": engine.digest(),
                "code_digest": self._code_digest(cluster.code_key),
                "input_specs": engine.input_specs(),
                "output_specs": engine.output_specs(), "fallback_ir": engine.fallback_ir(),
                "cpu_features": engine.cpu_features(), "writes": engine.writes(),
                "params": refs}
            # What the saved module holds in the engine's place: its fields without code or
            # params (it does not load; the entry's reader replaces it).
            blanks[cluster.name] = (engine, _C.create_signed_engine(
                cluster.name, torch.empty(0, dtype=torch.uint8), engine.input_specs(),
                engine.output_specs(), engine.fallback_ir(), [], "fallback",
                engine.cpu_features(), engine.precision(), self.code_cache.signing_key,
                engine.writes()))
        if module._c._method_names() != ["forward"]:
            raise NotKept("the optimized module has methods besides forward")
        # Graph constants that view the model's tensors (the unspecialized model's weights
        # under the input guard, read where no engine gives them) are written as markers.
        graph = module.graph
        if _C.tensors_in_containers(graph):
            # Freezing left a list (or tuple, dict) of the model's tensors as a constant,
            # which the saved entry would hold copies of.
            raise NotKept("the optimized model holds tensors in list, tuple or dict constants")
        constants = _C.tensor_constants(graph)
        written, constant_refs = [], []
        for constant in constants:
            path = by_storage.get(_storage_of(constant))
            if path is None or key.tensors[path].dtype != constant.dtype:
                if _is_marker(constant):
                    raise NotKept("the model has a constant that reads as the entry's marker")
                written.append(constant)
                continue
            written.append(_marker(len(constant_refs)))
            constant_refs.append(_reference(constant, by_storage, key.tensors, stored))
        # So are the tensors of the submodules freezing kept (nn.MultiheadAttention's, whose
        # weights its fast path reads as attributes).
        attributes = []
        for owner, name, tensor in _tensor_attributes(module._c):
            path = by_storage.get(_storage_of(tensor))
            if path is not None and key.tensors[path].dtype == tensor.dtype:
                attributes.append((owner, name, tensor, _marker(len(constant_refs))))
                constant_refs.append(_reference(tensor, by_storage, key.tensors, stored))
        buffer = io.BytesIO()
        try:
            for name, (_, blank) in blanks.items():
                module._c.setattr(name, blank)
            for owner, name, _, marker in attributes:
                owner.setattr(name, marker)
            _C.set_tensor_constants(graph, written, retype=False)
            torch.jit.save(module, buffer)
        except RuntimeError as e:
            raise NotKept(f"the optimized module does not save: {e}")
        finally:
            _C.set_tensor_constants(graph, constants, retype=False)
            for owner, name, tensor, _ in attributes:
                owner.setattr(name, tensor)
            for name, (engine, _) in blanks.items():
                module._c.setattr(name, engine)
        stored_meta, storages, tensor_size = _layout(stored)
        module_bytes = buffer.getvalue()
        if tensor_size + len(module_bytes) > self.code_cache.max_bytes // 4:
            raise NotKept(f"its entry would take {tensor_size + len(module_bytes)} bytes, more "
                          "than a quarter of the cache's bound")
        meta = json.dumps({"engines": engines, "constants": constant_refs,
                           "stored": stored_meta}).encode()
        # Assembled, signed and written behind: the model is returned meanwhile (an entry
        # holds the model's folded weights to copy, hash and write, and the kernel's
        # writeback throttling can make the write alone slow).
        # Its directory is made here: one removed after optimize returned stays removed.
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NotKept(f"the cache directory cannot be written: {e}")
        writer = threading.Thread(
            target=_write_entry, name="blade-model-cache-writer",
            args=(path, key.digest, meta, module_bytes, storages, tensor_size, self.code_cache))
        writer.start()
        with _WRITERS_LOCK:
            _WRITERS.append(writer)


# Entries being written (non-daemon threads: the interpreter waits for them at exit).
_WRITERS: List[threading.Thread] = []
_WRITERS_LOCK = threading.Lock()


def wait_for_writes() -> None:
    """Returns once every entry this process began writing is in place (or failed to be).
    Code that removes a cache directory right after an optimize into it calls it first.

    Example:
        >>> with tempfile.TemporaryDirectory() as cache:
        ...     optimized = blade.optimize(model, inputs, blade.Config(cache_dir=cache))
        ...     blade.model_cache.wait_for_writes()
    """
    with _WRITERS_LOCK:
        writers = list(_WRITERS)
    for writer in writers:
        writer.join()
    with _WRITERS_LOCK:
        _WRITERS[:] = [w for w in _WRITERS if w.is_alive()]


def _write_entry(*args) -> None:
    try:
        _assemble_and_write(*args)
    except Exception:  # noqa: BLE001  (a cache that cannot be written only costs time)
        pass


def _assemble_and_write(path: Path, key: str, meta: bytes, module_bytes: bytes,
                        storages: List, tensor_size: int, code_cache: CodeCache) -> None:
    """Writes an entry: [magic, sizes, meta][module][tensors], the meta padded with spaces
    and the module with zeros to whole _ALIGNMENTs, so that the tensors a reader views are
    aligned; then its signature."""
    fixed = len(_MAGIC) + 24
    head_size = _aligned(fixed + len(meta))
    tensor_start = _aligned(head_size + len(module_bytes))
    body = torch.empty(tensor_start + tensor_size, dtype=torch.uint8)

    def put(at: int, data: bytes) -> None:
        body[at:at + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

    put(0, _MAGIC + struct.pack("<QQQ", head_size, len(module_bytes), tensor_size))
    body[fixed:head_size] = ord(" ")
    put(fixed, meta)
    body[head_size:tensor_start] = 0
    put(head_size, module_bytes)
    # Each storage copied once, and nothing else written there first.
    end = tensor_start
    for start, storage in storages:
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        body[end:tensor_start + start] = 0  # the alignment padding before it
        body[tensor_start + start:tensor_start + start + flat.numel()] = flat
        end = tensor_start + start + flat.numel()
    body[end:] = 0
    signature = _C.sign_digest(_entry_digest(key, body), code_cache.signing_key).encode()
    try:
        write_whole(path, body.numpy(), signature)
    except OSError:
        return
    code_cache._evict()


class _Keyer:
    """Writes values into the key's parts; tensors by metadata and storage digest."""

    def __init__(self, hashed: Dict[Tuple[int, int], Tuple[bytes, torch.Tensor, int]]):
        self.parts: List[str] = []
        self.tensors: Dict[str, torch.Tensor] = {}
        self._storages: Dict[Tuple[int, int], int] = {}  # storage -> its number in the key
        self._hashed = hashed  # ModelCache.hash_ahead's

    def _digest(self, t: torch.Tensor, storage: Tuple[int, int]) -> bytes:
        known = self._hashed.get(storage)
        if known is not None and known[1]._cdata == t._cdata and known[1]._version == known[2]:
            return known[0]
        return _C.storage_digest(t)

    def add(self, label: str, value: Any, path: Optional[str]) -> None:
        """Keys `value`; its tensors, and those of its lists, tuples and dicts, are known
        by `path` (`path[0]`, `path['key']`) unless it is None (an example input's, which
        no entry may name)."""
        self.parts.append(f"{label}: {self._encode(value, path)}")

    def _encode(self, value: Any, path: Optional[str]) -> str:
        def inner(suffix: str) -> Optional[str]:
            return None if path is None else f"{path}{suffix}"

        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if value is None or isinstance(value, (bool, int, float, str, torch.dtype,
                                               torch.device, torch.layout,
                                               torch.memory_format)):
            return f"{type(value).__name__}({value!r})"
        if isinstance(value, (list, tuple)):
            items = ", ".join(self._encode(v, inner(f"[{i}]")) for i, v in enumerate(value))
            return f"{type(value).__name__}[{items}]"
        if isinstance(value, dict):
            items = ", ".join(f"{self._encode(k, None)}: {self._encode(v, inner(f'[{k!r}]'))}"
                              for k, v in value.items())
            return f"dict{{{items}}}"
        raise NotKept(f"the model holds a {type(value).__name__} (a packed quantized weight, "
                      "say), which the cache cannot tell apart from another's")

    def _tensor(self, t: torch.Tensor, path: Optional[str]) -> str:
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or \
                t.is_nested or t.is_conj() or t.is_neg() or \
                type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise NotKept(f"a {t.layout} {t.device} tensor of type {type(t).__name__} "
                          "(or a lazily conjugated or negated view) cannot be keyed")
        storage = _storage_of(t)
        if storage not in self._storages:
            self._storages[storage] = len(self._storages)
            self.parts.append(f"storage {self._storages[storage]}: {storage[1]} bytes "
                              f"{self._digest(t, storage).hex()}")
        if path is not None:
            self.tensors[path] = t
        return (f"tensor(storage {self._storages[storage]}, offset {t.storage_offset()}, "
                f"{t.dtype}, {list(t.shape)}, {list(t.stride())}, "
                f"requires_grad={t.requires_grad})")


def _storage_of(t: torch.Tensor) -> Tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _reference(param: torch.Tensor, by_storage: Dict, tensors: Dict[str, torch.Tensor],
               stored: List[torch.Tensor]) -> List:
    """Where an engine's param comes from: ["view", path, offset, sizes, strides], a view of
    the model's tensor at `path` (its storage), or ["stored", index]."""
    path = by_storage.get(_storage_of(param))
    if path is not None and tensors[path].dtype == param.dtype:
        return ["view", path, param.storage_offset(), list(param.shape), list(param.stride())]
    stored.append(param)
    return ["stored", len(stored) - 1]


_ALIGNMENT = 64  # of the parts of an entry, and of each storage in its tensor bytes


def _aligned(size: int) -> int:
    return size + (-size % _ALIGNMENT)


def _layout(stored: List[torch.Tensor]) -> Tuple[List, List, int]:
    """Where the tensors an entry holds itself go in its tensor bytes: per tensor [dtype,
    sizes, strides, offset, start, nbytes] (its storage's bytes at `start`, each storage
    once), the (start, storage) to copy, and the bytes they take in all."""
    starts: Dict[Tuple[int, int], int] = {}
    meta, storages, end = [], [], 0
    for t in stored:
        storage = _storage_of(t)
        if storage not in starts:
            starts[storage] = end
            storages.append((end, t.untyped_storage()))
            end += storage[1] + (-storage[1] % _ALIGNMENT)
        meta.append([str(t.dtype).removeprefix("torch."), list(t.shape), list(t.stride()),
                     t.storage_offset(), starts[storage], storage[1]])
    return meta, storages, end


def _read_tensors(meta: List, data: torch.Tensor) -> List[torch.Tensor]:
    """The tensors `_layout` placed, viewing `data` (an entry's tensor bytes, uint8)."""
    tensors = []
    try:
        for dtype_name, sizes, strides, offset, start, nbytes in meta:
            dtype = getattr(torch, dtype_name)
            if not isinstance(dtype, torch.dtype) or not isinstance(start, int) or \
                    not isinstance(nbytes, int) or start % _ALIGNMENT or start < 0 or \
                    nbytes < 0 or start + nbytes > data.numel():
                raise ValueError(f"a stored tensor of {dtype_name} at {start}")
            size = torch.empty((), dtype=dtype).element_size()
            storage = data[start:start + nbytes - nbytes % size].view(dtype)
            tensors.append(_view(storage, sizes, strides, offset, f"stored tensor {len(tensors)}",
                                 slice_of_entry=True))
    except (TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise NotKept(f"malformed entry: {e}")
    return tensors


def _view(base: torch.Tensor, sizes, strides, offset: int, what: str,
          slice_of_entry: bool = False) -> torch.Tensor:
    """A view of the storage under `base`: sizes, strides and an offset counted in elements
    from the storage's start (a model's tensor) or, with `slice_of_entry`, from base's first
    element (base: a 1-d slice of the entry's bytes); refused unless it stays within (the
    whole storage, or the slice). Not a view autograd records: a weight's view requires no
    grad, as a frozen constant does."""
    if not isinstance(offset, int) or len(sizes) != len(strides) or offset < 0 or any(
            not isinstance(n, int) or n < 0 for n in [*sizes, *strides]):
        raise NotKept(f"a malformed view of {what}")
    if slice_of_entry:
        first, elements = base.storage_offset(), base.numel()
    else:
        first, elements = 0, base.untyped_storage().nbytes() // base.element_size()
    if all(n > 0 for n in sizes):
        last = offset + sum((n - 1) * st for n, st in zip(sizes, strides))
        if last >= elements:
            raise NotKept(f"a view past the elements of {what}")
    return base.detach().as_strided(sizes, strides, first + offset)


def _resolve(ref: List, tensors: Dict[str, torch.Tensor], stored: List) -> torch.Tensor:
    if ref[0] == "view" and ref[1] in tensors:
        _, path, offset, sizes, strides = ref
        return _view(tensors[path], sizes, strides, offset, path)
    if ref[0] == "stored" and isinstance(ref[1], int) and 0 <= ref[1] < len(stored):
        return stored[ref[1]]
    raise NotKept(f"a param's source {ref[:2]} is not in the model")


# A graph constant the entry does not hold: int64 [_MARK, _MARK + 1, index into the entry's
# "constants"], which no model's constant is (its key would say so anyway).
_MARK = 0x5be7a3c10f2d4e61


def _marker(index: int) -> torch.Tensor:
    return torch.tensor([_MARK, _MARK + 1, index], dtype=torch.int64)


def _is_marker(t: torch.Tensor) -> bool:
    return t.dtype == torch.int64 and tuple(t.shape) == (3,) and \
        t[0].item() == _MARK and t[1].item() == _MARK + 1


def _unmarked(constant: torch.Tensor, refs: List, tensors: Dict[str, torch.Tensor],
              stored: List) -> torch.Tensor:
    """The model's tensor a loaded constant marks, or the constant itself."""
    if not _is_marker(constant):
        return constant
    index = constant[2].item()
    if not 0 <= index < len(refs):
        raise NotKept(f"a marked constant names entry {index} of {len(refs)}")
    return _resolve(refs[index], tensors, stored)


def _tensor_attributes(root) -> List[Tuple[Any, str, torch.Tensor]]:
    """(module, name, tensor) for each tensor attribute of `root` and its submodules."""
    found = []
    pending = [root]
    while pending:
        owner = pending.pop()
        for name, value in torch._C._jit_debug_module_iterators(owner)["named_attributes"]:
            if isinstance(value, torch._C.ScriptModule):
                pending.append(value)
            elif isinstance(value, torch.Tensor):
                found.append((owner, name, value))
            elif _holds_tensors(value):
                raise NotKept(f"the optimized model keeps tensors in its attribute {name}, "
                              "a list, tuple or dict")
    return found


def _holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    return False


def _registry_fingerprint() -> str:
    """Which converters are registered; raises NotKept when the user registered a converter
    or a decomposition (their code is the user's Python, which the key cannot see)."""

    if _USER:
        raise NotKept("a user decomposition is registered")
    counts = []
    for schema in REGISTRY.schemas():
        entries = REGISTRY.entries(schema)
        if any(c.origin.startswith("user") for c in entries):
            raise NotKept(f"a user converter of {schema} is registered")
        counts.append(f"{schema} {len(entries)}")
    return hashlib.sha256("\n".join(counts).encode()).hexdigest()


def _environment() -> str:

    libraries = []
    package = Path(__file__).resolve().parent
    for library in sorted(package.glob("*.so")):
        info = library.stat()
        libraries.append(f"{library.name} {info.st_size} {info.st_mtime_ns}")
    # Global state that changes what scripting, freezing or the runs make.
    state = (f"threads {torch.get_num_threads()}, default dtype {torch.get_default_dtype()}, "
             f"deterministic {torch.are_deterministic_algorithms_enabled()}, "
             f"mkldnn {torch.backends.mkldnn.enabled}, "
             f"int8 weights within {_C.int8_weight_limit()}")
    return "\n".join([compiler_fingerprint(), torch.__version__, native.host_cpu_features(),
                      state, *libraries])


def _entry_digest(key: str, body: torch.Tensor) -> bytes:
    """The digest an entry's signature signs: of its key and its body (uint8, contiguous,
    hashed in chunks on the intra-op threads: a ResNet-50's entry holds its folded weights,
    94 MB)."""
    body_digest = _C.storage_digest(body.clone() if body.storage_offset() or
                                    body.untyped_storage().nbytes() != body.numel() else body)
    # A domain of its own: no model entry's digest is a code entry's or an engine's.
    return hashlib.sha256(b"blade model entry\0" + key.encode() + b"\0" + body_digest).digest()


def _parse_entry(key: str, data: torch.Tensor):
    """(meta, module bytes, tensor bytes) of a whole entry (`data`, uint8) signed by a
    trusted key: the module's as bytes, the tensors' as a uint8 tensor viewing `data`;
    raises NotKept otherwise."""
    fixed = len(_MAGIC) + 24
    view = memoryview(data.numpy())
    if len(view) < fixed or bytes(view[:len(_MAGIC)]) != _MAGIC:
        raise NotKept("not a Blade model entry")
    head, module_size, tensor_size = struct.unpack_from("<QQQ", view, len(_MAGIC))
    tensor_start = _aligned(head + module_size)
    end = tensor_start + tensor_size
    if head < fixed or head % _ALIGNMENT or end > len(view):
        raise NotKept("truncated")
    why = _C.verify_digest(_entry_digest(key, data[:end]),
                           bytes(view[end:]).decode("ascii", "replace"))
    if why:
        raise NotKept(why)
    try:
        meta = json.loads(bytes(view[fixed:head]).rstrip(b" "))
        if not isinstance(meta.get("engines"), dict) or \
                not isinstance(meta.get("constants"), list) or \
                not isinstance(meta.get("stored"), list):
            raise ValueError("no engines, constants or stored tensors")
    except ValueError as e:
        raise NotKept(f"malformed entry: {e}")
    return meta, bytes(view[head:head + module_size]), data[tensor_start:end]
