"""The FileCheck-style matcher the per-pass tests rely on: each kind of check can fail."""
import pytest

from ir_runner import CHECK_LINE, file_check

OUTPUT = "a b\nc d\ne f\n"


@pytest.mark.parametrize("checks, holds", [
    ("// CHECK: a\n// CHECK-SAME: b\n// CHECK-NEXT: c", True),
    ("// CHECK: a\n// CHECK-NEXT: e", False),
    ("// CHECK: c\n// CHECK-SAME: b", False),
    ("// CHECK: a\n// CHECK-NOT: c\n// CHECK: e", False),
    ("// CHECK: a\n// CHECK-NOT: x\n// CHECK: e", True),
    ("// CHECK: e\n// CHECK-NOT: a", True),
    ("// CHECK: {{[a-c]}} {{.}}\n// CHECK-COUNT-2: {{[ce]}}", True),
    ("// CHECK-COUNT-4: {{[a-z]}} {{[a-z]}}", False),
    ("// CHECK: a.b", False),  # outside {{ }} a pattern is literal
    ("// CHECK: [[X:[a-z]]] b\n// CHECK: [[X]] f", False),   # a, then "a f": absent
    ("// CHECK: [[X:[a-z]]] f\n// CHECK-NOT: [[X]] b", True),
    ("// CHECK: [[X:[a-z]]] d\n// CHECK-NEXT: e f", True),
])
def test_checks(checks, holds):
    if holds:
        file_check(CHECK_LINE.findall(checks), OUTPUT)
    else:
        with pytest.raises(AssertionError):
            file_check(CHECK_LINE.findall(checks), OUTPUT)


@pytest.mark.parametrize("absent, holds", [
    ("x", True),
    ("c", False),   # between the matches
    ("f", False),   # after the last
    ("a", True),    # inside a match is no place between matches
])
def test_implicit_check_not_is_checked_around_every_check(absent, holds):
    checks = CHECK_LINE.findall("// CHECK: a\n// CHECK: e")
    if holds:
        file_check(checks, OUTPUT, implicit_not=[absent])
    else:
        with pytest.raises(AssertionError):
            file_check(checks, OUTPUT, implicit_not=[absent])
