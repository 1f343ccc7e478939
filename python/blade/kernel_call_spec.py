"""What an engine needs to call one of PyTorch's kernels (partition/kernel_calls decides
which nodes are called so): the call's spec line, which the importer attaches to the call's
declaration and the code generator embeds in the engine's library, and the limits the RAL
sets (csrc/ral/kernel_calls.h). A leaf below partition, importer and codegen."""
from typing import List, NamedTuple, Optional

import torch

from blade.dtypes import SCALAR_TYPE_NAMES
from blade.graph_queries import schema_name

# The attribute of the call's declaration in the imported module that holds its `spec`.
SPEC_ATTRIBUTE = "blade.kernel_call"

# Operands and results together: the RAL defines blade_ral_kernel_call_1 ... _12.
MAX_TENSORS = 12

# Ops whose one result has the sizes of their first operand but for the last dim, a
# constant: an engine with dynamic shapes allocates it from the operand's
# (codegen/kernels/declarations.define_returning), so they are kernel calls there too.
SIZES_OF_FIRST_OPERAND = frozenset(("blade::quantized_linear",))


class Window(NamedTuple):
    """Where a windowed op's geometry lies among its schema arguments: its window's sizes
    (`kernel`: an int list argument; None: dims 2 and 3 of tensor operand 1, a
    convolution's weight), stride, padding and dilation (int lists), and ceil_mode (a bool,
    or None: the op has none)."""
    kernel: Optional[int]
    stride: int
    padding: int
    dilation: int
    ceil_mode: Optional[int] = None


# Ops whose one result is the window's output over their first operand, 4-d both: its
# batch and spatial dims follow from the operand's (H_out = (H + 2 padding - dilation
# (kernel - 1) - 1) // stride + 1), its channels are static; an engine with dynamic shapes
# allocates it so (codegen/kernels/kernel_calls.result_sizes), so they are kernel calls
# there too. A 4-d tensor lies as NHWC when it is int8 (Blade's uint8 activations) or its
# dtype in the spec is marked `:nhwc` (a float32 buffer of an int8 convolution), else as
# NCHW.
WINDOWED = {
    "blade::quantized_conv2d": Window(kernel=None, stride=4, padding=5, dilation=6),
    "blade::quantized_conv2d_add": Window(kernel=None, stride=4, padding=5, dilation=6),
    "blade::quantized_max_pool2d": Window(kernel=1, stride=2, padding=3, dilation=4,
                                          ceil_mode=5),
}
# quantized_conv2d_add's argument of the result's sizes (its accum), by schema position.
WINDOWED_LIKE_RESULT = {"blade::quantized_conv2d_add": 9}


def channel_dim(dtype: str) -> int:
    """The channel dim of a windowed op's 4-d tensor of spec dtype `dtype` (see WINDOWED)."""
    return 3 if dtype == "int8" or dtype.endswith(":nhwc") else 1


def int_list(field: str) -> List[int]:
    """The ints of a spec's int list argument (`I2,2`)."""
    if not field.startswith("I"):
        raise ValueError(f"'{field}' is not an int list argument")
    return [int(v) for v in field[1:].split(",") if v]

def spec(node: torch._C.Node) -> str:
    """The call as the RAL reads it (csrc/ral/kernel_calls.h): the overload, the dtypes of
    its tensor operands and of its results (Blade's names), then each argument in schema
    order, separated by spaces. An argument is `T<k>` (the k-th tensor operand), `N` (None),
    `b0`/`b1`, `i<int>`, `f<float.hex()>`, `s<UTF-8 bytes in hex>`, `D<device name in hex>`,
    or a list: `I`, `F` or `B` and its items joined by commas."""
    tensors = [v for v in node.inputs() if isinstance(v.type(), torch._C.TensorType)]
    arguments: List[str] = []
    for value in node.inputs():
        if isinstance(value.type(), torch._C.TensorType):
            arguments.append(f"T{tensors.index(value)}")
        else:
            encoded = encode_argument(value)
            if encoded is None:
                raise ValueError(f"{schema_name(node)}: argument %{value.debugName()} cannot "
                                 "be passed to a kernel call")
            arguments.append(encoded)

    def dtypes(values) -> str:
        return ",".join(SCALAR_TYPE_NAMES[v.type().scalarType()] for v in values) or "-"

    return " ".join([schema_name(node), dtypes(tensors), dtypes(node.outputs()), *arguments])

def encode_argument(value: torch._C.Value) -> Optional[str]:
    """`value` encoded for `spec`, or None when it is not a constant of a kind it carries."""
    producer = value.node()
    if producer.kind() == "prim::ListConstruct":
        items = list(producer.inputs())
        if not all(v.node().kind() == "prim::Constant" for v in items):
            return None
        return _list(value.type().getElementType(), [v.toIValue() for v in items])
    if producer.kind() != "prim::Constant":
        return None
    ivalue = value.toIValue()
    if ivalue is None:
        return "N"
    if isinstance(ivalue, bool):
        return f"b{int(ivalue)}"
    if isinstance(ivalue, int):
        return f"i{ivalue}"
    if isinstance(ivalue, float):
        return "f" + ivalue.hex()
    if isinstance(ivalue, str):
        return "s" + ivalue.encode().hex()
    if isinstance(ivalue, torch.device):
        return "D" + str(ivalue).encode().hex()
    if isinstance(ivalue, (list, tuple)) and isinstance(value.type(), torch._C.ListType):
        return _list(value.type().getElementType(), list(ivalue))
    return None

def _list(element, items) -> Optional[str]:
    if any(v is None for v in items):
        return None
    if isinstance(element, torch._C.BoolType):
        return "B" + ",".join(str(int(v)) for v in items)
    if isinstance(element, torch._C.IntType):
        return "I" + ",".join(str(int(v)) for v in items)
    if isinstance(element, torch._C.FloatType):
        return "F" + ",".join(float(v).hex() for v in items)
    return None
