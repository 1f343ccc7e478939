"""`merge-identical-functions`: one copy of each function group that the module defines
more than once.

Outlining makes a function per parallel task (with its launcher and trampoline: a group,
see native.function_group), per library call and per serial loop nest, and a model's
repeated layers make many of them alike: ResNet-50's one cluster has 54 library-call
wrappers of 7 distinct bodies and 16 tasks of 6, and LLVM compiled each copy again (the
wrappers alone took 0.43 s of its 1.6 s of code generation). Two groups are identical
when their functions' text is, once the group's own symbols are named by their role
(`blade_task_#`, ...): same operations, types, attributes and constants, same callees
outside the group. Every use of a repeat's symbols (main's calls, a launcher's address of
its trampoline) is then made a use of the first group's, and the repeat's functions are
erased. What the code computes
is unchanged: each call reaches a function of the same text.

Example:
    >>> merge_identical_functions(module)   # returns the number of functions erased
"""
import re
from typing import Dict, List

from torch_mlir import ir

from blade.codegen.llvm.native import function_group, function_name


def _groups(module) -> Dict[str, List]:
    """The defined functions of each group other than main's, in module order."""
    found: Dict[str, List] = {}
    for op in module.body.operations:
        if op.operation.name != "llvm.func" or len(op.regions[0].blocks) == 0:
            continue
        name = function_name(op)
        group = function_group(name)
        if group == "main":
            continue
        # Library-call wrappers share a group for partitioning, but each one is a unit.
        found.setdefault(name if group == "library calls" else group, []).append(op)
    return found


# A symbol of a task group, library-call wrapper or serial loop: its role and its number.
_NUMBERED = re.compile(r"@(blade_(?:task|launch|trampoline|library_call|loop)_)(\d+)(?![\w$.])")


def _role(name: str) -> str:
    """`blade_task_3` -> `blade_task_#`: the name a group's own symbol has in its key."""
    return re.sub(r"\d+$", "#", name)


def _key(functions: List) -> str:
    """The group's text with its own symbols named by role, so that two groups of the same
    code have the same key."""
    names = {function_name(op) for op in functions}

    def by_role(match):
        return "@" + _role(match.group(1) + match.group(2)) \
            if match.group(1) + match.group(2) in names else match.group(0)

    # Printed in its own scope: printing an op nested in a module otherwise numbers the
    # values of the whole module first, for every function: quadratic in the module.
    return "\n".join(sorted(_NUMBERED.sub(by_role, op.operation.get_asm(use_local_scope=True))
                             for op in functions))


def merge_identical_functions(module) -> int:
    """Erases each function group identical to an earlier one, its uses redirected to
    that one's; returns how many functions were erased."""
    first: Dict[str, Dict[str, str]] = {}  # key -> role name -> the kept function's name
    renamed: Dict[str, str] = {}  # a repeat's function -> the kept one
    repeats = []
    for functions in _groups(module).values():
        key = _key(functions)
        roles = {_role(function_name(op)): function_name(op) for op in functions}
        kept = first.get(key)
        if kept is None:
            first[key] = roles
            continue
        renamed.update((name, kept[role]) for role, name in roles.items())
        repeats.extend(functions)
    if not repeats:
        return 0
    # A group's symbols are used by its own functions and by main's group (its calls of the
    # launchers and wrappers), whose ops are walked once (an LLVM function's blocks hold no
    # regions); a use left elsewhere fails the verifier.
    for op in module.body.operations:
        if op.operation.name != "llvm.func" or len(op.regions[0].blocks) == 0 or \
                function_group(function_name(op)) != "main":
            continue
        for block in op.regions[0].blocks:
            for inner in block.operations:
                name = inner.operation.name
                attribute = "callee" if name == "llvm.call" else \
                    "global_name" if name == "llvm.mlir.addressof" else None
                if attribute is None or attribute not in inner.attributes:
                    continue
                target = ir.FlatSymbolRefAttr(inner.attributes[attribute]).value
                if target in renamed:
                    inner.attributes[attribute] = ir.FlatSymbolRefAttr.get(renamed[target])
    for op in repeats:
        op.operation.erase()
    return len(repeats)
