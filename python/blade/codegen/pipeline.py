"""The code generation pipeline, in order: every pass from a cluster's torch-dialect function
to the LLVM-dialect module that blade.codegen.llvm.native compiles.

    torch dialect   Torch-MLIR's passes to StableHLO
    stablehlo       Blade's rewrites of the StableHLO function (codegen/stablehlo,
                    codegen/kernels: library calls outlined, codegen/linalg: ops Blade
                    lowers itself), then StableHLO's lowering to linalg with fusion
    buffers         main's buffers prepared (codegen/buffers), one-shot bufferization
    loops           rewrites of the bufferized loop nests (codegen/loops), library calls
                    lowered to RAL kernel calls
    llvm            MLIR's lowering to the LLVM dialect, then the ABI (codegen/llvm/abi)

`build` lists the passes for one cluster (a few depend on its options); `run` runs them
with one MLIR pass manager: every pass is a pass of that manager (upstream ones run as a
nested pipeline of their own), the verifier checks the module after each, and with a dump
directory the manager prints the module after each pass into it. Each pass takes the one
`Compilation` it works on: the module, the options and what passes hand to later ones.
"""
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from torch_mlir import ir, passmanager
from torch_mlir.dialects import func, ub

from blade.codegen.buffers import arguments, deallocation
from blade.codegen.errors import CodegenError
from blade.codegen.kernels import kernel_calls, lowering, outlining
from blade.codegen.linalg.concatenations import lower_concatenations, write_slices_in_place
from blade.codegen.linalg.gathers import lower_dynamic_reverses, lower_gathers
from blade.codegen.linalg.integer_division import lower_integer_divisions
from blade.codegen.linalg.scatters import lower_scatters
from blade.codegen.linalg.pooling import lower_reduce_windows
from blade.codegen.llvm import abi, identical, launchers
from blade.codegen.loops import (approximations, loop_order, parallel, serial, split_reductions,
                                 tiled_transpose)
from blade.codegen.stablehlo import folding, layouts, slices
from blade.codegen.stablehlo.user_calls import ConverterError, fill_bodies
from blade.codegen.stablehlo.unsigned import signless_boundaries, unsigned_reduction_identities
from blade.codegen.stablehlo.degenerate_reductions import simplify_degenerate_reductions
from blade.codegen.stablehlo.shape_assumptions import (annotate_broadcasts, divide_out_sizes,
                                                       drop_identity_broadcasts,
                                                       lower_dynamic_reshapes)
from blade.report import CodeStatistics


@dataclass
class Options:
    """What the passes of one cluster depend on besides its IR."""

    num_buffers: int               # main's memref arguments after bufferization
    returns_outputs: bool = False  # outputs of dynamic size: main allocates and returns them
    parallel_loops: bool = True    # large loop nests may run on the intra-op threads
    user_calls: Sequence = ()      # nodes the importer left to user converters
    avx512: bool = False           # the host has AVX-512 (wider vectors, scalef in exp)


@dataclass
class Compilation:
    """The module the passes rewrite, its options, and what passes hand on: the
    statistics, the parallel tasks (for their launchers) and the noalias arguments (which
    the LLVM lowering drops and a later pass puts back)."""

    module: ir.Module
    options: Options
    statistics: CodeStatistics = field(default_factory=CodeStatistics)
    parallel_tasks: List[dict] = field(default_factory=list)
    noalias: Dict = field(default_factory=dict)

    @property
    def main(self):
        return find_main(self.module)


@dataclass(frozen=True)
class Pass:
    """One step of the pipeline: `run` rewrites the compilation's module in place, or
    raises. `name` names its dump file and its timing."""

    name: str
    run: Callable[[Compilation], None]
    upstream: bool = False  # an MLIR pass (Torch-MLIR's, StableHLO's, MLIR's), not Blade's


def upstream(pipeline: str) -> Callable[[Compilation], None]:
    """An MLIR pass (or nested pipeline) by its textual name, as a pass of the pipeline."""

    def run(compilation: Compilation) -> None:
        manager = passmanager.PassManager.parse(f"builtin.module({pipeline})")
        manager.enable_verifier(False)  # `run` verifies where it must
        manager.run(compilation.module.operation)

    return run


def _upstream_passes(*pipelines: str) -> List[Pass]:
    """Each pass named by its own text, `func.func(...)` nesting left out of the name."""
    passes = []
    for pipeline in pipelines:
        name = pipeline[len("func.func("):-1] if pipeline.startswith("func.func(") else pipeline
        passes.append(Pass(name.split("{", 1)[0], upstream(pipeline), upstream=True))
    return passes


def _only_with_dynamic_shapes(*passes: Pass) -> List[Pass]:
    """Passes that do nothing when main's tensors all have static shapes (known only once
    main is StableHLO, so decided as they run)."""
    def when_dynamic(step: Pass) -> Pass:
        return Pass(step.name, lambda c: step.run(c) if has_dynamic_shapes(c.main) else None,
                    step.upstream)

    return [when_dynamic(step) for step in passes]


def torch_to_stablehlo() -> List[Pass]:
    """Torch-MLIR's torch-function-to-torch-backend-pipeline (decompositions, shape and
    dtype refinement), then the passes of its torch-backend-to-stablehlo-backend-pipeline
    spelled out without the backend contract check: calls to user converters are still
    calls of private declarations here. The start of every cluster's pipeline, and what
    blade.partition.torch_mlir_probe asks of an op with no converter of Blade's."""
    return _upstream_passes(
        "torch-function-to-torch-backend-pipeline",
        "func.func(convert-torch-to-stablehlo)",
        "func.func(chlo-legalize-to-stablehlo)",
        "func.func(convert-torch-to-arith)",
        "func.func(canonicalize)",
        "func.func(cse)",
        "torch-func-backend-type-conversion-for-stablehlo",
        "func.func(canonicalize)",
        "func.func(torch-finalizing-backend-type-conversion-for-stablehlo)",
        "func.func(stablehlo-canonicalize-dynamism)",
        "func.func(canonicalize)") + [
        Pass("stablehlo-refine-shapes", _refine_shapes_around_declarations, upstream=True),
        *_upstream_passes(
            "func.func(canonicalize)",
            "func.func(stablehlo-canonicalize-dynamism)",
            "func.func(canonicalize)",
            "func.func(stablehlo-legalize-deprecated-ops)",
            "canonicalize")]


def _refine_shapes_around_declarations(c: Compilation) -> None:
    """StableHLO's stablehlo-refine-shapes, which refines the functions main calls too and
    crashes on a call of a declaration (a user converter's or a kernel call's, whose body
    comes later) in some modules: each declaration gets a stand-in body for the pass (one
    that returns poison values of its result types), removed after it."""

    stand_ins = []
    for op in c.module.body.operations:
        if op.operation.name == "func.func" and len(op.regions[0].blocks) == 0:
            function_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            block = op.regions[0].blocks.append(*function_type.inputs)
            with ir.InsertionPoint(block):
                func.ReturnOp([ub.PoisonOp(t).result for t in function_type.results])
            stand_ins.append(op)
    try:
        upstream("stablehlo-refine-shapes")(c)
    finally:
        for op in stand_ins:
            # A declaration again: a new one, with the stand-in's (refined) type and its
            # attributes, in its place.
            with ir.InsertionPoint(op):
                declaration = func.FuncOp(ir.StringAttr(op.attributes["sym_name"]).value,
                                          ir.TypeAttr(op.attributes["function_type"]).value,
                                          visibility="private")
            for name in op.attributes:
                if name not in ("sym_name", "function_type", "sym_visibility"):
                    declaration.attributes[name] = op.attributes[name]
            op.erase()


def build(options: Options) -> List[Pass]:
    """The passes for one cluster, in the order they run."""
    return [
        # -- torch dialect -> StableHLO --------------------------------------------------
        *torch_to_stablehlo(),

        # -- StableHLO: Blade's rewrites --------------------------------------------------
        Pass("signless-boundaries", lambda c: signless_boundaries(c.module, c.main)),
        Pass("unsigned-reduction-identities", lambda c: unsigned_reduction_identities(c.module)),
        *([Pass("inline-user-converters",
                lambda c: _inline_user_converters(c.module, c.options.user_calls))]
          if options.user_calls else []),
        # Dynamic engines: the shape constraints of broadcasts dropped (engines guarantee
        # them at run time, see codegen/stablehlo/shape_assumptions.py) and the
        # shape.assuming regions they guarded inlined, so each op's producers are in
        # main's block.
        *_only_with_dynamic_shapes(
            Pass("divide-out-sizes", lambda c: divide_out_sizes(c.module)),
            Pass("drop-identity-broadcasts", lambda c: drop_identity_broadcasts(c.module)),
            *_upstream_passes("func.func(remove-shape-constraints)", "canonicalize")),
        Pass("channels-last", lambda c: layouts.to_channels_last(c.module, c.main)),
        Pass("sink-slices", lambda c: slices.sink_slices(c.module, c.main)),
        Pass("fold-splat-constants", lambda c: folding.fold_splat_constants(c.module)),
        Pass("outline-library-calls", _outline_library_calls),
        Pass("annotate-broadcasts", lambda c: annotate_broadcasts(c.module)),
        Pass("lower-dynamic-reshapes", lambda c: lower_dynamic_reshapes(c.module)),
        Pass("simplify-degenerate-reductions",
             lambda c: simplify_degenerate_reductions(c.module)),
        Pass("lower-reduce-windows", lambda c: lower_reduce_windows(c.module)),
        Pass("lower-gathers", lambda c: lower_gathers(c.module)),
        Pass("lower-scatters", lambda c: lower_scatters(c.module)),
        Pass("lower-dynamic-reverses", lambda c: lower_dynamic_reverses(c.module)),
        Pass("lower-concatenations", lambda c: lower_concatenations(c.module)),
        Pass("lower-integer-divisions", lambda c: lower_integer_divisions(c.module)),

        # -- StableHLO -> linalg on tensors, with producer-consumer elementwise fusion ----
        # What remains of the shape dialect (shape_of, broadcasts of shapes, num_elements)
        # becomes tensor.dim arithmetic.
        *_upstream_passes(
            "func.func(remove-shape-constraints)",
            "canonicalize",
            "func.func(stablehlo-legalize-to-linalg)",
            "func.func(shape-to-shape-lowering)",
            "convert-shape-to-std",
            "canonicalize",
            # Upstream's fusion takes a producer only when its result has one use; with
            # dynamic sizes the empty tensor a consumer writes is sized by tensor.dim of
            # that result, a second use. Asked of the sizes' sources first, a bias add
            # and the transpose of attention heads after it fuse as with static sizes.
            "resolve-ranked-shaped-type-result-dims",
            "canonicalize",
            "func.func(linalg-fuse-elementwise-ops)",
            "canonicalize",
            "cse"),

        # -- buffers: linalg on tensors -> linalg on memrefs ------------------------------
        Pass("write-slices-in-place", lambda c: write_slices_in_place(c.module)),
        Pass("distinct-results", lambda c: arguments.distinct_results(c.main)),
        Pass("reuse-dead-inputs", lambda c: arguments.reuse_dead_inputs(c.main)),
        Pass("fill-per-use", lambda c: folding.fill_per_use(c.main)),
        Pass("mark-arguments", lambda c: arguments.mark_arguments(c.main)),
        # Canonicalization first folds the size queries of a loop nest's result to the
        # sizes of its output (so the sizes of a concatenation's slices no longer wait on
        # the loop nest that fills one), and empty tensor elimination then lets that loop
        # nest write straight into its slice (codegen/linalg/concatenations.py). Results
        # are written into out-parameters that the runtime allocates, except for outputs
        # of dynamic size, which main allocates (through the RAL) and returns; outlined
        # library calls always write into buffers their caller allocates.
        # main becomes private for the pass to turn its static results into out-params,
        # since modify-public-functions would also take the public library calls of
        # dynamic size, whose results cannot be.
        *([] if options.returns_outputs else
          [Pass("hide-main", lambda c: _set_private(c.main, True))]),
        *_upstream_passes(
            "canonicalize",
            "eliminate-empty-tensors",
            "empty-tensor-to-alloc-tensor",
            "one-shot-bufferize{bufferize-function-boundaries "
            "function-boundary-type-conversion=identity-layout-map}",
            "buffer-results-to-out-params{hoist-static-allocs}",
            # A loop nest that empty tensor elimination made write into its slice of a
            # concatenation leaves a copy of that slice onto an identical view of it: CSE
            # merges the views and the self-copy folds away.
            "cse",
            "canonicalize"),
        *([] if options.returns_outputs else
          [Pass("show-main", lambda c: _set_private(c.main, False))]),

        # -- loops: the bufferized loop nests ---------------------------------------------
        Pass("mark-out-params", lambda c: arguments.mark_out_params(c.main)),
        Pass("write-outputs-in-place", lambda c: arguments.write_outputs_in_place(c.main)),
        Pass("approximate-math",
             lambda c: approximations.approximate_math(c.module, scalef=c.options.avx512)),
        Pass("allow-reduction-reassociation",
             lambda c: approximations.allow_reduction_reassociation(c.module)),
        Pass("allow-contraction", lambda c: approximations.allow_contraction(c.module)),
        Pass("allow-reciprocal", lambda c: approximations.allow_reciprocal(c.module)),
        Pass("order-loops", lambda c: loop_order.order_loops(c.main)),
        *([Pass("split-reductions", lambda c: split_reductions.split_reductions(c.main)),
           Pass("outline-parallel-loops", _outline_parallel_loops)]
          if options.parallel_loops else []),
        Pass("lower-library-calls", lambda c: lowering.lower(c.module)),
        Pass("tile-transposes", _tile_transposes),
        # What main still loops over becomes functions of their own: main, then only
        # calls, is compiled at -O0 (codegen/loops/serial.py, blade.codegen.llvm.native).
        Pass("outline-serial-loops", lambda c: serial.outline(c.module, c.main)),
        Pass("emit-c-interface", _emit_c_interface),
        Pass("record-noalias-arguments", _record_noalias_arguments),

        # -- llvm: linalg on memrefs -> LLVM dialect --------------------------------------
        # Intermediates are freed by the ownership-based deallocation pipeline and come
        # from PyTorch's allocator through the RAL (use-generic-functions). Tiled
        # transposes' vector.transpose becomes element shuffles, which LLVM's x86 backend
        # combines into unpack/permute instructions.
        *_upstream_passes("buffer-deallocation-pipeline"),
        Pass("free-after-last-use", lambda c: deallocation.free_after_last_use(c.main)),
        *_upstream_passes(
            "convert-bufferization-to-memref",
            "convert-linalg-to-loops",
            "lower-affine",
            "convert-scf-to-cf",
            "expand-strided-metadata",
            "lower-affine",
            "convert-vector-to-llvm",
            "finalize-memref-to-llvm{use-generic-functions}",
            "convert-math-to-llvm",
            "convert-math-to-libm",
            "convert-arith-to-llvm",
            "convert-cf-to-llvm",
            "convert-func-to-llvm",
            "convert-ub-to-llvm",
            "reconcile-unrealized-casts"),
        Pass("mark-noalias-pointers",
             lambda c: abi.mark_noalias_pointers(c.module, c.noalias)),
        Pass("define-parallel-launchers", lambda c: launchers.define_launchers(
            c.module, c.parallel_tasks, parallel.MIN_TASK_ITERATIONS,
            parallel.MIN_ITERATIONS)),
        Pass("define-entry-point", lambda c: abi.define_entry_point(
            c.module, c.options.num_buffers, c.options.returns_outputs)),
        Pass("tune-for-host", lambda c: abi.tune_for_host(c.module, c.options.avx512)),
        Pass("compile-main-unoptimized",
             lambda c: serial.compile_straight_line_main_unoptimized(c.module)),
        Pass("merge-identical-functions",
             lambda c: identical.merge_identical_functions(c.module)),
    ]


def run(compilation: Compilation, passes: Sequence[Pass],
        dump_dir: Optional[Path] = None) -> Dict[str, float]:
    """Runs `passes` on the compilation's module with one pass manager. The verifier runs
    before each MLIR pass that follows Blade's own passes, and after the last pass, so that
    every MLIR pass (C++, which assumes valid input) gets IR that verified; MLIR's passes'
    own output is taken as valid, and consecutive Blade passes are verified together
    (verifying after each pass took a large share of the pipeline's time on large
    clusters). With `dump_dir`, the verifier runs after every pass, and the module after
    each pass is printed there as `NN_<pass>.mlir` (after a failure, the last file is the
    IR the failing pass got). Returns the seconds each pass took, by `NN_<pass>`. Raises
    CodegenError naming the pass that failed, or the passes since the module last
    verified when it no longer does."""
    seconds: Dict[str, float] = {}
    current: List[str] = []
    unverified: List[str] = []  # the MLIR passes run since the module last verified
    pending: List[str] = []  # Blade's passes run since then
    every_pass = dump_dir is not None
    manager = passmanager.PassManager("builtin.module")

    def verify() -> None:
        try:
            compilation.module.operation.verify()
        except Exception as e:
            if pending:
                named = (f"pass {pending[0]}" if len(pending) == 1 else
                         f"one of the passes {', '.join(pending)} (a dump directory "
                         "verifies after each pass and names it)")
                before = unverified
            else:
                named, before = f"pass {unverified[-1]}", unverified[:-1]
            since = f" (and MLIR's {', '.join(before)} before it)" if before else ""
            raise CodegenError.from_mlir(f"{named}{since} left invalid IR", e) from None
        unverified.clear()
        pending.clear()

    for index, step in enumerate(passes):
        label = pass_label(index, step)

        def run_one(_op, _pass, step=step, label=label) -> None:
            if step.upstream and pending:
                verify()
            current[:] = [step.name]
            start = time.perf_counter()
            try:
                with compilation.module.context, ir.Location.unknown():
                    step.run(compilation)
            finally:
                seconds[label] = time.perf_counter() - start
            (unverified if step.upstream else pending).append(step.name)
            if every_pass:
                verify()

        manager.add(run_one, name=label, argument=label)
    manager.enable_verifier(every_pass)
    tree = None
    if dump_dir is not None:
        tree = Path(dump_dir) / "tree"
        manager.enable_ir_printing(print_after_all=True, print_module_scope=True,
                                   large_elements_limit=16,
                                   tree_printing_dir_path=str(tree))
    try:
        manager.run(compilation.module.operation)
        if (unverified or pending) and not every_pass:
            verify()
    except CodegenError:
        raise
    except Exception as e:
        where = f"pass {current[0]}" if current else "the pipeline"
        if hasattr(e, "error_diagnostics"):  # MLIR's error, with the diagnostics' locations
            raise CodegenError.from_mlir(f"{where} failed", e) from None
        raise CodegenError(f"{where} failed: {type(e).__name__}: {e}") from e
    finally:
        if tree is not None:
            _flatten_dumps(tree, Path(dump_dir))
    return seconds


def pass_label(index: int, step: Pass) -> str:
    """`NN_<name>`: the pass at `index` of a pipeline, as its dump file and timing name it
    (`24_sink-slices`)."""
    return f"{index:02d}_{step.name}"


def _flatten_dumps(tree: Path, into: Path) -> None:
    """MLIR's tree printer nests files under a folder per op (`builtin_module_no-symbol-
    name/`); the module-level files move up to `into`."""
    if not tree.is_dir():
        return
    for path in sorted(tree.rglob("*.mlir")):
        # "<counter>_<argument>.mlir": the argument is already NN_<pass>
        name = path.name.split("_", 1)[1] if "_" in path.name else path.name
        path.replace(into / name)
    for directory in sorted(tree.rglob("*"), reverse=True):
        if directory.is_dir():
            directory.rmdir()
    tree.rmdir()


def has_dynamic_shapes(main) -> bool:
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    return any(isinstance(t, ir.RankedTensorType) and not t.has_static_shape
               for t in list(function_type.inputs) + list(function_type.results))


def _set_private(function, private: bool) -> None:
    if private:
        function.attributes["sym_visibility"] = ir.StringAttr.get("private")
    elif "sym_visibility" in function.attributes:
        del function.attributes["sym_visibility"]


def find_main(module):
    for op in module.body.operations:
        if op.operation.name == "func.func" and \
                ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise CodegenError("the module has no function 'main'")


def _inline_user_converters(module, user_calls) -> None:
    try:
        fill_bodies(module, user_calls)
    except ConverterError as e:
        raise CodegenError(str(e), e.node_index) from e
    upstream("inline, symbol-dce")(Compilation(module, Options(0)))


def _outline_library_calls(c: Compilation) -> None:
    calls = outlining.outline(c.module, c.main)
    c.statistics.library_calls = sum(calls.values())
    c.statistics.fused_attention = sum(count for kind, count in calls.items()
                                       if kind.startswith("attention"))
    c.statistics.kernel_calls = calls.get(kernel_calls.KIND, 0)


def _outline_parallel_loops(c: Compilation) -> None:
    c.parallel_tasks = parallel.outline(c.module, c.main)
    c.statistics.parallel_loops = len(c.parallel_tasks)


def _tile_transposes(c: Compilation) -> None:
    c.statistics.tiled_transposes = tiled_transpose.tile_transposes(c.module)


def _emit_c_interface(c: Compilation) -> None:
    """Main gets a C interface (`_mlir_ciface_main`, descriptors by pointer), which
    blade_entry calls."""
    c.main.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()


def _record_noalias_arguments(c: Compilation) -> None:
    c.noalias = abi.noalias_buffers(c.module)
