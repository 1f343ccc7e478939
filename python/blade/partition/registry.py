"""The converter registry: the one place that answers "can this node be compiled, and how".

Entries are keyed by exact overload (``aten::add.Tensor``, not ``aten::add``). Each has a
capability validator that may refuse a particular node, a priority (the highest-priority
entry that accepts a node wins, so a user's converter can override a built-in one), and
the dtype rule from `blade.dtypes`. Built-in entries have no `lower` function: their op is
imported into Torch-MLIR's torch dialect as it is and lowered by Torch-MLIR. An aten op with
no entry is compilable when Torch-MLIR lowers it for the node's types and constant arguments
(blade.partition.torch_mlir_probe asks it).
"""
import enum
import functools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from blade import _C
from blade.graph_queries import argument_name, argument_names, ran, schema_name
from blade import dtypes

# A validator returns None to accept the node, or the reason it refuses it.
Validator = Callable[[torch._C.Node], Optional[str]]

BUILTIN_PRIORITY = 0
USER_PRIORITY = 100


@dataclass
class Converter:
    schema: str
    lower: Optional[Callable] = None
    validator: Optional[Validator] = None
    priority: int = BUILTIN_PRIORITY
    compute: bool = True  # counts towards Config.min_cluster_size
    dtype_rule: Optional[dtypes.DtypeRule] = None
    origin: str = "builtin"
    kernel_call: bool = False  # the engine calls PyTorch's kernel (partition/kernel_calls)


class Refusal(str, enum.Enum):
    """Why a node is not compiled (Verdict.category); the verdict's `reason` says it in
    words for the report."""
    NONE = ""
    EXCLUDED = "excluded"                    # Config.excluded_ops
    STORAGE_OBSERVED = "storage_observed"    # reads memory layout (as_strided, ...)
    NOT_MATERIALIZED = "not_materialized"    # the example run never ran it
    NO_CONVERTER = "no_converter"
    UNKNOWN_TYPE = "unknown_type"            # an operand or result without a known type
    NON_CONSTANT_ARGUMENT = "non_constant_argument"
    DTYPE = "dtype"                          # the dtype table refuses its dtypes
    VALIDATOR = "validator"                  # its converter's validator refuses it
    CONVERSION_FAILED = "conversion_failed"  # its cluster failed to compile, blaming it
    NOT_NEEDED = "not_needed"                # a list only compiled ops would have read


@dataclass
class Verdict:
    converter: Optional[Converter]
    category: Refusal = Refusal.NONE  # why not
    reason: str = ""

    @property
    def supported(self) -> bool:
        return self.converter is not None


def _origin(value: torch._C.Value) -> str:
    """Where a value comes from, for the user: forward's argument by name, or the op."""
    if value.node().kind() == "prim::Param":
        argument = argument_name(value)
        return (f"(forward's argument '{argument}', a {value.type()} given at each call: "
                "pass it as a tensor, or make it an attribute of the module)")
    return f"(%{value.debugName()}, made by {value.node().kind()})"


def _tensor_dtype(value: torch._C.Value) -> Optional[str]:
    t = value.type()
    if not isinstance(t, torch._C.TensorType) or t.scalarType() is None:
        return None
    return dtypes.dtype_name(t.dtype())


def is_materialized(value: torch._C.Value, static_shapes: bool = True) -> bool:
    t = value.type()
    if not isinstance(t, torch._C.TensorType):
        return True
    if t.scalarType() is None or t.dim() is None or t.device() is None:
        return False
    # A dim whose size differed between runs (in a loop) has a shape symbol, negative here.
    return not static_shapes or all(s >= 0 for s in t.symbolic_sizes())


def _unknown_type_reason(name: str, value: torch._C.Value) -> str:
    t = value.type()
    if t.scalarType() is not None and t.dim() is not None:
        return (f"{name}: the sizes of %{value.debugName()} differ between the runs of this "
                "node (a loop, say), and static engines need fixed sizes")
    return (f"{name}: the example run gave %{value.debugName()} no tensor (an optional result "
            "left undefined, say), so its type is not known")


class ConverterRegistry:
    def __init__(self):
        self._entries: Dict[str, List[Converter]] = {}
        self._unknown_ops: Optional[Tuple[Callable, Callable, str]] = None
        self._kernel_calls: Optional[Tuple[Callable, Callable, str]] = None

    def ask_about_unknown_ops(self, excluded: Callable, refusal: Callable, origin: str) -> None:
        """How a node that no converter covers is decided: `excluded(node)` says why it
        is not even asked (None: ask), `refusal(node, static_shapes)` is asked once its
        types are known and its non-tensor arguments constant, and says why it cannot be
        compiled (None: it can, as `origin`; see blade.partition.torch_mlir_probe)."""
        self._unknown_ops = (excluded, refusal, origin)

    def call_kernels_of_unlowered_ops(self, excluded: Callable, refusal: Callable,
                                      origin: str) -> None:
        """How a node that nothing lowers may still be compiled: as a call of PyTorch's
        kernel from the engine's code, when `excluded(node)` (asked of the op's schema
        alone) and then `refusal(node, static_shapes)` are None; see
        blade.partition.kernel_calls."""
        self._kernel_calls = (excluded, refusal, origin)

    def may_call_kernel(self, node: torch._C.Node) -> bool:
        """Whether `node`'s op may be compiled as a kernel call (its types not asked)."""
        return self._kernel_calls is not None and self._kernel_calls[0](node) is None

    def register(self, converter: Converter) -> Converter:
        entries = self._entries.setdefault(converter.schema, [])
        entries.append(converter)
        entries.sort(key=lambda c: -c.priority)
        return converter

    def unregister(self, converter: Converter) -> None:
        entries = self._entries.get(converter.schema, [])
        if converter in entries:
            entries.remove(converter)

    def entries(self, schema: str) -> List[Converter]:
        return list(self._entries.get(schema, []))

    def has_lowering(self, schema: str) -> bool:
        """Whether some converter of `schema` builds its own IR (a user converter)."""
        return any(c.lower is not None for c in self._entries.get(schema, ()))

    def schemas(self) -> List[str]:
        return sorted(k for k, v in self._entries.items() if v)

    def check(self, node: torch._C.Node, excluded_ops: Sequence[str] = (),
              static_shapes: bool = True, kernel_calls: bool = True) -> Verdict:
        """Whether `node` can be compiled, by which converter, or why not; as a kernel call
        only when `kernel_calls` (Config.kernel_calls)."""
        name = schema_name(node)
        if name in excluded_ops or node.kind() in excluded_ops:
            return Verdict(None, Refusal.EXCLUDED, f"{name} is in Config.excluded_ops")
        observer = storage_observer(node)
        if observer is not None:
            return Verdict(None, Refusal.STORAGE_OBSERVED,
                           f"{name}: {observer} reads the memory layout of its result (strides "
                           "or storage), which compiled code, returning fresh contiguous "
                           "tensors, would change")
        candidates = self._entries.get(name, [])
        unknown = next((v for v in list(node.inputs()) + list(node.outputs())
                        if not is_materialized(v, static_shapes)), None)
        if unknown is not None and not ran(node):
            # Unreached code first: whatever its ops, the example inputs never ran them.
            return Verdict(None, Refusal.NOT_MATERIALIZED,
                           f"{name}: the type of %{unknown.debugName()} is not known (the "
                           "example inputs never reached this node)")
        # An op with no converter that Torch-MLIR is not even asked about.
        unprobed = not candidates and (self._unknown_ops is None or
                                       self._unknown_ops[0](node) is not None)
        if unprobed and not (kernel_calls and self.may_call_kernel(node)):
            return Verdict(None, Refusal.NO_CONVERTER, f"no converter is registered for {name}")
        if unknown is not None:
            return Verdict(None, Refusal.UNKNOWN_TYPE, _unknown_type_reason(name, unknown))
        arg_names = argument_names(node)
        for arg, value in zip(arg_names, node.inputs()):
            if not _is_static_argument(value):
                return Verdict(None, Refusal.NON_CONSTANT_ARGUMENT,
                               f"{name}: argument '{arg}' {_origin(value)} is not a "
                               "compile-time constant")
        if not candidates:
            # No converter of Blade's: compilable when Torch-MLIR lowers it as it is, or
            # else as a kernel call.
            if unprobed:
                return self._kernel_call_or(node, static_shapes, kernel_calls, Refusal.NO_CONVERTER,
                                            f"no converter is registered for {name}")
            why = self._torch_mlir_refusal(node, static_shapes)
            if why is not None:
                return self._kernel_call_or(node, static_shapes, kernel_calls, Refusal.NO_CONVERTER,
                                            f"no converter is registered for {name}, and {why}")
            return Verdict(Converter(name, origin=self._unknown_ops[2]))
        refusals = []
        for converter in candidates:
            computed = [arg for arg, value in zip(arg_names, node.inputs())
                        if _is_computed(value)] if converter.lower is not None else []
            if computed:
                # A user converter reads its non-tensor arguments as constants.
                refusals.append((Refusal.NON_CONSTANT_ARGUMENT,
                                 f"{name}: argument '{computed[0]}' is a size computed at run "
                                 f"time; {converter.origin} converters take constants only"))
                continue
            why = self._dtype_refusal(node, name, arg_names, converter)
            if why is not None:
                refusals.append((Refusal.DTYPE, why))
                continue
            if converter.validator is not None:
                why = converter.validator(node)
                if why is not None:
                    refusals.append((Refusal.VALIDATOR, f"{name}: {why}"))
                    continue
            return Verdict(converter)
        category, reason = refusals[0]
        if category == Refusal.NON_CONSTANT_ARGUMENT:
            return Verdict(None, category, reason)
        if category == Refusal.DTYPE and self._unknown_ops is not None and \
                self._unknown_ops[0](node) is None:
            # Blade's table does not cover these dtypes: Torch-MLIR may still lower the op
            # for them (the engine check then proves what it lowers to).
            why = self._torch_mlir_refusal(node, static_shapes)
            if why is None:
                return Verdict(Converter(name, origin=self._unknown_ops[2]))
            reason = f"{reason}; {why}"
        return self._kernel_call_or(node, static_shapes, kernel_calls, category, reason)

    def _kernel_call_or(self, node, static_shapes: bool, kernel_calls: bool, category: Refusal,
                        reason: str) -> Verdict:
        """A kernel call of `node` when it may be one, else the refusal given (and why it
        cannot be a kernel call, when its op could be one)."""
        if not kernel_calls or not self.may_call_kernel(node):
            return Verdict(None, category, reason)
        why = self._kernel_calls[1](node, static_shapes)
        if why is not None:
            return Verdict(None, category, f"{reason}; nor can it be a kernel call: {why}")
        # Not a compute op of its own: an engine of kernel calls alone would only add a copy
        # of their results to what TorchScript does. The reason it is no more than a kernel
        # call goes with it, for the report of a cluster dissolved for that. Blade's own
        # int8 ops are the exception: an engine holds their weights packed.
        return Verdict(Converter(schema_name(node), origin=self._kernel_calls[2],
                                 compute=node.kind().startswith("blade::"),
                                 kernel_call=True), "kernel_call", reason)

    def _torch_mlir_refusal(self, node, static_shapes: bool) -> Optional[str]:
        """Why Torch-MLIR's lowering of `node` as it is cannot be compiled (None: it can),
        asked of the function `ask_about_unknown_ops` gave."""
        return self._unknown_ops[1](node, static_shapes)

    @staticmethod
    def _dtype_refusal(node, name, arg_names, converter) -> Optional[str]:
        arg_dtypes = {}
        for arg, value in zip(arg_names, node.inputs()):
            dtype = _tensor_dtype(value)
            if isinstance(value.type(), torch._C.TensorType):
                arg_dtypes[arg] = dtype or "unknown"
        result_dtypes = [(_tensor_dtype(v) or "unknown") for v in node.outputs()
                         if isinstance(v.type(), torch._C.TensorType)]
        return dtypes.check_dtypes(name, arg_dtypes, result_dtypes, converter.dtype_rule)


# Ops whose result depends on a tensor's strides, storage offset or storage, not only on
# its values.
STORAGE_OBSERVERS = ("aten::as_strided", "aten::as_strided_", "aten::as_strided_copy",
                     "aten::as_strided_scatter", "aten::stride", "aten::storage_offset",
                     "aten::is_contiguous", "aten::data_ptr", "aten::is_set_to",
                     "aten::is_non_overlapping_and_dense")
# Ops whose schema promises a fresh tensor but that return a view of their input.
UNDECLARED_VIEWS = ("aten::_unsafe_view",)


def is_view(node: torch._C.Node) -> bool:
    """Whether the node's tensor result may be a view of an argument (its schema's alias
    annotation, or one of the ops that view without saying so)."""
    return node.kind() in UNDECLARED_VIEWS or _returns_a_view(node.schema())


@functools.lru_cache(maxsize=None)
def _returns_a_view(schema: str) -> bool:
    # Parsed once per schema: the registry asks it of every node.
    if schema == "(no schema)":
        return False
    returns = torch._C.parse_schema(schema).returns
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def storage_observer(node: torch._C.Node) -> Optional[str]:
    """The op that reads the memory layout of this view's result, directly or through more
    views (`x[1:3]._unsafe_view(4, 4).as_strided(..., storage_offset=0)` reads x's storage
    from its start), or None. Such views stay TorchScript: an engine returns a fresh,
    contiguous tensor, with other strides and storage than eager's view. A non-view result
    is fresh in eager too, and compiled as usual."""
    if not is_view(node):
        return None
    pending = [v for v in node.outputs() if isinstance(v.type(), torch._C.TensorType)]
    while pending:
        for use in pending.pop().uses():
            user = use.user
            if user.kind() in STORAGE_OBSERVERS:
                return user.kind()
            if is_view(user):
                pending.extend(v for v in user.outputs()
                               if isinstance(v.type(), torch._C.TensorType))
    return None


def _is_static_argument(value: torch._C.Value) -> bool:
    """Tensors are passed at run time; anything else must be known when compiling, or be a
    size the compiled code computes itself from its tensors (dynamic shapes: `size()` of a
    dynamic dim and int arithmetic on it, see csrc/passes/duplicate_shape_arithmetic.h)."""
    if isinstance(value.type(), torch._C.TensorType):
        return True
    producer = value.node()
    if producer.kind() == "prim::Constant":
        return True
    if producer.kind() == "prim::ListConstruct":
        return all(isinstance(v.type(), torch._C.TensorType) or
                   v.node().kind() == "prim::Constant" or _is_shape_int(v)
                   for v in producer.inputs())
    return _is_shape_int(value)


def _is_computed(value: torch._C.Value) -> bool:
    """A size computed at run time, or a list holding one."""
    if value.node().kind() == "prim::ListConstruct":
        return any(_is_shape_int(v) for v in value.node().inputs())
    return _is_shape_int(value)


def _is_shape_int(value: torch._C.Value) -> bool:
    return isinstance(value.type(), (torch._C.IntType, torch._C.FloatType)) and \
        _C.is_shape_arithmetic(value.node())


REGISTRY = ConverterRegistry()

