"""The user converter of inline-user-converters.mlir, for `blade-opt --user-calls`: the
importer's call @blade_user_0 of aten::relu, lowered by a converter that doubles its
operand instead."""
import torch

from blade.importer import UserCall
from blade.partition.registry import Converter


def relu(x):
    return torch.relu(x)


# Kept alive with the node, which points into it.
GRAPH = torch.jit.script(relu).graph


def user_call(lower) -> UserCall:
    """The call @blade_user_0 of the aten::relu node of `relu`, lowered by `lower(ctx)`."""
    node = next(n for n in GRAPH.nodes() if n.kind() == "aten::relu")
    return UserCall("blade_user_0", Converter("aten::relu", lower=lower, origin="user"), node,
                    {}, 0)


def double_it(ctx):
    x = ctx.operands[0]
    return ctx.op("stablehlo.add", [x, x])


USER_CALLS = [user_call(double_it)]
