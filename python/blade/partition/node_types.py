"""Hashable keys for the types of TorchScript values: what tells two nodes of one op apart
when the registry caches an answer (blade.partition.torch_mlir_probe) or the clustering
refuses a failing node's twins (blade.partition.clustering)."""
import torch


def type_key(value: torch._C.Value):
    """What a value's type is, as a hashable key: a tensor's dtype, sizes (dynamic ones as
    their shape symbols) and device; another type's name. (str() of a TensorType says only
    "Tensor".)"""
    t = value.type()
    if isinstance(t, torch._C.TensorType):
        sizes = t.symbolic_sizes()
        return (t.scalarType(), tuple(sizes) if sizes is not None else None, str(t.device()))
    return str(t)
