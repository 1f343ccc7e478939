"""What Blade compiled, what fell back, and why: `blade.report(module)`.

The analysis done by `blade.optimize` is stored on the optimized module as JSON (so it is
saved and loaded with it); run-time counters are read live from the module's engines.
"""
import enum
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Dict, List, Optional

import torch


REPORT_ATTRIBUTE = "_blade_report"
GUARD_ATTRIBUTE = "blade_guard"   # the optimized graph's input guard (csrc/ral/guard.h)


class CodeOrigin(str, enum.Enum):
    """Where an engine's code came from (ClusterReport.code); the report's text says it in
    words."""
    COMPILED = "compiled"            # by this optimize
    COMPILE_CACHE = "compile cache"  # the compile cache's directory
    SHARED = "shared"                # another engine's of this optimize (identical cluster)


@dataclass
class CodeStatistics:
    """What code generation made of one cluster, counted by the passes that make each
    thing (blade.codegen.pipeline); the compile cache stores it with the code, and each
    engine's report is one (ClusterReport).

    Example:
        >>> CodeStatistics(library_calls=2).as_dict()["library_calls"]
        2
    """

    library_calls: int = 0     # ops outlined as RAL kernel calls
    fused_attention: int = 0   # of those, attention chains run as one kernel
    kernel_calls: int = 0      # of those, ops run by PyTorch's dispatcher (kernel calls)
    parallel_loops: int = 0    # loop nests run on PyTorch's intra-op threads
    tiled_transposes: int = 0  # transposing loop nests rewritten as vector tiles

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, counters: dict) -> "CodeStatistics":
        """The counters `as_dict` wrote; raises KeyError or ValueError on a malformed one."""
        return cls(**{f.name: int(counters[f.name]) for f in fields(cls)})

    def take(self, other: "CodeStatistics") -> None:
        """Sets these counters to `other`'s (a report entry taking its code's)."""
        for f in fields(CodeStatistics):
            setattr(self, f.name, getattr(other, f.name))


@dataclass
class UnsupportedOp:
    count: int = 0
    reasons: List[str] = field(default_factory=list)


@dataclass(kw_only=True)
class ClusterReport(CodeStatistics):
    """One engine: its ops, signature, counters and what its code is made of (the
    CodeStatistics fields: library_calls, fused_attention, kernel_calls, parallel_loops,
    tiled_transposes)."""

    name: str
    ops: Dict[str, int]  # op kind -> count inside the cluster
    inputs: str          # signature, e.g. "float32[4,8];float32[8]"
    outputs: str
    compiled: bool = True
    calls: int = 0
    fallbacks: int = 0
    status: str = ""     # why the compiled code is not in use, or the last fallback reason
    packed_weights: int = 0  # prepared weight copies, oneDNN's or MKL's packed (read live)
    prepared_bytes: int = 0  # the memory those copies take beside the weights (read live)
    released_bytes: int = 0  # weight memory given back, read through the copies (read live)
    # Its kernel trials, one line per weight and input size: each kernel's best time and
    # the one kept (read live; csrc/ral/kernel_trials.cpp).
    kernel_choices: List[str] = field(default_factory=list)
    # Where the code came from (a CodeOrigin; "" for an engine that failed), and for
    # CodeOrigin.SHARED the engine of this optimize whose code it runs.
    code: str = ""
    code_shared_with: str = ""
    # "float32", or "bf16": its GEMMs and convolutions by weights run in bfloat16 (read live).
    precision: str = "float32"
    # The compile cache key of its code ("" when compiled apart from the cache).
    code_key: str = ""
    # Whether its latest call ran the compiled code (true before any call; read live).
    running_compiled: bool = True
    # The CPU features its code was compiled for, comma-separated (read live): a machine
    # without one of them runs its subgraph instead.
    cpu_features: str = ""


@dataclass
class Report:
    total_ops: int = 0   # tensor ops the example inputs ran
    compiled_ops: int = 0
    clusters: List[ClusterReport] = field(default_factory=list)
    unsupported: Dict[str, UnsupportedOp] = field(default_factory=dict)
    compile_errors: List[str] = field(default_factory=list)
    dry_run: bool = False
    decomposed: Dict[str, int] = field(default_factory=dict)  # op -> nodes rewritten
    # Config.dynamic: the groups of input dims that vary together ("input 0 dim 1"); the
    # engines' signatures name them s0, s1, ... Engines are compiled once, in optimize.
    dynamic_dims: List[List[str]] = field(default_factory=list)
    # Config.dynamic: what the example inputs could not tell (a size-1 dim kept static, equal
    # dims tied though the model runs with them apart), as optimize warned it.
    dynamic_notes: List[str] = field(default_factory=list)
    # Tensor ops in code the example inputs never ran (untaken branches): not compiled,
    # not in total_ops; inputs that take those branches run them as TorchScript.
    unreached: Dict[str, UnsupportedOp] = field(default_factory=dict)
    # The input guard of the optimized graph (read live): calls, and calls whose inputs
    # were not like the example inputs and ran the unspecialized model instead.
    guard_specs: str = ""
    # Inputs whose dtype the guard's specs cannot name (complex64, uint16, ...): how the
    # guard checks them instead (stored with the report).
    guard_notes: List[str] = field(default_factory=list)
    # forward's argument names of the guarded inputs, in the guard's order (its messages
    # say "input 0": the report adds the name).
    guard_inputs: List[str] = field(default_factory=list)
    guard_calls: int = 0
    guard_fallbacks: int = 0
    guard_status: str = ""
    # Config.check_engines: engines compared with their subgraphs on the example run's
    # inputs before they replaced their clusters, and the seconds that took in all (the
    # example run, the comparisons, bisections of engines that disagreed).
    checked_engines: int = 0
    check_seconds: float = 0.0
    # Engines not run by the check: their code is byte-identical to a checked engine's,
    # or came from the compile cache, checked by the optimize that compiled it.
    engines_sharing_checked_code: int = 0
    engines_checked_before: int = 0
    # Engines the check could not run: the example inputs never reached their cluster
    # (with dynamic dims, a branch only the resized inputs took); they run unchecked.
    engines_not_reached_by_the_check: int = 0
    # Clusters whose example came from the run that recorded the types (they take the
    # graph's inputs and give its results), not from a run of its own (blade.self_check).
    examples_from_type_run: int = 0
    # "hit": this model came whole from the model cache (blade.model_cache), the optimize
    # that made it said the rest of this report; "not kept: <why>" when the cache is on and
    # could not keep it; "" otherwise.
    model_cache: str = ""
    # Views made after an engine call on its results or inputs, so that they alias as in
    # eager (metadata only; counted with their engine's ops).
    edge_views: int = 0
    # Views of the caller's tensors that the model returns as they are (`x.view(...)`,
    # `x.t()`): metadata only, made as in eager, not an engine's work; not in total_ops.
    input_views: int = 0
    # Read live: the calls that ran TorchScript instead of compiled code, by their first
    # reason of each kind ("input guard: ..." or "<engine>: ..."), and the tensor ops whose
    # engines ran compiled on the latest calls (none when the guard refused the latest).
    fallback_reasons: Dict[str, int] = field(default_factory=dict)
    running_ops: int = 0
    # Config.precision="int8": blade.frontend.quantize.Int8Summary.to_dict() (the layers
    # quantized, those kept float and why, the output's agreement with the float model on
    # the calibration inputs); None otherwise.
    int8: Optional[Dict] = None

    @property
    def coverage(self) -> float:
        return self.compiled_ops / self.total_ops if self.total_ops else 0.0

    @property
    def running_coverage(self) -> float:
        return self.running_ops / self.total_ops if self.total_ops else 0.0

    @property
    def runtime_fallbacks(self) -> int:
        return self.guard_fallbacks + sum(c.fallbacks for c in self.clusters)

    @property
    def unreached_ops(self) -> int:
        return sum(entry.count for entry in self.unreached.values())

    def add_unreached(self, kind: str, reason: str) -> None:
        # One reason per op: each names its own unreached value, and they all say the same.
        _tally(self.unreached, kind, reason if kind not in self.unreached else None)

    def add_unsupported(self, kind: str, reason: str) -> None:
        _tally(self.unsupported, kind, reason)

    def with_input_names(self, message: str) -> str:
        """The guard's `message` with each "input N" followed by forward's argument name."""
        def named(match):
            position = int(match.group(1))
            if position >= len(self.guard_inputs):
                return match.group(0)
            return f"{match.group(0)} ('{self.guard_inputs[position]}')"
        return re.sub(r"\binput (\d+)\b", named, message)

    def _int8_lines(self, engines: int) -> List[str]:
        q = self.int8
        lines = [f"  precision: int8 ({len(q['layers'])} linear and convolution layers, in "
                 f"{engines} of "
                 f"{len(self.clusters)} engines; calibrated on {q['calibration_inputs']} "
                 f"inputs): output vs the float model on them: cosine {q['cosine']:.5f}, "
                 f"max abs error {q['max_abs_error']:.3g}"]
        if q.get("residual_adds"):
            lines.append(f"    {q['residual_adds']} residual adds folded into the "
                         "convolution before them (oneDNN's sum post-op)")
        if q.get("chained"):
            lines.append(f"    {q['chained']} layers hand uint8 activations to the int8 "
                         "layers reading them (activation and rounding in the kernel)")
        if q.get("rounded_in_code"):
            lines.append(f"    {q['rounded_in_code']} float activations rounded to uint8 by "
                         "the engines' code for the int8 layers reading them")
        for name, e in sorted(q.get("engines", {}).items(),
                              key=lambda item: int(item[0].rpartition("_")[2])):
            if "not_measured" in e:
                lines.append(f"    {name} vs its float twin: not measured: "
                             f"{e['not_measured']}")
                continue
            lines.append(f"    {name} vs its float twin on the same inputs: "
                         f"cosine {e['cosine']:.5f}, max abs error "
                         f"{e['max_abs_error']:.3g} (largest value {e['max_abs_value']:.3g})")
        for name, why in sorted(q["float_layers"].items()):
            lines.append(f"    kept float32: {name}: {why}")
        if q.get("uncalibrated"):
            lines.append(f"    {q['uncalibrated']} more layers, in branches the "
                         "calibration inputs never took, read those int8 weights (activation "
                         "scales measured on each call)")
        if q.get("unreached", 0) > q.get("uncalibrated", 0):
            lines.append(f"    kept float32: {q['unreached'] - q['uncalibrated']} "
                         "layers in branches the calibration inputs never took")
        if q.get("computed_weights"):
            lines.append(f"    kept float32: {q['computed_weights']} layers whose weight "
                         "is computed, not a weight of the model")
        return lines

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> "Report":
        data = json.loads(text)
        report = Report(total_ops=data["total_ops"], compiled_ops=data["compiled_ops"],
                        compile_errors=data["compile_errors"], dry_run=data["dry_run"],
                        decomposed=data.get("decomposed", {}),
                        dynamic_dims=data.get("dynamic_dims", []),
                        dynamic_notes=data.get("dynamic_notes", []),
                        guard_notes=data.get("guard_notes", []),
                        guard_inputs=data.get("guard_inputs", []),
                        checked_engines=data.get("checked_engines", 0),
                        check_seconds=data.get("check_seconds", 0.0),
                        engines_sharing_checked_code=data.get(
                            "engines_sharing_checked_code", 0),
                        engines_checked_before=data.get("engines_checked_before", 0),
                        engines_not_reached_by_the_check=data.get(
                            "engines_not_reached_by_the_check", 0),
                        examples_from_type_run=data.get("examples_from_type_run", 0),
                        model_cache=data.get("model_cache", ""),
                        edge_views=data.get("edge_views", 0),
                        input_views=data.get("input_views", 0),
                        int8=data.get("int8"))
        report.clusters = [ClusterReport(**c) for c in data["clusters"]]
        report.unsupported = {k: UnsupportedOp(**v) for k, v in data["unsupported"].items()}
        report.unreached = {k: UnsupportedOp(**v) for k, v in data.get("unreached", {}).items()}
        return report

    def __str__(self) -> str:
        lines = [
            f"Blade report{' (dry run: nothing compiled)' if self.dry_run else ''}",
            f"  tensor ops: {self.total_ops}, compiled: {self.compiled_ops} "
            f"({100 * self.coverage:.1f}%)"
            + ("" if self.dry_run else f", running compiled now: {self.running_ops} "
               f"({100 * self.running_coverage:.1f}%)")
            + f", clusters: {len(self.clusters)}, run-time fallbacks: "
            f"{self.runtime_fallbacks}",
        ]
        if self.fallback_reasons:
            lines.append("  calls that ran TorchScript instead of compiled code, by reason:")
            lines.extend(f"    {calls:>6}  {reason}" for reason, calls in sorted(
                self.fallback_reasons.items(), key=lambda kv: -kv[1]))
        if self.unreached_ops:
            lines.append(f"  {self.unreached_ops} more tensor ops are in branches the example "
                         "inputs never took (not counted above; they run as TorchScript when "
                         "a call takes them), e.g. " + ", ".join(
                             f"{k} x{v.count}" for k, v in sorted(
                                 self.unreached.items(), key=lambda kv: -kv[1].count)[:4]))
        if self.guard_specs or self.guard_calls:
            specs = self.guard_specs.split(";")
            if len(specs) == len(self.guard_inputs):
                specs = [f"{name}: {spec}" for name, spec in zip(self.guard_inputs, specs)]
            status = self.with_input_names(self.guard_status)
            lines.append(f"  input guard ({'; '.join(specs)}): {self.guard_calls} calls, "
                         f"{self.guard_fallbacks} ran the unspecialized model"
                         + (f"; last: {status}" if status else ""))
            lines.extend(f"    {note}" for note in self.guard_notes)
        if self.dynamic_dims:
            lines.append("  dynamic dims (each group varies together): " + "; ".join(
                ", ".join(group) for group in self.dynamic_dims))
        lines.extend(f"  the example cannot tell: {note}" for note in self.dynamic_notes)
        if self.edge_views:
            lines.append(f"  views made after the engine call, to alias as in eager: "
                         f"{self.edge_views} (metadata only, counted with their engine)")
        if self.input_views:
            lines.append(f"  views of inputs returned as they are: {self.input_views} "
                         "(metadata only, made on the caller's tensors as in eager; not "
                         "counted above)")
        if self.decomposed:
            lines.append("  decomposed: " + ", ".join(
                f"{op} x{n}" for op, n in sorted(self.decomposed.items())))
        if self.model_cache == "hit":
            lines.append("  whole from the model cache: what follows is what the optimize that "
                         "made it found")
        elif self.model_cache:
            lines.append(f"  model cache: {self.model_cache} (so a later optimize of this "
                         "model compiles it again)")
        origins = [c.code for c in self.clusters if c.compiled and c.code]
        if origins:
            shared = origins.count(CodeOrigin.SHARED)
            lines.append(f"  code: {origins.count(CodeOrigin.COMPILED)} compiled now, "
                         f"{origins.count(CodeOrigin.COMPILE_CACHE)} from the compile cache"
                         + (f"; {_engines(shared)} of identical clusters "
                            f"{'runs' if shared == 1 else 'run'} another engine's code"
                            if shared else ""))
        if self.checked_engines or self.engines_checked_before:
            sharing, before = self.engines_sharing_checked_code, self.engines_checked_before
            lines.append(f"  engines checked against TorchScript on the example inputs: "
                         f"{self.checked_engines}, in {self.check_seconds:.2f} s"
                         + (f"; {sharing} more {'engine runs' if sharing == 1 else 'engines run'}"
                            " code already checked in this optimize" if sharing else "")
                         + (f"; {_engines(before)} {'runs' if before == 1 else 'run'} cached "
                            "code that was checked when it was compiled" if before else "")
                         + (f"; {self.examples_from_type_run} compared with the results of "
                            f"the run that recorded the types" if self.examples_from_type_run
                            else ""))
        if self.engines_not_reached_by_the_check:
            lines.append(f"  engines not checked: {self.engines_not_reached_by_the_check} (the "
                         "example inputs never reached their cluster: a branch that only the "
                         "resized inputs of dynamic dims took)")
        features = sorted({c.cpu_features for c in self.clusters if c.cpu_features})
        for needed in features:
            lines.append(f"  code compiled for CPU features: {needed}" +
                         (f" ({sum(c.cpu_features == needed for c in self.clusters)} engines)"
                          if len(features) > 1 else ""))
        bf16 = sum(c.precision == "bf16" for c in self.clusters)
        if bf16:
            lines.append(f"  precision: bf16 (GEMMs and convolutions by weights in bfloat16 "
                         f"with float32 accumulation) in {bf16} of {len(self.clusters)} "
                         "engines")
        int8 = sum(c.precision == "int8" for c in self.clusters)
        if self.int8 is not None:
            lines.extend(self._int8_lines(int8))
        elif int8:
            lines.append(f"  precision: int8 layers (quantized before optimize) in {int8} of "
                         f"{len(self.clusters)} engines")
        copies = sum(c.packed_weights for c in self.clusters)
        if copies:
            lines.append(f"  prepared weight copies: {copies}, "
                         f"{sum(c.prepared_bytes for c in self.clusters) / 1e6:.1f} MB "
                         "beside the weights (made on first calls; freed where another "
                         "kernel proved faster)")
        choices = [line for c in self.clusters for line in c.kernel_choices]
        if choices:
            kept = Counter(line.rsplit(" -> ", 1)[-1] for line in choices)
            lines.append(f"  kernel trials: {len(choices)} weights and input sizes, kept " +
                         ", ".join(f"{kernel} {count}" for kernel, count in sorted(kept.items()))
                         + " (each cluster's kernel_choices lists them)")
        released = sum(c.released_bytes for c in self.clusters)
        if released:
            lines.append(f"  weights given back: {released / 1e6:.1f} MB (read only through "
                         "their copies; written back before anything reads them as they are)")
        if self.clusters:
            lines.append(f"  {'cluster':<28} {'ops':>4} {'calls':>7} {'fallbk':>7}  "
                         "inputs -> outputs")
            first_with = {}  # a status shared by many engines (an untrusted key) said once
            for c in self.clusters:
                lines.append(f"  {c.name:<28} {sum(c.ops.values()):>4} {c.calls:>7} "
                             f"{c.fallbacks:>7}  {c.inputs} -> {c.outputs}")
                if c.status:
                    first = first_with.setdefault(c.status, c.name)
                    lines.append(f"  {'':<28} " + (c.status if first == c.name
                                                   else f"(the same as {first})"))
        if self.unsupported:
            lines.append(f"  {'not compiled':<28} {'count':>5}  reason")
            for kind, entry in sorted(self.unsupported.items(), key=lambda kv: -kv[1].count):
                lines.append(f"  {kind:<28} {entry.count:>5}  {entry.reasons[0]}")
                for reason in entry.reasons[1:3]:
                    lines.append(f"  {'':<28} {'':>5}  {reason}")
        for error in self.compile_errors:
            lines.append(f"  compile-time fallback: {error}")
        return "\n".join(lines)


def _engines(count: int) -> str:
    return f"{count} engine{'' if count == 1 else 's'}"


def _tally(table: Dict[str, UnsupportedOp], kind: str, reason) -> None:
    entry = table.setdefault(kind, UnsupportedOp())
    entry.count += 1
    if reason is not None and reason not in entry.reasons:
        entry.reasons.append(reason)


def amend_report(module: torch.jit.ScriptModule, **fields) -> None:
    """Sets these fields of the report an optimized module holds."""
    stored = Report.from_json(module._c.getattr(REPORT_ATTRIBUTE))
    for name, value in fields.items():
        setattr(stored, name, value)
    module._c.setattr(REPORT_ATTRIBUTE, stored.to_json())


def report(module: torch.jit.ScriptModule) -> Report:
    """The report of a module returned by `blade.optimize` (or loaded after saving one).

    Example:
        >>> r = blade.report(optimized)
        >>> print(r.coverage, r.runtime_fallbacks)
    """
    if not hasattr(module, REPORT_ATTRIBUTE):
        raise ValueError("blade.report: this module was not produced by blade.optimize "
                         f"(it has no {REPORT_ATTRIBUTE} attribute)")
    result = Report.from_json(getattr(module, REPORT_ATTRIBUTE))
    guard = getattr(module, GUARD_ATTRIBUTE, None)
    admitted = True
    if guard is not None:
        result.guard_specs = guard.input_specs()
        result.guard_calls = guard.calls()
        result.guard_fallbacks = guard.fallbacks()
        result.guard_status = guard.last_fallback_reason()
        admitted = guard.last_call_admitted()
        for reason, calls in guard.fallback_reasons().items():
            result.fallback_reasons[f"input guard: {result.with_input_names(reason)}"] = calls
    for cluster in result.clusters:
        if not cluster.compiled or result.dry_run:
            continue
        engine = getattr(module, cluster.name)
        cluster.calls = engine.calls()
        cluster.fallbacks = engine.fallbacks()
        cluster.running_compiled = engine.last_call_compiled()
        for reason, calls in engine.fallback_reasons().items():
            result.fallback_reasons[f"{cluster.name}: {reason}"] = calls
        if admitted and cluster.running_compiled:
            result.running_ops += sum(cluster.ops.values())
        cluster.packed_weights = engine.packed_weights()
        cluster.prepared_bytes = engine.prepared_bytes()
        cluster.released_bytes = engine.released_bytes()
        cluster.kernel_choices = list(engine.kernel_choices())
        cluster.precision = engine.precision()
        cluster.cpu_features = engine.cpu_features()
        cluster.status = engine.load_error() or engine.last_fallback_reason()
    return result
