"""duplicate_shape_arithmetic: each use of a size computed at run time gets its own copy,
so that each cluster can compute the sizes it needs; results are unchanged."""
import torch
from torch.testing import FileCheck

import blade  # noqa: F401  (loads the runtime)
from blade import _C


def test_each_user_gets_its_own_chain():
    graph = torch._C.parse_ir("""
graph(%x : Float(*, *, requires_grad=0, device=cpu), %y : Float(*, *, requires_grad=0, device=cpu)):
  %c0 : int = prim::Constant[value=0]()
  %c2 : int = prim::Constant[value=2]()
  %m1 : int = prim::Constant[value=-1]()
  %b : int = aten::size(%x, %c0)
  %n : int = aten::mul(%b, %c2)
  %s1 : int[] = prim::ListConstruct(%n, %m1)
  %s2 : int[] = prim::ListConstruct(%b, %m1)
  %s3 : int[] = prim::ListConstruct(%n, %m1)
  %u : Tensor = aten::reshape(%x, %s1)
  %v : Tensor = aten::reshape(%y, %s2)
  %w : Tensor = aten::reshape(%y, %s3)
  %t : (Tensor, Tensor, Tensor) = prim::TupleConstruct(%u, %v, %w)
  return (%t)
""")
    # %b has two users (mul, s2), %n two (s1, s3): one more copy of each, and the copy of
    # mul needs its own size.
    assert _C.duplicate_shape_arithmetic(graph) == 3
    text = str(graph)
    FileCheck().check_count("aten::size(", 3, exactly=True).check_not("aten::size(").run(text)
    FileCheck().check_count("aten::mul(", 2, exactly=True).run(text)
    for node in graph.nodes():
        if node.kind() in ("aten::size", "aten::mul"):
            assert len(node.output().uses()) == 1, text
    fn = torch._C._create_function_from_graph("f", graph)
    x, y = torch.randn(3, 4), torch.randn(6, 2)
    u, v, w = fn(x, y)
    assert u.shape == (6, 2) and v.shape == (3, 4) and w.shape == (6, 2)


def test_only_arithmetic_on_sizes_and_constants_counts():
    graph = torch._C.parse_ir("""
graph(%x : Tensor, %k : int):
  %c0 : int = prim::Constant[value=0]()
  %b : int = aten::size(%x, %c0)
  %n : int = aten::mul(%b, %k)
  %p : int = aten::add(%n, %n)
  return (%p)
""")
    nodes = {n.kind(): n for n in graph.nodes()}
    assert _C.is_shape_arithmetic(nodes["aten::size"])
    assert not _C.is_shape_arithmetic(nodes["aten::mul"])     # %k is an input, not a size
    assert not _C.is_shape_arithmetic(nodes["aten::add"])
    assert _C.duplicate_shape_arithmetic(graph) == 0


def test_floats_of_sizes_count_when_torch_mlir_lowers_them():
    graph = torch._C.parse_ir("""
graph(%x : Tensor):
  %c1 : int = prim::Constant[value=-1]()
  %one : float = prim::Constant[value=1.]()
  %half : float = prim::Constant[value=-0.5]()
  %d : int = aten::size(%x, %c1)
  %r : float = aten::sqrt(%d)
  %s : float = aten::div(%one, %r)
  %p : float = aten::pow(%d, %half)
  %t : (float, float) = prim::TupleConstruct(%s, %p)
  return (%t)
""")
    nodes = {n.kind(): n for n in graph.nodes()}
    assert _C.is_shape_arithmetic(nodes["aten::sqrt"])
    assert _C.is_shape_arithmetic(nodes["aten::div"])
    assert not _C.is_shape_arithmetic(nodes["aten::pow"])   # no Torch-MLIR lowering
    # %d has two users, sqrt and pow: the second gets a size of its own.
    assert _C.duplicate_shape_arithmetic(graph) == 1
