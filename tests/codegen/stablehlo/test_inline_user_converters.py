"""The pipeline's inline-user-converters pass (blade.partition.user_converters): the
importer left a call of a private declaration per node a user converter lowers; the
converter builds its StableHLO body, which is verified and inlined."""
import pytest
import torch

from blade.codegen.errors import CodegenError
from blade.importer import UserCall
from blade.partition.registry import Converter
from ir_runner import check_pass

CALL = """
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @blade_user_0(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func private @blade_user_0(tensor<4xf32>) -> tensor<4xf32>
"""


def relu(x):
    return torch.relu(x)


def user_call(lower):
    node = next(n for n in torch.jit.script(relu).graph.nodes() if n.kind() == "aten::relu")
    return UserCall("blade_user_0", Converter("aten::relu", lower=lower, origin="user"), node,
                    {}, 0)


def double_it(ctx):
    x = ctx.operands[0]
    return ctx.op("stablehlo.add", [x, x])


def test_the_users_body_is_inlined_into_main():
    check_pass(CALL + """
    // CHECK: func.func @main(%arg0: tensor<4xf32>)
    // CHECK-NEXT: [[SUM:%[0-9]+]] = stablehlo.add %arg0, %arg0
    // CHECK-NEXT: return [[SUM]]
    // CHECK-NOT: blade_user_0
    """, "inline-user-converters", user_calls=(user_call(double_it),))


def test_a_converter_that_fails_is_reported_with_its_node():
    def broken(ctx):
        raise ValueError("broken on purpose")

    with pytest.raises(CodegenError, match="broken on purpose") as failure:
        check_pass(CALL + "// CHECK: never reached\n", "inline-user-converters",
                   user_calls=(user_call(broken),))
    assert failure.value.node_index == 0
