"""Dynamic shapes: which dimensions of the example inputs may vary, and example inputs
resized along them.

An engine compiled with symbolic dimensions serves every size of those dims. Which dims
may vary is found, not guessed: the model is run on copies of the inputs resized along
some dims. Dims equal in the example are candidates to vary together, split by where
they are (`_split_by_need`): the dims at one index of the inputs the model takes resized
alone get a symbol of their own (a square image's height and width, a batch equal to the
channels or to the length), dims it takes only together share one (a length at dim 1 of
an input and dim 3 of its mask), and a dim taken neither way stays static (a hidden size
that meets a weight). Size-1 dims are never probed (they broadcast).

Resized copies repeat the original's slices cyclically (`index_select` with `i % n`), so
token ids stay valid ids and masks stay masks. `materialize_types` then runs the graph on
the example inputs and on copies with every dynamic group resized (to distinct sizes,
see `resized_variants`), and the dims whose sizes differed become shape symbols.
"""
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

Dim = Tuple[int, int]  # (input position, dim)


class DynamicShapesWarning(UserWarning):
    """optimize's warning that the example inputs cannot tell how some dims vary (a size-1
    dim kept static, equal dims tied): which dims, and the fix."""


@dataclass
class DynamicGroup:
    size: int           # the dims' size in the example inputs
    dims: List[Dim]


def resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    index = torch.arange(size) % t.shape[dim]
    return t.index_select(dim, index)


def with_groups_resized(inputs: Tuple, groups: List[DynamicGroup],
                        sizes: Optional[List[int]] = None) -> Tuple:
    """A copy of `inputs` where group k's dims have size `sizes[k]` (`size + k + 1` by
    default)."""
    result = list(inputs)
    for k, group in enumerate(groups):
        size = group.size + k + 1 if sizes is None else sizes[k]
        for position, dim in group.dims:
            result[position] = resized(result[position], dim, size)
    return tuple(result)


def _doubled_sizes(groups: List[DynamicGroup]) -> List[int]:
    return [2 * g.size + k + 3 for k, g in enumerate(groups)]


def _new_sizes(groups: List[DynamicGroup], sizes: List[int]) -> bool:
    """Whether `sizes` are none of the example's nor the first variant's."""
    return not any(size in (g.size, g.size + k + 1)
                   for k, (g, size) in enumerate(zip(groups, sizes)))


def untried_variants(inputs: Tuple, groups: List[DynamicGroup]) -> List[Tuple]:
    """resized_variants's answer when the model takes the doubled sizes, without running
    it there first: materialize_types runs every variant anyway, so a compile tries these
    and goes back to resized_variants only if that run fails (a doubled sequence length
    costs a run of the model, a sizeable part of a dynamic compile)."""
    variants = [with_groups_resized(inputs, groups)]
    doubled = _doubled_sizes(groups)
    if _new_sizes(groups, doubled):
        variants.append(with_groups_resized(inputs, groups, doubled))
    return variants


def resized_variants(run: Callable[[Tuple], object], inputs: Tuple,
                     groups: List[DynamicGroup]) -> List[Tuple]:
    """Copies of `inputs` with every dynamic group resized, for materialize_types: a dim of
    an intermediate or output whose size is the example's in all of them stays static.
    One variant grows each group a little (`size + k + 1`, as find_dynamic_groups ran it),
    but sizes computed through strides and pooling can round back to the example's (12 and
    14 both give 3 after a stride-2 convolution and a 2x2 pool, and a static 3 would be a
    wrong shape for other sizes). So a second variant about doubles each group
    (`2 * size + k + 3`), which changes such a size for any stride up to the example's
    size; if the model refuses that, about halves it (`size // 2 + k + 1`) if that is
    another size."""
    variants = [with_groups_resized(inputs, groups)]
    for sizes in (_doubled_sizes(groups), [g.size // 2 + k + 1 for k, g in enumerate(groups)]):
        if not _new_sizes(groups, sizes):
            continue
        candidate = with_groups_resized(inputs, groups, sizes)
        try:
            run(candidate)
        except Exception:  # the model does not take these sizes: try the next variant
            continue
        variants.append(candidate)
        break
    return variants


def _takes(run: Callable[[Tuple], object], inputs: Tuple, groups: List[DynamicGroup],
           sizes: Optional[List[int]] = None) -> bool:
    """Whether the model runs on `inputs` with `groups` resized (see with_groups_resized)."""
    try:
        run(with_groups_resized(inputs, groups, sizes))
    except Exception:  # the model needs these dims at another size
        return False
    return True


def _groups_by_size(dims: List[Dim], inputs: Tuple) -> List[DynamicGroup]:
    groups: Dict[int, DynamicGroup] = {}
    for position, dim in dims:
        size = inputs[position].shape[dim]
        groups.setdefault(size, DynamicGroup(size, [])).dims.append((position, dim))
    return [groups[size] for size in sorted(groups)]


def _split_by_need(run: Callable[[Tuple], object], inputs: Tuple,
                   group: DynamicGroup) -> List[DynamicGroup]:
    """The dims of `group` (equal in the example) split into the groups the model takes
    resized apart. They are split by position: the dims at one index of their inputs (the
    batch of an input and of its mask, dim 0 of both) are a class, and each class the
    model takes resized alone varies alone (a square image's height and width, a batch
    equal to the channels or to the length). The classes it does not take alone are
    tried together (a length at dim 1 of one input and dim 3 of its mask), else stay
    static. Dims at one index stay together: whether the model needs them equal cannot
    be probed (PyTorch's CPU attention takes keys and values of different lengths). The
    split is kept only if the model takes all its groups resized at once; else the
    group as the example has it, if the model takes that resized."""
    def taken(dims) -> bool:
        return _takes(run, inputs, [DynamicGroup(group.size, list(dims))])

    classes: Dict[int, List[Dim]] = {}
    for position, dim in group.dims:
        classes.setdefault(dim, []).append((position, dim))
    if len(classes) == 1:
        return [group] if taken(group.dims) else []
    split, rest = [], []
    for dims in classes.values():
        (split if taken(dims) else rest).append(dims)
    together = [d for dims in rest for d in dims]
    if len(rest) > 1 and taken(together):
        split.append(together)
    split = [DynamicGroup(group.size, sorted(dims)) for dims in split]
    if len(split) > 1:
        try:
            run(with_groups_resized(inputs, split))
        except Exception:  # not all at once: the example's grouping
            return [group] if taken(group.dims) else split[:1]
    return split


def _explicit_dims(dynamic_dims: Dict[int, List[int]], inputs: Tuple) -> List[Dim]:
    dims = []
    for position, wanted in sorted(dynamic_dims.items()):
        if not 0 <= position < len(inputs) or not isinstance(inputs[position], torch.Tensor):
            raise ValueError(f"Config.dynamic_dims names input {position}, but the model's "
                             f"input {position} is not a tensor among the "
                             f"{len(inputs)} example inputs")
        rank = inputs[position].dim()
        for dim in wanted:
            if not -rank <= dim < rank:
                raise ValueError(f"Config.dynamic_dims names dim {dim} of input {position}, "
                                 f"which has rank {rank}")
            dims.append((position, dim % rank))
    return dims


def find_dynamic_groups(run: Callable[[Tuple], object], inputs: Tuple,
                        dynamic_dims=None) -> List[DynamicGroup]:
    """The groups of input dims that may vary. `run(inputs)` runs the model.

    With `dynamic_dims` ({input position: [dims]}), exactly those, grouped by size; the
    model must accept them resized, or this raises naming them. Without, every group of
    equally sized dims (size > 1) that the model accepts resized.

    Example:
        >>> groups = find_dynamic_groups(lambda xs: model(*xs), (x, mask))
    """
    if dynamic_dims:
        groups = _groups_by_size(_explicit_dims(dynamic_dims, inputs), inputs)
        split = [g for group in groups for g in _split_by_need(run, inputs, group)]
        if sorted(d for g in split for d in g.dims) == sorted(d for g in groups for d in g.dims):
            groups = split  # else a named dim the model refuses: the check below says so
        try:
            run(with_groups_resized(inputs, groups))
        except Exception as e:
            names = ", ".join(f"dim {d} of input {p}" for g in groups for p, d in g.dims)
            raise ValueError(f"blade.optimize: Config.dynamic_dims says {names} may vary, but "
                             "the model fails on inputs resized along them: "
                             f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
        return groups
    candidates = [(position, dim) for position, t in enumerate(inputs)
                  if isinstance(t, torch.Tensor) for dim in range(t.dim()) if t.shape[dim] > 1]
    accepted = []
    for group in _groups_by_size(candidates, inputs):
        accepted.extend(_split_by_need(run, inputs, group))
    if len(accepted) > 1:
        try:
            run(with_groups_resized(inputs, accepted))
        except Exception:  # each varies alone, not together: keep the first only
            accepted = accepted[:1]
    return accepted


@dataclass
class UndecidedDims:
    """Dims whose grouping the example inputs cannot settle. `kind` "size one": a size-1
    dim, kept static (it may be a broadcast), that the model also runs at size 2. `kind`
    "tied": dims at one index of several inputs, equal in the example and sharing a symbol,
    that the model also runs resized apart (whether it needs them equal cannot be probed:
    PyTorch's CPU attention takes keys and values of different lengths)."""
    kind: str
    dims: List[Dim]


def undecided_dims(run: Callable[[Tuple], object], inputs: Tuple,
                   groups: List[DynamicGroup], dynamic_dims=None) -> List[UndecidedDims]:
    """What the example inputs cannot tell about `groups` (find_dynamic_groups' answer),
    probed with one run per case, for `optimize` to say. Size-1 dims are looked at only
    when no `dynamic_dims` names the dims."""
    def taken(resize: List[Tuple[List[Dim], int]]) -> bool:
        return _takes(run, inputs, [DynamicGroup(0, dims) for dims, _ in resize],
                      [size for _, size in resize])

    undecided = []
    if not dynamic_dims:
        ones: Dict[int, List[Dim]] = {}
        for position, t in enumerate(inputs):
            if isinstance(t, torch.Tensor):
                for dim in range(t.dim()):
                    if t.shape[dim] == 1:
                        ones.setdefault(dim, []).append((position, dim))
        undecided += [UndecidedDims("size one", dims) for _, dims in sorted(ones.items())
                      if taken([(dims, 2)])]
    for group in groups:
        classes: Dict[int, List[Dim]] = {}
        for position, dim in group.dims:
            classes.setdefault(dim, []).append((position, dim))
        for dims in classes.values():
            # Apart: the first input's dim one size up, the others' as in the example.
            if len(dims) > 1 and taken([(dims[:1], group.size + 1)]):
                undecided.append(UndecidedDims("tied", dims))
    return undecided

