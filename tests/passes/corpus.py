"""Scripted modules full of Python structure, for the simplification passes.

Each entry: (module, example inputs, the share of tensor ops that must end up compiled).
The shares are what the passes achieve; a change that lowers one is a regression.
"""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F


class LayerList(torch.nn.Module):
    """A ModuleList walked by a for loop."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _stats(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return x.mean(dim=-1, keepdim=True), x.var(dim=-1, keepdim=True)


class TupleHelper(torch.nn.Module):
    """A helper returning a tuple, unpacked; and a tuple indexed."""

    def forward(self, x):
        mean, var = _stats(x)
        pair = (x - mean, var + 1e-5)
        return pair[0] / torch.sqrt(pair[1])


class DictFeatures(torch.nn.Module):
    """A dict of tensors built and read with constant keys."""

    def forward(self, x):
        features: Dict[str, torch.Tensor] = {"scaled": x * 2.0, "shifted": x + 1.0}
        features["gated"] = torch.sigmoid(features["scaled"])
        return features["gated"] * features["shifted"]


class SizeReshape(torch.nn.Module):
    """Heads split with sizes read from the input."""

    def forward(self, x):
        b, s, h = x.size()
        heads = x.view(b, s, 4, h // 4).transpose(1, 2)
        return (heads * heads.sum(dim=-1, keepdim=True)).transpose(1, 2).reshape(b, s, h)


class HfAttentionShape(torch.nn.Module):
    """`x.size()[:-1] + (heads, dim)`, as Hugging Face attention layers write it."""

    def __init__(self):
        super().__init__()
        self.heads, self.dim = 4, 8
        self.qkv = torch.nn.Linear(32, 96)

    def split_heads(self, x):
        new_shape = x.size()[:-1] + (self.heads, self.dim)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.qkv(x).split(32, dim=-1)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        scores = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        out = (scores @ v).permute(0, 2, 1, 3).contiguous()
        return out.view(out.size()[:-2] + (self.heads * self.dim,))


class ConstantLoop(torch.nn.Module):
    """A loop with a constant trip count using its induction variable."""

    def forward(self, x):
        for i in range(3):
            x = torch.tanh(x * 2.0 + float(i))
        return x


class ListAppend(torch.nn.Module):
    """A list built by append in a constant loop, then stacked."""

    def forward(self, x):
        outs: List[torch.Tensor] = []
        for i in range(4):
            outs.append(x[:, i] * float(i + 1))
        return torch.stack(outs, dim=1).sum(dim=1)


class InPlaceChain(torch.nn.Module):
    """In-place arithmetic on a fresh tensor."""

    def forward(self, x):
        y = x * 1.5
        y.add_(1.0)
        y.mul_(x)
        y = torch.relu_(y)
        return y - x


class SliceWrite(torch.nn.Module):
    """A write into a slice of a fresh tensor: `y[:, :2] = 0`."""

    def forward(self, x):
        y = x * 2.0
        y[:, :2] = 0.0
        return torch.sigmoid(y) + x


class SelectWrite(torch.nn.Module):
    """A row overwritten from another row."""

    def forward(self, x):
        y = torch.exp(x)
        y[0] = y[1] * 3.0
        return y / y.sum(dim=0, keepdim=True)


class ShapeIf(torch.nn.Module):
    """A branch on the input's shape, constant once shapes are known."""

    def forward(self, x):
        if x.size(0) > 2:
            x = x * 2.0
        else:
            x = x - 2.0
        if x.dim() == 2:
            x = F.gelu(x)
        return x + 1.0


class DropoutBlock(torch.nn.Module):
    """Dropout layers, no-ops at inference."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(torch.relu(self.fc(self.drop(x)))) + F.dropout(x, 0.2, self.training)


class RaiseGuard(torch.nn.Module):
    """Argument checks that raise, decided by the input's rank."""

    def forward(self, x):
        if x.dim() != 3:
            raise ValueError("expected a 3-d input")
        if x.size(-1) % 2 != 0:
            raise ValueError("the last dim must be even")
        return torch.tanh(x) * x.shape[-1]


class ChunkLoop(torch.nn.Module):
    """Chunks summed by a loop over the chunk list."""

    def forward(self, x):
        parts = x.chunk(4, dim=-1)
        total = parts[0]
        for p in parts[1:]:
            total = total + p * 0.5
        return total * len(parts)


class OptionalMask(torch.nn.Module):
    """An optional argument, None or not."""

    def forward(self, x, mask: Optional[torch.Tensor] = None):
        scores = x @ x.transpose(-1, -2)
        if mask is not None:
            scores = scores + mask
        return torch.softmax(scores, dim=-1)


class ListOfShapes(torch.nn.Module):
    """Shapes handled as lists: indexing, len and a list comprehension."""

    def forward(self, x):
        dims = list(x.shape)
        new = [d * 1 for d in dims[:-1]] + [dims[-1] // 2, 2]
        y = x.reshape(new)
        return y.sum(dim=len(new) - 1) * y.amax(dim=-1)


class NumelReshape(torch.nn.Module):
    """Rows counted with numel(), scaled by the rank."""

    def forward(self, x):
        rows = x.numel() // x.size(-1)
        return torch.tanh(x.reshape(rows, x.size(-1))) * x.dim()


def corpus():
    """name -> (module, inputs, minimum compiled share)."""
    torch.manual_seed(0)
    return {
        "layer_list": (LayerList(), (torch.randn(4, 16),), 1.0),
        "tuple_helper": (TupleHelper(), (torch.randn(4, 16),), 1.0),
        "dict_features": (DictFeatures(), (torch.randn(4, 16),), 1.0),
        "size_reshape": (SizeReshape(), (torch.randn(2, 5, 16),), 1.0),
        "hf_attention_shape": (HfAttentionShape(), (torch.randn(2, 6, 32),), 1.0),
        "constant_loop": (ConstantLoop(), (torch.randn(4, 16),), 1.0),
        "list_append": (ListAppend(), (torch.randn(3, 4, 5),), 1.0),
        "in_place_chain": (InPlaceChain(), (torch.randn(4, 16),), 1.0),
        "slice_write": (SliceWrite(), (torch.randn(4, 6),), 1.0),
        "select_write": (SelectWrite(), (torch.randn(4, 6),), 1.0),
        "shape_if": (ShapeIf(), (torch.randn(4, 6),), 1.0),
        "dropout_block": (DropoutBlock(), (torch.randn(4, 16),), 1.0),
        "raise_guard": (RaiseGuard(), (torch.randn(2, 3, 8),), 1.0),
        "chunk_loop": (ChunkLoop(), (torch.randn(3, 16),), 1.0),
        # The mask is None in the example: the graph is specialized to that (`if mask is not
        # None` folds away) and a call with a mask runs the unspecialized model.
        "optional_mask_none": (OptionalMask(), (torch.randn(2, 4, 8),), 1.0),
        "optional_mask_given": (OptionalMask(), (torch.randn(2, 4, 8), torch.randn(2, 4, 4)),
                                1.0),
        "list_of_shapes": (ListOfShapes(), (torch.randn(3, 4, 8),), 1.0),
        "numel_reshape": (NumelReshape(), (torch.randn(2, 3, 4),), 1.0),
    }
