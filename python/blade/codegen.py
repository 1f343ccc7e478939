"""From torch-dialect MLIR to a native shared library, held in memory as bytes.

Stages (the pipelines are data files in the top-level mlir/ folder):
  torch dialect --torch_to_stablehlo--> StableHLO --(assume_shapes, for dynamic engines;
  layouts, library_calls.outline)-->
  --stablehlo_to_linalg--> linalg on tensors --bufferize--> linalg on memrefs
  --(library_calls.lower)--linalg_to_llvm--> LLVM dialect --ExecutionEngine--> object
  --cc -shared--> library

The library exports `blade_entry(void** args)`: one pointer per memref descriptor, the
cluster's inputs, then its params, then its outputs (written in place).
"""
import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from torch_mlir import ir, passmanager
from torch_mlir.dialects import torch as torch_dialect

from . import (folding, layouts, library_calls, loop_order, native, parallel, slices,
               tiled_transpose)
from .approximations import (allow_contraction, allow_reciprocal,
                             allow_reduction_reassociation, approximate_math)
from ._runtime import RUNTIME_LIBRARY
from .compile_cache import CompiledCluster
from .concatenations import lower_concatenations, write_slices_in_place
from .gathers import lower_dynamic_reverses, lower_gathers
from .importer import failing_node
from .ir_queries import all_parallel, output_count
from .native import capsule_pointer, host_cpu_features, mlir_c_api
from .pooling import lower_reduce_windows
from .shape_assumptions import (annotate_broadcasts, divide_out_sizes, drop_identity_broadcasts,
                                lower_dynamic_reshapes)

STAGES = ("torch_to_stablehlo", "stablehlo_to_linalg", "bufferize", "linalg_to_llvm")


class CodegenError(Exception):
    """A compilation stage failed; the message names the stage and MLIR's diagnostics.
    `node_index` is the index in the cluster of the node whose ops failed, when MLIR's
    diagnostics locate the failure (see importer.node_location), else None; `summary` is
    one line saying what failed."""

    def __init__(self, message: str, node_index: Optional[int] = None,
                 summary: Optional[str] = None):
        super().__init__(message)
        self.node_index = node_index
        self.summary = summary or message.splitlines()[0]

    @classmethod
    def from_mlir(cls, what: str, error: Exception) -> "CodegenError":
        """`what` failed with `error`, an MLIRError whose diagnostics (with their locations)
        say why and where."""
        diagnostics = list(getattr(error, "error_diagnostics", None) or ())
        locations = []
        for diagnostic in diagnostics:
            locations.append(str(diagnostic.location))
            locations.extend(str(note.location) for note in diagnostic.notes)
        summary = None
        if diagnostics:
            # The first line, without the op that some messages print after ": %".
            first = str(diagnostics[0].message).splitlines()[0].split(": %")[0]
            summary = f"{what}: {first[:200]}"
        return cls(f"{what}: {error}", failing_node(locations), summary)


def load_pipeline(stage: str) -> str:
    text = resources.files("blade.mlir").joinpath(f"{stage}.pipeline").read_text()
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return "".join(line for line in lines if line)


def _run_stage(module, stage: str) -> None:
    pipeline = load_pipeline(stage)
    try:
        with module.context:
            passmanager.PassManager.parse(pipeline).run(module.operation)
    except Exception as e:  # MLIR raises MLIRError with the diagnostics attached
        raise CodegenError.from_mlir(f"stage {stage} failed", e) from None


def _entry_wrapper(num_args: int, returns_outputs: bool = False) -> str:
    """LLVM-dialect `blade_entry(args)`, which unpacks `args` and calls the C interface.
    With `returns_outputs`, args[0] is where main's C interface writes the descriptors of
    the outputs it returns, and `num_args` pointers follow."""
    lines = ["  llvm.func @blade_entry(%args: !llvm.ptr) {"]
    names = []
    for i in range(num_args + (1 if returns_outputs else 0)):
        lines.append(f"    %p{i} = llvm.getelementptr %args[{i}] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr")
        lines.append(f"    %a{i} = llvm.load %p{i} : !llvm.ptr -> !llvm.ptr")
        names.append(f"%a{i}")
    types = ", ".join(["!llvm.ptr"] * len(names))
    lines.append(f"    llvm.call @_mlir_ciface_main({', '.join(names)}) : ({types}) -> ()")
    lines.append("    llvm.return")
    lines.append("  }")
    return "\n".join(lines)


def _link_shared_library(objects: List[Path], out: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CodegenError("no C compiler driver (cc) was found to link the engine's code")
    cmd = [compiler, "-shared", "-o", str(out), *map(str, objects),
           f"-L{RUNTIME_LIBRARY.parent}", "-lblade_ral", "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CodegenError(f"linking the engine's code failed: {proc.stderr.strip()}")


def compile_torch_mlir(text: str, num_buffers: int, keep_ir: bool = False,
                       user_calls=(), dump=None, parallel_loops: bool = True,
                       returns_outputs: bool = False,
                       pool: Optional[native.CompilerPool] = None) -> CompiledCluster:
    """Compiles one torch-dialect function `main` into a shared library: `start_compiling`
    and its finish at once (see there for the arguments).

    Example:
        >>> compiled = compile_torch_mlir(imported.text, num_buffers=3)
    """
    return start_compiling(text, num_buffers, keep_ir, user_calls, dump, parallel_loops,
                           returns_outputs, pool)()


def start_compiling(text: str, num_buffers: int, keep_ir: bool = False,
                    user_calls=(), dump=None, parallel_loops: bool = True,
                    returns_outputs: bool = False,
                    pool: Optional[native.CompilerPool] = None
                    ) -> Callable[[], CompiledCluster]:
    """Compiles one torch-dialect function `main` into a shared library, in two steps:
    MLIR's stages now, LLVM's on `pool`; returns the function that waits for LLVM's objects
    and links them (so that the caller can go on with MLIR's stages of other clusters).

    `num_buffers` is the number of memref arguments after bufferization: inputs, params and
    outputs together; with `returns_outputs` (outputs of dynamic size) main allocates and
    returns its outputs instead, and `num_buffers` counts inputs and params only.
    `user_calls` are the nodes the importer left to user converters. `parallel_loops` lets
    large loop nests run on PyTorch's intra-op threads.
    `keep_ir` keeps the IR after each stage in the result; `dump` (a `dump.ClusterDump`)
    receives it as each stage ends, so a failing stage leaves the IR that led to it.
    With a pool of workers, LLVM compiles the module in partitions (see blade.native);
    without, the whole module here, before this returns.
    """
    result = CompiledCluster(b"")

    def record(stage: str, make_text) -> None:
        if keep_ir or (dump is not None and dump.enabled):
            text_of_stage = make_text()
            if keep_ir:
                result.ir[stage] = text_of_stage
            if dump is not None:
                dump.stage(stage, text_of_stage)

    _register_passes()
    context = ir.Context()
    torch_dialect.register_dialect(context)
    with context:
        try:
            module = ir.Module.parse(text)
        except Exception as e:
            raise CodegenError.from_mlir("the imported torch-dialect IR does not parse",
                                         e) from None
        record("torch", lambda: str(module))
        for stage in STAGES:
            start = time.perf_counter()
            if stage == "stablehlo_to_linalg":
                if user_calls:
                    _inline_user_converters(module, user_calls)
                if _has_dynamic_shapes(_find_main(module)):
                    divide_out_sizes(module)
                    drop_identity_broadcasts(module)
                    _run_stage(module, "assume_shapes")
                layouts.to_channels_last(module, _find_main(module))
                slices.sink_slices(module, _find_main(module))
                folding.fold_splat_constants(module)
                calls = library_calls.outline(module, _find_main(module))
                result.library_calls = sum(calls.values())
                result.fused_attention = sum(count for kind, count in calls.items()
                                             if kind.startswith("attention"))
                annotate_broadcasts(module)
                lower_dynamic_reshapes(module)
                lower_reduce_windows(module)
                lower_gathers(module)
                lower_dynamic_reverses(module)
                lower_concatenations(module)
            if stage == "bufferize":
                write_slices_in_place(module)
                _distinct_results(_find_main(module))
                _reuse_dead_inputs(_find_main(module))
                folding.fill_per_use(_find_main(module))
                _mark_arguments(_find_main(module))
            if stage == "linalg_to_llvm":
                _mark_out_params(_find_main(module))
                _write_outputs_in_place(_find_main(module))
                approximate_math(module, scalef=_host_has_avx512())
                allow_reduction_reassociation(module)
                allow_contraction(module)
                allow_reciprocal(module)
                loop_order.order_loops(_find_main(module))
                tasks = parallel.outline(module, _find_main(module)) if parallel_loops else []
                result.parallel_loops = len(tasks)
                library_calls.lower(module)
                result.tiled_transposes = tiled_transpose.tile_transposes(module)
                main = _find_main(module)
                main.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
                noalias = _noalias_buffers(module)
            pipeline = "bufferize_returning" if stage == "bufferize" and returns_outputs \
                else stage
            _run_stage(module, pipeline)
            if stage == "linalg_to_llvm":
                _mark_noalias_pointers(module, noalias)
            result.seconds[stage] = time.perf_counter() - start
            if dump is not None:
                dump.seconds[stage] = result.seconds[stage]
            record(stage, lambda: str(module))
        start = time.perf_counter()
        llvm_text = str(module).rstrip()
        if not llvm_text.endswith("}"):
            raise CodegenError("unexpected LLVM-dialect module text")
        llvm_text = parallel.drop_launch_declarations(llvm_text[:-1]) + \
            parallel.llvm_glue(tasks) + "\n" + \
            _entry_wrapper(num_buffers, returns_outputs) + "\n}\n"
        module = ir.Module.parse(llvm_text)
        _tune_for_host(module)
        record("llvm_ir", lambda: llvm_ir(module))
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


@functools.lru_cache(maxsize=None)
def _register_passes() -> None:
    """StableHLO's passes by name (mlir/torch_to_stablehlo.pipeline names some); once."""
    from torch_mlir._mlir_libs import _stablehlo

    _stablehlo.register_stablehlo_passes()
    _stand_in_dialect_modules()


# Dialects whose ops Blade's rewrites walk, and for which the torch-mlir wheel has no
# Python module.
_DIALECTS_WITHOUT_MODULES = ("stablehlo", "chlo")
_STAND_IN_PREFIX = "blade._mlir_dialects"


def _stand_in_dialect_modules() -> None:
    """MLIR's Python bindings look up the Python module of an op's dialect
    (`torch_mlir.dialects.<dialect>`) each time they hand out an op, and remember only
    the modules they found: every StableHLO op that Blade's rewrites visited was a failed
    import (20,000 of them, 0.3 s, in ResNet-50's cluster). An empty module under a
    search prefix of Blade's own is found instead, once; the ops stay generic OpViews."""
    from torch_mlir._mlir_libs import _mlir

    package = types.ModuleType(_STAND_IN_PREFIX)
    package.__path__ = []
    sys.modules.setdefault(_STAND_IN_PREFIX, package)
    for dialect in _DIALECTS_WITHOUT_MODULES:
        name = f"{_STAND_IN_PREFIX}.{dialect}"
        sys.modules.setdefault(name, types.ModuleType(name))
    if _STAND_IN_PREFIX not in _mlir.globals.dialect_search_modules:
        _mlir.globals.append_dialect_search_prefix(_STAND_IN_PREFIX)


def llvm_ir(module) -> str:
    """The LLVM IR an LLVM-dialect module translates to (what native.emit_object
    compiles)."""
    lib = mlir_c_api()
    lib.mlirRegisterAllLLVMTranslations(capsule_pointer(module.context._CAPIPtr))
    llvm_context = lib.LLVMContextCreate()
    try:
        llvm_module = lib.mlirTranslateModuleToLLVMIR(
            capsule_pointer(module.operation._CAPIPtr), llvm_context)
        if not llvm_module:
            raise CodegenError("the LLVM-dialect module does not translate to LLVM IR")
        try:
            message = lib.LLVMPrintModuleToString(llvm_module)
            try:
                return ctypes.string_at(message).decode()
            finally:
                lib.LLVMDisposeMessage(message)
        finally:
            lib.LLVMDisposeModule(llvm_module)
    finally:
        lib.LLVMContextDispose(llvm_context)


def _inline_user_converters(module, user_calls) -> None:
    from .user_converters import ConverterError, fill_bodies

    try:
        fill_bodies(module, user_calls)
    except ConverterError as e:
        raise CodegenError(str(e), e.node_index) from e
    try:
        passmanager.PassManager.parse("builtin.module(inline, symbol-dce)").run(
            module.operation)
    except Exception as e:
        raise CodegenError.from_mlir("inlining user converters failed", e) from None


def _mark_arguments(main) -> None:
    """The caller's buffers are read-only to the code (`bufferization.writable = false`:
    bufferization never computes in place in an input or a param), and no buffer the code
    writes is reachable through another argument (`llvm.noalias`: outputs are fresh
    tensors, inputs and params are only read). The second lets LLVM keep accumulators in
    registers and vectorize loops that read one buffer and write another."""
    attrs = []
    for arg in main.regions[0].blocks[0].arguments:
        entries = {}
        if isinstance(arg.type, ir.RankedTensorType):
            entries["bufferization.writable"] = ir.BoolAttr.get(False)
            entries["llvm.noalias"] = ir.UnitAttr.get()
        attrs.append(ir.DictAttr.get(entries))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)


def _host_has_avx512() -> bool:
    return "avx512f" in host_cpu_features().split(",")


def _noalias_buffers(module) -> Dict[str, List[Tuple[int, bool]]]:
    """Per function with marked arguments, per argument: how many values the LLVM lowering
    expands it into (a memref of rank r: its descriptor's 3 + 2r fields) and whether it is
    a memref marked `llvm.noalias` (main's, see _mark_arguments and _mark_out_params; a
    parallel task's, see parallel.py). The lowering drops the mark;
    _mark_noalias_pointers puts it back."""
    found = {}
    for op in module.body.operations:
        if op.operation.name != "func.func" or "arg_attrs" not in op.attributes:
            continue
        args = []
        for arg, attrs in zip(op.regions[0].blocks[0].arguments,
                              ir.ArrayAttr(op.attributes["arg_attrs"])):
            if isinstance(arg.type, ir.MemRefType):
                args.append((3 + 2 * ir.MemRefType(arg.type).rank,
                             "llvm.noalias" in ir.DictAttr(attrs)))
            elif isinstance(arg.type, (ir.IndexType, ir.IntegerType, ir.FloatType)):
                args.append((1, False))
            else:
                break  # an argument whose expansion is not known here: leave it
        else:
            if any(marked for _, marked in args):
                found[ir.StringAttr(op.attributes["sym_name"]).value] = args
    return found


def _mark_noalias_pointers(module, noalias: Dict[str, List[Tuple[int, bool]]]) -> None:
    """Marks the allocated and aligned pointers of each noalias memref argument on the
    lowered llvm.func: without it LLVM must assume that a store into an output may change
    any input, so it cannot hoist a row's mean out of the loop over the row's elements."""
    for op in module.body.operations:
        if op.operation.name != "llvm.func" or not op.regions[0].blocks:
            continue
        args = noalias.get(ir.StringAttr(op.attributes["sym_name"]).value)
        count = len(op.regions[0].blocks[0].arguments)
        if args is None or sum(width for width, _ in args) != count:
            continue
        marked, position = set(), 0
        for width, is_noalias in args:
            if is_noalias:
                marked.update((position, position + 1))
            position += width
        op.attributes["arg_attrs"] = ir.ArrayAttr.get([
            ir.DictAttr.get({"llvm.noalias": ir.UnitAttr.get()} if k in marked else {})
            for k in range(count)])


def _mark_out_params(main) -> None:
    """After bufferization main has an out-parameter per output: fresh tensors the engine
    allocates, one per output (_distinct_results), so `llvm.noalias` like its inputs."""
    arguments = main.regions[0].blocks[0].arguments
    attrs = list(ir.ArrayAttr(main.attributes["arg_attrs"])) \
        if "arg_attrs" in main.attributes else []
    attrs += [ir.DictAttr.get({})] * (len(arguments) - len(attrs))
    marked = []
    for arg, attr in zip(arguments, attrs):
        entries = {named.name: named.attr for named in ir.DictAttr(attr)}
        if isinstance(arg.type, ir.MemRefType):
            entries["llvm.noalias"] = ir.UnitAttr.get()
        marked.append(ir.DictAttr.get(entries))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(marked)


def _write_outputs_in_place(main) -> int:
    """`%t = memref.alloc; <ops writing %t>; memref.copy %t, %out` becomes the same ops
    writing %out, the caller's output buffer, when %out is used by nothing else and %t is
    an allocation of the same type in main: bufferization leaves such a copy where a
    result comes out of a call (a library call's out-parameter). Returns how many."""
    block = main.regions[0].blocks[0]
    arguments = list(block.arguments)
    forwarded = 0
    for op in list(block.operations):
        if op.name != "memref.copy":
            continue
        source, target = op.operands[0], op.operands[1]
        owner = source.owner
        if isinstance(owner, ir.Block) or not any(target == a for a in arguments):
            continue
        alloc = owner.operation if hasattr(owner, "operation") else owner
        if alloc.name != "memref.alloc" or source.type != target.type or \
                len(list(target.uses)) != 1:
            continue
        op.erase()
        source.replace_all_uses_with(target)
        alloc.erase()
        forwarded += 1
    return forwarded


def _distinct_results(main) -> None:
    """Each result of `main` becomes its own buffer: a value returned twice (two cluster
    outputs that canonicalization proved equal) is copied into a fresh allocation for its
    later uses. Bufferization would otherwise return one buffer twice, and
    buffer-results-to-out-params crashes on that. (`bufferization.alloc_tensor` with a
    copy, unlike a copy into `tensor.empty`, is never folded back into its source.)"""
    from torch_mlir.dialects import bufferization

    block = main.regions[0].blocks[0]
    terminator = block.operations[len(block.operations) - 1]
    seen = []
    with ir.InsertionPoint(terminator), terminator.location:
        for i, value in enumerate(list(terminator.operands)):
            if not any(value == other for other in seen):
                seen.append(value)
                continue
            copy = bufferization.AllocTensorOp(value.type, [], copy=value)
            terminator.operands[i] = copy.result


_REUSABLE_PRODUCERS = ("linalg.generic", "func.call")


def _reuse_dead_inputs(main) -> int:
    """An elementwise loop nest whose input dies there writes its result over that input
    (the bias and activation after a matmul overwrite the matmul's output) instead of into
    a fresh tensor: one buffer less, and the stores go to cache lines the loop has just
    read rather than to new ones the CPU must first fetch. Taken when the input is an
    intermediate (a loop's or a library call's result: never an argument or a constant,
    whose buffers must not be written) of the output's type and indexing, read by nothing
    else, and the body never reads the output's old value. One-shot bufferization then
    writes in place (an elementwise op may overwrite the operand it reads at the same
    index). Returns how many loops were rewritten.

    Example:
        >>> _reuse_dead_inputs(main)   # generic ins(%mm, %bias) outs(tensor.empty) -> outs(%mm)
        1
    """
    rewritten = 0
    for op in main.regions[0].blocks[0].operations:
        if op.name != "linalg.generic":
            continue
        if output_count(op) != 1 or not all_parallel(op):
            continue
        inputs = len(op.operands) - 1
        init = op.operands[inputs]
        empty = init.owner
        if isinstance(empty, ir.Block) or empty.name != "tensor.empty":
            continue
        if list(op.regions[0].blocks[0].arguments[inputs].uses):
            continue
        maps = [str(m) for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        for i in range(inputs):
            value = op.operands[i]
            owner = value.owner
            if isinstance(owner, ir.Block) or owner.name not in _REUSABLE_PRODUCERS or \
                    value.type != init.type or maps[i] != maps[inputs] or \
                    len(list(value.uses)) != 1:
                continue
            op.operands[inputs] = value
            rewritten += 1
            break
    return rewritten


def _tune_for_host(module) -> None:
    """Function attributes for LLVM's code generation. LLVM tunes for 256-bit vectors on
    CPUs with AVX-512 (to avoid frequency drops on old Xeons); generated loops are long,
    streaming and FMA-bound, so full-width vectors pay: each function is told to use 512
    bits where the host has them. And f32 divisions that may use a reciprocal (`arcp`,
    approximations.allow_reciprocal) use the hardware estimate refined by one Newton step
    (relative error about 2**-28, under float32's ulp) instead of a vector division."""
    attributes = ['["reciprocal-estimates", "divf:1,vec-divf:1"]']
    if _host_has_avx512():
        attributes.append('["prefer-vector-width", "512"]')
    with module.context:
        passthrough = ir.Attribute.parse(f"[{', '.join(attributes)}]")
        for op in module.body.operations:
            if op.operation.name == "llvm.func" and len(op.regions[0].blocks) > 0:
                op.attributes["passthrough"] = passthrough


def _has_dynamic_shapes(main) -> bool:
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    return any(isinstance(t, ir.RankedTensorType) and not t.has_static_shape
               for t in list(function_type.inputs) + list(function_type.results))


def _find_main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and \
                ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise CodegenError("the module has no function 'main'")
