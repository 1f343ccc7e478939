"""Runs of the user's model that leave no trace: a private copy of the inputs for each run,
and the module's tensors and the random generators as they were found. A leaf."""
import contextlib
import itertools
import random
import sys

import torch


def private_copy(value):
    """`value` with every tensor in it, inside tuples, lists and dicts too, replaced by a
    copy of its own (same values and requires_grad; a dense tensor keeps its strides):
    what `optimize` runs the model on, so that a model writing into its inputs
    (`x.add_(1)`) leaves the caller's example inputs as they were.

    Example:
        >>> xs = private_copy((x, {"mask": mask}))
    """
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_() if value.requires_grad else copy
    if isinstance(value, tuple):
        items = [private_copy(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [private_copy(item) for item in value]
    if isinstance(value, dict):
        return {key: private_copy(item) for key, item in value.items()}
    return value


@contextlib.contextmanager
def preserved_module_state(module):
    """The module's buffers and parameters as they were before the block, whether forward
    wrote into them or assigned new ones: the runs of the model that optimize makes (to
    record types, to check engines) leave no trace in it. Nothing for a model that is no
    nn.Module."""
    saved = []
    if isinstance(module, torch.nn.Module):
        for name, tensor in itertools.chain(module.named_buffers(), module.named_parameters()):
            path, _, attribute = name.rpartition(".")
            owner = module.get_submodule(path) if path else module
            saved.append((owner, attribute, tensor, tensor.detach().clone()))
    try:
        yield
    finally:
        for owner, attribute, tensor, values in saved:
            if getattr(owner, attribute) is not tensor:
                setattr(owner, attribute, tensor)
            with torch.no_grad():
                tensor.copy_(values)


@contextlib.contextmanager
def preserved_random_state():
    """Running the model draws from the global random generators (`torch.rand_like` in
    forward, Python's `random` in a traced forward); `optimize` gives them back as it found
    them on every exit, so `torch.manual_seed(0); blade.optimize(...); torch.rand(3)` draws
    what it draws without `optimize`. numpy's generator is kept when numpy is loaded."""
    torch_state = torch.random.get_rng_state()
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)
