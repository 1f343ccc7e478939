"""2-d convolution and pooling (NCHW)."""
import torch

from ..dtypes import FLOATS, DtypeRule
from . import builtin

FLOAT = DtypeRule(args={"*": FLOATS})


def _argument(node, name):
    arguments = torch._C.parse_schema(node.schema()).arguments
    for arg, value in zip(arguments, node.inputs()):
        if arg.name == name:
            return value
    return None


def _plain_2d_convolution(node):
    """aten::_convolution is what tracing records for every convolution; Blade compiles the
    forward, 2-d, non-transposed one."""
    rank = node.inputsAt(0).type().dim()
    if rank != 4:
        return f"the input has rank {rank}, only 2-d convolution (rank 4, NCHW) is compiled"
    transposed = _argument(node, "transposed")
    if transposed is not None and transposed.toIValue():
        return "transposed convolution is not compiled"
    return None


def _conv2d_4d(node):
    rank = node.inputsAt(0).type().dim()
    if rank != 4:
        return f"the input has rank {rank}, only batched NCHW input (rank 4) is compiled"
    return None


def _padding_is_numeric(node):
    padding = _argument(node, "padding")
    if padding is not None and isinstance(padding.type(), torch._C.StringType):
        return f"padding='{padding.toIValue()}' is not compiled, give the padding in numbers"
    return None


def _conv2d(node):
    return _conv2d_4d(node) or _padding_is_numeric(node)


builtin(["aten::conv2d"], FLOAT, validator=_conv2d)
builtin(["aten::_convolution", "aten::_convolution.deprecated"], FLOAT,
        validator=_plain_2d_convolution)
builtin(["aten::max_pool2d", "aten::avg_pool2d", "aten::adaptive_avg_pool2d"], FLOAT,
        validator=_conv2d_4d)
