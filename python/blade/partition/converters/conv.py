"""2-d convolution and pooling (NCHW)."""
from blade.dtypes import FLOATS, DtypeRule
from blade.graph_queries import constant_arguments
from blade.partition.converters.registration import builtin

FLOAT = DtypeRule(args={"*": FLOATS})


def _plain_2d_convolution(node):
    """aten::_convolution is what tracing records for every convolution; Blade compiles the
    forward, 2-d, non-transposed one."""
    rank = node.inputsAt(0).type().dim()
    if rank != 4:
        return f"the input has rank {rank}, only 2-d convolution (rank 4, NCHW) is compiled"
    if constant_arguments(node).get("transposed"):
        return "transposed convolution is not compiled"
    return None


def _conv2d_4d(node):
    rank = node.inputsAt(0).type().dim()
    if rank != 4:
        return f"the input has rank {rank}, only batched NCHW input (rank 4) is compiled"
    return None


# aten::conv2d.padding (padding="same"/"valid") is another overload, not registered.
builtin(["aten::conv2d"], FLOAT, validator=_conv2d_4d)
builtin(["aten::_convolution", "aten::_convolution.deprecated"], FLOAT,
        validator=_plain_2d_convolution)
def _dynamic_image_size(node) -> bool:
    """Whether a dynamic engine leaves the input's height or width to run time."""
    sizes = node.inputsAt(0).type().varyingSizes()   # None for a dim that varies
    return sizes is None or None in sizes[2:]


def _pair(value, default):
    values = list(value) if isinstance(value, (list, tuple)) and value else [default]
    return values * 2 if len(values) == 1 else values


def _partial_last_window(node) -> bool:
    """Whether ceil_mode adds a window that hangs over the input's end in some dim."""
    arguments = constant_arguments(node)
    kernel = _pair(arguments["kernel_size"], 1)
    stride = _pair(arguments.get("stride"), None)
    stride = [k if s is None else s for s, k in zip(stride, kernel)]
    padding = _pair(arguments.get("padding"), 0)
    dilation = _pair(arguments.get("dilation"), 1)
    sizes = node.inputsAt(0).type().varyingSizes()[2:]
    return any((size + 2 * pad - d * (k - 1) - 1) % step != 0
               for size, k, step, pad, d in zip(sizes, kernel, stride, padding, dilation))


def _window_pool(node):
    why = _conv2d_4d(node)
    if why is not None or not constant_arguments(node).get("ceil_mode"):
        return why
    # Torch-MLIR lowers ceil_mode with the floor mode's output size when the image size
    # varies (a wrong shape), and pads a partial last window on both sides (wrong values).
    if _dynamic_image_size(node):
        return "ceil_mode=True with a dynamic image size is not compiled"
    if _partial_last_window(node):
        return "ceil_mode=True with a partial last window is not compiled"
    return None


def _adaptive_pool(node):
    why = _conv2d_4d(node)
    if why is None and _dynamic_image_size(node):
        # Its window follows the image size, and Torch-MLIR lowers a fixed window only.
        return "adaptive pooling of a dynamic image size is not compiled"
    return why


builtin(["aten::max_pool2d", "aten::avg_pool2d"], FLOAT, validator=_window_pool)
builtin(["aten::adaptive_avg_pool2d"], FLOAT, validator=_adaptive_pool)
