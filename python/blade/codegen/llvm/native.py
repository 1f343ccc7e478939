"""LLVM-dialect module -> native object code, on several cores.

LLVM's optimizer and code generator take most of a cluster's compile time (ResNet-50's
one cluster: 1.5 s of 2.3). They work one function at a time, so a module is split into
partitions of whole functions, each compiled into an object of its own, and the objects
are linked into one library (`blade.codegen.driver`). A partition declares the
functions it calls in another (they are linked by name, as the runtime's functions are).
The functions that call each other directly stay together, so LLVM can still inline
them: a parallel task with its launcher and trampoline (parallel.py); `main` with its C
interface and `blade_entry`. Only `main`'s calls of the library-call wrappers and of the
launchers cross partitions (one call each per engine call; they were inlined before).

The partitions of every cluster to compile are queued as they come (the compiler driver
lowers the next cluster through MLIR meanwhile) and compiled by worker processes, and by
the compiling process itself while it waits for them. MLIR and LLVM keep process-wide
state and PyTorch's thread pools do not survive `fork`, so the workers are fresh
interpreters (`subprocess`) that load this file alone, without torch or the rest of
Blade (so a worker is soon ready), and live as long as one `optimize`
(`CompilerPool`, a context manager; a worker also exits when its input pipe closes,
should the parent die). Without workers (one core, or `Config.compile_workers` 0) each
module is compiled whole in the process; when a worker cannot start, the waiting process
compiles its share. An object is the same wherever its partition is compiled.

This module imports nothing of Blade's and nothing of torch's at its top: a worker
imports it by path.
"""
import ctypes
import functools
import io
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# LLVM's -O2: measured side by side on every benchmark workload, the code runs as fast as
# at -O3, and a dynamic engine (loops of run-time trip counts) compiles much faster
# (-O3's extra loop transforms multiply such loops).
LLVM_OPT_LEVEL = 2
# main's, where it is straight-line code (codegen/loops/serial.py): calls to the functions
# that do the work, which optimization makes no faster. ResNet-50's main (190 calls) takes
# 0.48 s at -O2, 0.42 s at -O1, 0.46 s marked optnone at -O2 (LLVM's greedy register
# allocator still runs) and 0.23 s at -O0.
STRAIGHT_LINE_MAIN_OPT_LEVEL = 0

# A cluster whose torch-dialect IR is shorter than this compiles in about the time a
# worker takes to start: it is compiled in the process, and starts no worker.
MIN_PARALLEL_IR_CHARS = 4096


# The vector-ISA features generated code may use, as /proc/cpuinfo names them, in the order
# an engine records them.
CPU_FEATURES = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                "avx512vl", "avx512dq", "avx512cd", "avx512_bf16", "avx512_vnni",
                "avx512_fp16", "amx_tile", "asimd", "sve")


@functools.lru_cache(maxsize=None)
def host_cpu_features() -> str:
    """The CPU_FEATURES this host has, comma-separated: recorded in each engine and checked
    when it is loaded. The host's flags are the runtime's own reading of them
    (`blade._C.host_cpu_flags`, csrc/ral/cpu_features.h), so an engine records exactly what
    the runtime will find. Only the compiling process asks (a worker, which loads this file
    without Blade, never does): Blade's bindings are imported here, not at the top.

        >>> "avx2" in host_cpu_features().split(",")   # on an AVX2 host
        True
    """
    from blade import _C

    flags = _C.host_cpu_flags()
    return ",".join(f for f in CPU_FEATURES if f in flags)


class NativeError(Exception):
    """LLVM could not compile a partition, or a worker failed; the message says which."""


class _StringRef(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("length", ctypes.c_size_t)]


def _string_ref(text: str) -> _StringRef:
    data = text.encode()
    return _StringRef(data, len(data))


# LLVM's command-line options for Blade's compilations, set once per process (the compiling
# process and each worker) before its first. -combiner-store-merging=0: the DAG combiner's
# merging of adjacent stores is quadratic in the stores of a block, and `main` stores the
# fields of a memref descriptor for every call it makes (a large model's `main` compiles
# much faster without it); measured side by side on the benchmark workloads, the code runs
# as fast without it. LLVM's C API parses them without an error stream: a name
# this LLVM does not know is ignored.
LLVM_OPTIONS = ("-combiner-store-merging=0",)
_C_API_LOCK = threading.Lock()  # LLVM's option parser is not thread-safe


def mlir_c_api():
    """MLIR's C API from the torch-mlir wheel. The Python ExecutionEngine binding creates
    engines without object dumping, so the object file is obtained through the C API."""
    with _C_API_LOCK:
        return _load_c_api()


@functools.lru_cache(maxsize=None)
def _load_c_api():
    # Compile workers load this module without MLIR.
    from torch_mlir import _mlir_libs

    lib = ctypes.CDLL(str(Path(_mlir_libs.__file__).parent / "libTorchMLIRAggregateCAPI.so"))
    lib.LLVMParseCommandLineOptions.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p]
    options = [b"blade"] + [o.encode() for o in LLVM_OPTIONS]
    lib.LLVMParseCommandLineOptions(len(options), (ctypes.c_char_p * len(options))(*options),
                                    None)
    lib.mlirExecutionEngineCreate.restype = ctypes.c_void_p
    lib.mlirExecutionEngineCreate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_void_p, ctypes.c_bool]
    lib.mlirExecutionEngineDumpToObjectFile.argtypes = [ctypes.c_void_p, _StringRef]
    lib.mlirExecutionEngineRegisterSymbol.argtypes = [ctypes.c_void_p, _StringRef,
                                                      ctypes.c_void_p]
    lib.mlirExecutionEngineDestroy.argtypes = [ctypes.c_void_p]
    lib.mlirRegisterAllLLVMTranslations.argtypes = [ctypes.c_void_p]
    lib.mlirTranslateModuleToLLVMIR.restype = ctypes.c_void_p
    lib.mlirTranslateModuleToLLVMIR.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.LLVMContextCreate.restype = ctypes.c_void_p
    lib.LLVMContextDispose.argtypes = [ctypes.c_void_p]
    lib.LLVMPrintModuleToString.restype = ctypes.c_void_p
    lib.LLVMPrintModuleToString.argtypes = [ctypes.c_void_p]
    lib.LLVMDisposeMessage.argtypes = [ctypes.c_void_p]
    lib.LLVMDisposeModule.argtypes = [ctypes.c_void_p]
    return lib


def capsule_pointer(capsule) -> int:
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))


def emit_object(module, runtime_library: str, elsewhere: Sequence[str] = (),
                opt_level: int = LLVM_OPT_LEVEL) -> bytes:
    """The native object of an LLVM-dialect module for this host (LLVM at `opt_level`).
    `elsewhere` names the functions it declares that another partition defines."""
    lib = mlir_c_api()
    # The JIT links the code in memory before the object is dumped, so it must resolve
    # the runtime's symbols (hand it libblade_ral) and the other partitions' functions:
    # any address does for those, since this code never runs here; the object keeps
    # their relocations for the link into the library.
    libs = (_StringRef * 1)(_string_ref(runtime_library))
    engine = lib.mlirExecutionEngineCreate(capsule_pointer(module._CAPIPtr), opt_level, 1,
                                           ctypes.cast(libs, ctypes.c_void_p), True)
    if not engine:
        raise NativeError("LLVM could not compile the module (ExecutionEngine creation "
                          "failed)")
    placeholder = ctypes.cast(lib.mlirExecutionEngineDestroy, ctypes.c_void_p).value
    try:
        for name in elsewhere:
            lib.mlirExecutionEngineRegisterSymbol(engine, _string_ref(name), placeholder)
        with tempfile.TemporaryDirectory(prefix="blade-native-") as tmp:
            path = Path(tmp) / "part.o"
            lib.mlirExecutionEngineDumpToObjectFile(engine, _string_ref(str(path)))
            if not path.exists():
                raise NativeError("LLVM produced no object file for the module")
            return path.read_bytes()
    finally:
        lib.mlirExecutionEngineDestroy(engine)


def emit_object_from_bytecode(bytecode: bytes, runtime_library: str,
                              elsewhere: Sequence[str] = (),
                              opt_level: int = LLVM_OPT_LEVEL) -> bytes:
    """`emit_object` of a partition as MLIR bytecode (what workers receive: it reads
    back in a fifth of the time of the printed text)."""
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    with ir.Context():
        try:
            module = ir.Module.parse(bytecode)
        except Exception as e:  # MLIRError: the partition is Blade's own output
            raise NativeError(f"a partition of the LLVM-dialect module does not read "
                              f"back: {e}") from None
        return emit_object(module, runtime_library, elsewhere, opt_level)


def _bytecode(module) -> bytes:
    buffer = io.BytesIO()
    module.operation.write_bytecode(buffer)
    return buffer.getvalue()


# --- partitions ------------------------------------------------------------------------


def function_name(op) -> str:
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    return ir.StringAttr(op.attributes["sym_name"]).value


def _linked_by_name(op, local_linkages: List) -> bool:
    """Whether a top-level op defines a symbol that other objects link to: a function
    or global of external linkage (private and internal ones stay in their object)."""
    return "linkage" in op.attributes and op.attributes["linkage"] not in local_linkages


def _local_linkages(context) -> List:
    """The linkage attributes that keep a symbol inside its object. The bindings have no
    builder for LLVM's linkage enum attribute, so the two are made from their spelling
    and compared by identity (attributes are uniqued per context)."""
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    return [ir.Attribute.parse(f"#llvm.linkage<{kind}>", context)
            for kind in ("private", "internal")]


_TASK_PREFIXES = ("blade_task_", "blade_launch_", "blade_trampoline_")


def function_group(name: str) -> str:
    """Functions of one group stay in one partition: a task with its launcher and
    trampoline; a serial loop nest (codegen/loops/serial.py); the library-call wrappers
    together; main with the rest."""
    for prefix in _TASK_PREFIXES:
        if name.startswith(prefix):
            return "task " + name[len(prefix):]
    if name.startswith("blade_loop_"):
        return "loop " + name[len("blade_loop_"):]
    if name.startswith("blade_library_call_"):
        return "library calls"
    return "main"


def _unoptimized(op) -> bool:
    """Whether an llvm.func is marked `optnone` (codegen/loops/serial.py marks main)."""
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    if "passthrough" not in op.attributes:
        return False
    return any(isinstance(a, ir.StringAttr) and ir.StringAttr(a).value == "optnone"
               for a in ir.ArrayAttr(op.attributes["passthrough"]))


def partition(module, count: int) -> List[Dict]:
    """Splits an LLVM-dialect module into at most `count` partitions of whole function
    groups (see `function_group`), balanced by size, the largest first: each a dict with its
    module as MLIR `bytecode`, the functions it declares that another defines
    (`elsewhere`) and the level LLVM compiles it at (`opt_level`). A main marked
    `optnone` has a partition of its own group besides those, compiled at -O0
    (STRAIGHT_LINE_MAIN_OPT_LEVEL), weighed at a quarter of its size. The module itself is
    left as it was.

    Example:
        >>> parts = partition(module, 2)   # [{"bytecode": ..., "elsewhere": [...], ...}, ...]
    """
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    whole = [{"bytecode": None, "elsewhere": [], "opt_level": LLVM_OPT_LEVEL}]
    sizes: Dict[str, int] = {}
    defined: Dict[str, str] = {}  # function -> its group
    local = _local_linkages(module.context)
    main_unoptimized = False
    for op in module.body.operations:
        if _linked_by_name(op, local) and op.operation.name != "llvm.func":
            # A global that other objects would see: copies in two partitions would
            # clash at the link, so the module stays whole.
            whole[0]["bytecode"] = _bytecode(module)
            return whole
        if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0:
            if not _linked_by_name(op, local):
                # An internal function called from another partition could not be
                # declared there: the module stays whole.
                whole[0]["bytecode"] = _bytecode(module)
                return whole
            name = function_name(op)
            group = function_group(name)
            defined[name] = group
            size = sum(len(block.operations) for block in op.regions[0].blocks)
            sizes[group] = sizes.get(group, 0) + size
            main_unoptimized = main_unoptimized or (name == "main" and _unoptimized(op))
    # Bins of [weight, groups, opt_level]; main's own first where it is compiled apart, the
    # rest still in `count` (main at -O0 is light: with two partitions, one of which main's,
    # the other did all the -O2 work while main's was long done).
    bins: List[List] = []
    if main_unoptimized and count >= 2 and len(sizes) > 1:
        bins.append([sizes.pop("main") // 4, ["main"], STRAIGHT_LINE_MAIN_OPT_LEVEL])
    shared = [[0, [], LLVM_OPT_LEVEL] for _ in range(max(1, min(count, len(sizes))))]
    for group in sorted(sizes, key=lambda g: (-sizes[g], g)):
        lightest = min(shared, key=lambda b: b[0])
        lightest[0] += sizes[group]
        lightest[1].append(group)
    bins += shared
    if len(bins) == 1:
        whole[0]["bytecode"] = _bytecode(module)
        return whole
    parts = []
    for _, groups, opt_level in sorted(bins, key=lambda b: -b[0]):
        keep = set(groups)
        with module.context:
            part = ir.Module.create(module.operation.location)
            elsewhere = []
            with ir.InsertionPoint(part.body):
                for op in module.body.operations:
                    name = function_name(op) if op.operation.name == "llvm.func" else None
                    if name in defined and defined[name] not in keep:
                        # Another partition's function: declared here.
                        attributes = {a: op.attributes[a] for a in op.attributes}
                        ir.Operation.create("llvm.func", attributes=attributes, regions=1,
                                            loc=op.operation.location)
                        elsewhere.append(name)
                    else:
                        op.operation.clone()
            parts.append({"bytecode": _bytecode(part), "elsewhere": elsewhere,
                          "opt_level": opt_level})
    return parts


# --- the pool ----------------------------------------------------------------------------


def default_workers(setting: Optional[int] = None) -> int:
    """Worker processes for `Config.compile_workers`: the setting when given, else one
    less than the cores this process may run on and PyTorch's thread count allow (the
    compiling process compiles too)."""
    if setting is not None:
        return max(0, int(setting))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    # Compile workers load this module without torch.
    import torch

    return max(0, min(cores, torch.get_num_threads()) - 1)


# The worker: this file loaded by path, under a name of its own (so that neither Blade's
# package nor torch is imported), serving jobs on stdin/stdout.
_WORKER = """
import importlib.util, os, sys
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]
spec = importlib.util.spec_from_file_location("blade_native_worker", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.serve(sys.stdin.buffer, sys.stdout.buffer, {runtime_library!r})
# Nothing of this process outlives it: it ends without the interpreter's teardown (MLIR's
# and libtorch's destructors, which the pool's close would wait for).
os._exit(0)
"""


def _send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the pipe closed")
    size, = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)


def serve(inputs, outputs, runtime_library: str) -> None:
    """A worker's loop: (bytecode, runtime_library, elsewhere, opt_level) in, ("object",
    bytes) or ("error", message) out, until its input closes."""
    # Loaded before the first job comes (LLVM's JIT loads it to resolve symbols, and it
    # brings libtorch), as are MLIR's bindings and C API (LLVM's options set): a worker
    # that says it is ready takes a job no slower than the compiling process would (a
    # first job once paid the loading, which the parent, had it taken the job itself,
    # would not have).
    ctypes.CDLL(runtime_library)
    # Compile workers load this module without MLIR.
    from torch_mlir import ir

    with ir.Context():
        pass
    mlir_c_api()
    # The pipe to the parent carries only messages: whatever else this process writes to
    # its standard output (Python, LLVM, a library's initializer) goes to stderr.
    outputs = os.fdopen(os.dup(outputs.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    _send(outputs, ("ready", os.getpid()))
    while True:
        try:
            job = _receive(inputs)
        except EOFError:
            return
        try:
            _send(outputs, ("object", emit_object_from_bytecode(*job)))
        except Exception as e:  # reported to the parent, which fails that cluster
            _send(outputs, ("error", f"{type(e).__name__}: {e}"))


def _how_it_ended(process: subprocess.Popen) -> str:
    try:
        code = process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code < 0:
        return f"was killed by signal {-code}"
    return f"died with status {code}"


class _Job:
    def __init__(self, arguments):
        self.arguments = arguments
        self.done = threading.Event()
        self.result: Optional[bytes] = None
        self.error: Optional[str] = None


class CompilerPool:
    """Compiles partitions (`partition`) on `workers` processes and on the threads that
    wait for them, against the runtime at `runtime_library`. Partitions may be submitted
    before the workers start (`start`, `expect`); they stop when the pool closes (`with`
    block).

    Example:
        >>> with CompilerPool(workers=1, runtime_library=str(RUNTIME_LIBRARY)) as pool:
        ...     pool.start()
        ...     objects = pool.compile(partition(module, 2))
    """

    def __init__(self, workers: int, runtime_library: str):
        self.workers = workers
        self.runtime_library = runtime_library
        self._queue: List[_Job] = []
        self._lock = threading.Condition()
        self._processes: List[subprocess.Popen] = []
        self._threads: List[threading.Thread] = []
        self._started = self._closed = False
        self._expected = 0
        # Why a worker stopped or never started (the pool carries on without it).
        self.failures: List[str] = []

    def __enter__(self) -> "CompilerPool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # Leaving on an error (an interrupt in the middle of a partition, say): the workers'
        # results are not wanted, so they are not waited for.
        self.close(wait=exc_type is None)

    def start(self) -> None:
        """Starts the workers (they take a while to be ready; start early)."""
        if self._started or self._closed:
            return
        self._started = True
        command = [sys.executable, "-c", _WORKER.format(path=str(Path(__file__).resolve()),
                                                        runtime_library=self.runtime_library)]
        for _ in range(self.workers):
            try:
                process = subprocess.Popen(command, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE)
            except OSError as e:
                self.failures.append(f"a compile worker did not start: {e}")
                break
            self._processes.append(process)
            thread = threading.Thread(target=self._feed, args=(process,), daemon=True,
                                      name="blade-compile-worker")
            thread.start()
            self._threads.append(thread)

    def expect(self, ir_chars: int) -> None:
        """Clusters of `ir_chars` of torch-dialect IR are to be compiled: the workers start
        once these add up to MIN_PARALLEL_IR_CHARS (less compiles in about the time a
        worker takes to start), early, so that they are ready when LLVM's work comes."""
        self._expected += ir_chars
        if self._expected >= MIN_PARALLEL_IR_CHARS:
            self.start()

    def compile(self, parts: Sequence[Dict]) -> List[bytes]:
        """The objects of `parts`, in order: `wait(submit(parts))`."""
        return self.wait(self.submit(parts))

    def submit(self, parts: Sequence[Dict]) -> List[_Job]:
        """Queues `parts` (`partition`'s) for the workers (and for whoever waits); returns
        their jobs."""
        jobs = [_Job((part["bytecode"], self.runtime_library, part["elsewhere"],
                      part.get("opt_level", LLVM_OPT_LEVEL))) for part in parts]
        with self._lock:
            self._queue.extend(jobs)
            self._lock.notify_all()
        return jobs

    def wait(self, jobs: Sequence[_Job]) -> List[bytes]:
        """The objects of `jobs`, in order; raises NativeError for the first that failed.
        The calling thread compiles queued partitions (anyone's) while it waits."""
        for job in jobs:
            while not job.done.is_set():
                mine = self._take()
                if mine is None:
                    # Looked at again now and then: a worker that dies leaves the jobs
                    # still queued to whoever waits.
                    job.done.wait(0.05)
                else:
                    self._run_here(mine)
        for job in jobs:
            if job.error is not None:
                raise NativeError(job.error)
        return [job.result for job in jobs]

    def close(self, wait: bool = True) -> None:
        """Stops the workers: none outlives the pool. With `wait`, a worker gets a few
        seconds to finish what it is doing before it is killed."""
        self._closed = True
        with self._lock:
            self._lock.notify_all()
        for process in self._processes:
            try:
                process.stdin.close()  # the worker's loop ends at end of input
            except OSError:
                pass
        for process in self._processes:
            try:
                process.wait(timeout=5 if wait else 0)
            except subprocess.TimeoutExpired:  # in the middle of a partition
                process.kill()
                process.wait()
        for thread in self._threads:
            thread.join(timeout=5)
        for process in self._processes:
            process.stdout.close()
        self._processes, self._threads = [], []

    def _take(self) -> Optional[_Job]:
        with self._lock:
            return self._queue.pop(0) if self._queue else None

    @staticmethod
    def _run_here(job: _Job) -> None:
        try:
            job.result = emit_object_from_bytecode(*job.arguments)
        except NativeError as e:
            job.error = str(e)
        finally:
            job.arguments = None  # the partition's bytecode is not needed any more
            job.done.set()

    def _feed(self, process: subprocess.Popen) -> None:
        """One worker's thread: hands it queued jobs one at a time."""
        try:
            ready = _receive(process.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            ready = None
        if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
            self.failures.append(f"a compile worker (pid {process.pid}) did not start: it "
                                 f"{_how_it_ended(process)}")
            return
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                # The last queued: whoever waits takes the first, the largest partition
                # of a cluster (partition() orders them), without a pipe's round trip.
                job = self._queue.pop()
            try:
                _send(process.stdin, job.arguments)
                job.arguments = None
                kind, payload = _receive(process.stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                job.error = f"the compile worker (pid {process.pid}) {_how_it_ended(process)}"
                self.failures.append(job.error)
                job.done.set()
                return
            if kind == "object":
                job.result = payload
            else:
                job.error = f"in a compile worker: {payload}"
            job.done.set()
