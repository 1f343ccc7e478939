"""Whole models, reused: a second `optimize` of the same model, with the same example inputs
and Config, in any process, skips everything after scripting.

The compile cache (blade.codegen.cache) spares a warm optimize code generation, but not the
front end: freezing, simplifying, the run that records types, clustering and importing
took about 1.3 s of a warm optimize of a 12-layer BERT-base encoder. So an optimized model
is also kept whole, keyed by everything that determines it:

- the model's code: forward's graph as scripting made it, with every method and function
  it calls inlined (a model whose forward calls what cannot be inlined, an interface's
  method, is not kept);
- every attribute that code reads, by its path from the model: a tensor by its dtype,
  sizes, strides, offset and the SHA-256 of its storage's bytes, which storage it shares
  with which other (tied weights), anything else by its value (a value of another kind,
  a custom class object, say, and the model is not kept);
- the example inputs the same way, since the run that records types takes the branches
  their values take;
- the Config fields that change the result, the compiler (Blade's sources, its C++
  libraries, the torch and torch-mlir versions), the host's CPU features, torch's thread
  count, and which converters are registered (with a user's converter or decomposition
  registered, models are not kept: their code is the user's Python).

An entry holds the optimized module as `torch.jit.save` writes it, but with the engines
emptied: per engine, its fields, the compile cache key of its code, and where each of its
params comes from, a view of one of the model's tensors (by path) or, for a tensor
optimize made (a folded constant), the tensor itself. On a hit the engines are made again
from the compile cache's code and the model's own tensors, so that the weights are shared
with the model as on a cold optimize and are stored once, in the model. Graph constants
that are no engine's param are in the entry itself (the key holds their values).

Entries live beside the compile cache's (`<cache dir>/<xx>/<key>.model`), are signed like
them (they hold TorchScript code, and name native code), written whole by a rename, count
towards the same size bound and are evicted with them; one that does not verify, or whose
code is gone from the compile cache, is a miss, and the optimize that follows writes it
again.
"""
import dataclasses
import hashlib
import io
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from blade import _C
from blade.codegen.cache import CodeCache, compiler_fingerprint
from blade.report import REPORT_ATTRIBUTE, Report

_MAGIC = b"blade optimized model 1\n"
SUFFIX = ".model"
# Config fields that do not change what optimize makes (signing_key: the engines are signed
# again, with the caller's key, on a hit).
_NOT_KEYED = ("verbose", "progress", "cache_dir", "cache_max_bytes", "cache_models",
              "compile_workers", "signing_key")


class NotKept(Exception):
    """Why a model is not kept in the model cache (the optimize goes on without it)."""


@dataclasses.dataclass
class ModelKey:
    """A model's key, and its tensors by path (what an entry's params are views of)."""

    digest: str
    tensors: Dict[str, torch.Tensor]


class ModelCache:
    """The model entries of a compile cache directory (see the module's docstring).

    Example:
        >>> models = ModelCache(code_cache)
        >>> key = models.key(scripted, inputs, config)
        >>> optimized = models.load(key, config)  # None: a miss
        >>> models.store(key, optimized)           # after a cold optimize
    """

    def __init__(self, code_cache: CodeCache):
        self.code_cache = code_cache
        self.rejected = ""  # why the entry found was not used

    @property
    def enabled(self) -> bool:
        return self.code_cache.directory is not None

    def _path(self, key: ModelKey) -> Path:
        return self.code_cache.directory / key.digest[:2] / f"{key.digest}{SUFFIX}"

    # --- the key ---------------------------------------------------------------------------

    def key(self, scripted, inputs: Tuple, config) -> ModelKey:
        """The key of optimizing `scripted` (in eval mode) on `inputs` under `config`;
        raises NotKept when something it depends on cannot be keyed."""
        if config.dump_dir or config.dry_run or config.preserved_attributes:
            raise NotKept("dumps, dry runs and preserved attributes are not kept")
        keyer = _Keyer()
        keyer.parts.append(_registry_fingerprint())
        graph = scripted._c._get_method("forward").graph.copy()
        torch._C._jit_pass_inline(graph)
        for kind in ("prim::CallMethod", "prim::CallFunction", "prim::SetAttr"):
            if graph.findAllNodes(kind, True):
                raise NotKept(f"forward calls or writes what cannot be inlined ({kind})")
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
        for constant in _C.tensor_constants(graph):
            keyer.add("constant", constant)
        keyer.add("inputs", tuple(inputs))
        fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_KEYED}
        keyer.parts.append(json.dumps(fields, sort_keys=True, default=repr))
        keyer.parts.append(_environment())
        keyer.parts.append(str(graph))
        digest = hashlib.sha256("\n".join(keyer.parts).encode()).hexdigest()
        return ModelKey(digest, keyer.tensors)

    # --- reading ---------------------------------------------------------------------------

    def load(self, key: ModelKey, config) -> Optional[torch.jit.ScriptModule]:
        """The optimized model of `key`, its engines made again from the compile cache's code
        and the model's tensors; None when there is no usable entry (`rejected` says why
        one was not used)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(data) != len(data):
                    return None
        except OSError:
            return None
        try:
            meta, module_bytes, tensor_bytes = _parse_entry(key.digest, data)
            module = self._rebuild(meta, module_bytes, tensor_bytes, key, config)
        except NotKept as e:
            self.rejected = str(e)
            return None
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            # A verified entry that still does not make a model (written by a Blade whose
            # fingerprint collided, say): a miss, never a failed optimize.
            self.rejected = f"{type(e).__name__}: {e}"
            return None
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
            engine = _C.create_engine_with_digest(
                name, codes[fields["code_key"]], fields["input_specs"], fields["output_specs"],
                fields["fallback_ir"], params, config.fallback, fields["cpu_features"],
                config.precision, config.signing_key or "", fields["writes"],
                bytes.fromhex(fields["digest"]))
            if not engine.is_compiled():
                raise NotKept(f"{name} does not load: {engine.load_error()}")
            module._c.setattr(name, engine)
        report = Report.from_json(module._c.getattr(REPORT_ATTRIBUTE))
        report.model_cache = "hit"
        module._c.setattr(REPORT_ATTRIBUTE, report.to_json())
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
                    raise NotKept(f"{cluster.name} has a param that is no tensor")
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
                engine.cpu_features(), engine.precision(), "", engine.writes()))
        if module._c._method_names() != ["forward"]:
            raise NotKept("the optimized module has methods besides forward")
        # Graph constants that view the model's tensors (the unspecialized model's weights
        # under the input guard, read where no engine gives them) are written as markers.
        graph = module.graph
        constants = _C.tensor_constants(graph)
        written, constant_refs = [], []
        for constant in constants:
            path = by_storage.get(_storage_of(constant))
            if path is None or key.tensors[path].dtype != constant.dtype:
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
        if tensor_size > self.code_cache.max_bytes // 8:
            raise NotKept(f"the tensors optimize made take {tensor_size} bytes, more than an "
                          "eighth of the cache")
        meta = json.dumps({"engines": engines, "constants": constant_refs,
                           "stored": stored_meta}).encode()
        module_bytes = buffer.getvalue()
        head = _MAGIC + struct.pack("<QQQ", len(meta), len(module_bytes), tensor_size) + meta + \
            module_bytes
        # One buffer, each storage copied into it once (a ResNet-50's folded weights: 94 MB).
        body = bytearray(len(head) + tensor_size)
        body[:len(head)] = head
        for start, storage in storages:
            flat = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            body[len(head) + start:len(head) + start + len(flat)] = memoryview(flat)
        signature = _C.sign_digest(_entry_digest(key.digest, body),
                                   self.code_cache.signing_key).encode()
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.write(signature)
            os.replace(temporary, path)
        except OSError:  # a cache that cannot be written only costs time
            return
        self.code_cache._evict()


class _Keyer:
    """Writes values into the key's parts; tensors by metadata and storage digest."""

    def __init__(self):
        self.parts: List[str] = []
        self.tensors: Dict[str, torch.Tensor] = {}
        self._storages: Dict[Tuple[int, int], int] = {}  # storage -> its number in the key

    def add(self, label: str, value: Any, path: Optional[str] = None) -> None:
        self.parts.append(f"{label}: {self._encode(value, path)}")

    def _encode(self, value: Any, path: Optional[str]) -> str:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if value is None or isinstance(value, (bool, int, float, str, torch.dtype,
                                               torch.device, torch.layout,
                                               torch.memory_format)):
            return f"{type(value).__name__}({value!r})"
        if isinstance(value, (list, tuple)):
            items = ", ".join(self._encode(v, None) for v in value)
            return f"{type(value).__name__}[{items}]"
        if isinstance(value, dict):
            items = ", ".join(f"{self._encode(k, None)}: {self._encode(v, None)}"
                              for k, v in value.items())
            return f"dict{{{items}}}"
        raise NotKept(f"a value of type {type(value).__name__} cannot be keyed")

    def _tensor(self, t: torch.Tensor, path: Optional[str]) -> str:
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or \
                t.is_nested or type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise NotKept(f"a {t.layout} {t.device} tensor of type {type(t).__name__} "
                          "cannot be keyed")
        storage = _storage_of(t)
        if storage not in self._storages:
            self._storages[storage] = len(self._storages)
            self.parts.append(f"storage {self._storages[storage]}: {storage[1]} bytes "
                              f"{_C.storage_digest(t).hex()}")
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


_ALIGNMENT = 64  # of each storage in an entry's tensor bytes


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


def _read_tensors(meta: List, data) -> List[torch.Tensor]:
    """The tensors `_written_tensors` wrote, viewing `data` (an entry's tensor bytes)."""
    tensors = []
    try:
        for dtype_name, sizes, strides, offset, start, nbytes in meta:
            dtype = getattr(torch, dtype_name)
            if not isinstance(dtype, torch.dtype) or start % _ALIGNMENT or start < 0 or \
                    nbytes < 0 or start + nbytes > len(data):
                raise ValueError(f"a stored tensor of {dtype_name} at {start}")
            size = torch.empty((), dtype=dtype).element_size()
            flat = torch.frombuffer(data, dtype=dtype, count=nbytes // size, offset=start) \
                if nbytes >= size else torch.empty(0, dtype=dtype)
            tensors.append(_view(flat, sizes, strides, offset, f"stored tensor {len(tensors)}"))
    except (TypeError, ValueError, AttributeError) as e:
        raise NotKept(f"malformed entry: {e}")
    return tensors


def _view(base: torch.Tensor, sizes, strides, offset: int, what: str) -> torch.Tensor:
    """base.as_strided(sizes, strides, offset), refused unless it stays inside base's
    storage."""
    if len(sizes) != len(strides) or offset < 0 or any(
            not isinstance(n, int) or n < 0 for n in [*sizes, *strides]):
        raise NotKept(f"a malformed view of {what}")
    if all(n > 0 for n in sizes):
        last = offset + sum((n - 1) * st for n, st in zip(sizes, strides))
        if (last + 1) * base.element_size() > base.untyped_storage().nbytes():
            raise NotKept(f"a view past the storage of {what}")
    return base.as_strided(sizes, strides, offset)


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


def _unmarked(constant: torch.Tensor, refs: List, tensors: Dict[str, torch.Tensor],
              stored: List) -> torch.Tensor:
    """The model's tensor a loaded constant marks, or the constant itself."""
    if constant.dtype != torch.int64 or tuple(constant.shape) != (3,) or \
            constant[0].item() != _MARK or constant[1].item() != _MARK + 1:
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
    return found


def _registry_fingerprint() -> str:
    """Which converters are registered; raises NotKept when the user registered a converter
    or a decomposition (their code is the user's Python, which the key cannot see)."""
    from blade.frontend.decomposition_registry import _USER
    from blade.partition.registry import REGISTRY

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
    from blade.codegen.llvm import native

    libraries = []
    package = Path(__file__).resolve().parent
    for library in sorted(package.glob("*.so")):
        info = library.stat()
        libraries.append(f"{library.name} {info.st_size} {info.st_mtime_ns}")
    return "\n".join([compiler_fingerprint(), torch.__version__, native.host_cpu_features(),
                      f"threads {torch.get_num_threads()}", *libraries])


def _entry_digest(key: str, body) -> bytes:
    """The digest an entry's signature signs: of its key and its body (hashed in chunks on
    the intra-op threads: a ResNet-50's entry holds its folded weights, 94 MB)."""
    body_digest = _C.storage_digest(torch.frombuffer(body, dtype=torch.uint8))
    # A domain of its own: no model entry's digest is a code entry's or an engine's.
    return hashlib.sha256(b"blade model entry\0" + key.encode() + b"\0" + body_digest).digest()


def _parse_entry(key: str, data: bytearray):
    """(meta, module bytes, tensor bytes) of a whole entry signed by a trusted key (views of
    `data`); raises NotKept otherwise."""
    fixed = len(_MAGIC) + 24
    if not data.startswith(_MAGIC) or len(data) < fixed:
        raise NotKept("not a Blade model entry")
    sizes = struct.unpack_from("<QQQ", data, len(_MAGIC))
    end = fixed + sum(sizes)
    if end > len(data):
        raise NotKept("truncated")
    view = memoryview(data)
    why = _C.verify_digest(_entry_digest(key, view[:end]),
                           bytes(view[end:]).decode("ascii", "replace"))
    if why:
        raise NotKept(why)
    meta_end = fixed + sizes[0]
    module_end = meta_end + sizes[1]
    try:
        meta = json.loads(bytes(view[fixed:meta_end]))
        if not isinstance(meta.get("engines"), dict) or \
                not isinstance(meta.get("constants"), list) or \
                not isinstance(meta.get("stored"), list):
            raise ValueError("no engines, constants or stored tensors")
    except ValueError as e:
        raise NotKept(f"malformed entry: {e}")
    return meta, view[meta_end:module_end], view[module_end:end]
