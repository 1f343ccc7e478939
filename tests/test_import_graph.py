"""The package's modules import each other without cycles (function-level imports count
too): each stage builds on the ones below it."""
import ast
from pathlib import Path

import blade

PACKAGE = Path(blade.__file__).resolve().parent


def module_imports():
    """module name -> the blade modules it imports (at any level of its code)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(kept + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules or full.endswith("._C") else base)
        edges[name] = set()
        for target in targets:
            if target.endswith("._C"):  # the extension module imports no Python
                continue
            while target and target not in modules:  # an attribute: its module
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != name:
                edges[name].add(target)
    return edges


def find_cycle(edges):
    state = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(edges):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    edges = module_imports()
    assert "blade.compiler" in edges and "blade.codegen.pipeline" in edges
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_a_cycle_would_be_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
