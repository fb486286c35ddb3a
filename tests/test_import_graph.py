"""The packages' import graph, imports inside functions and under TYPE_CHECKING counted (read
from the source with ``ast``): no circle, and seer_kernels, the bottom layer, imports neither
of the other packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seer_kernels", "model_adapters", "seer_runtime")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _owner(name: str, mods) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join([*base, node.module] if node.module else base)
                subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [source, *subs]  # `from . import sub`
            for target in targets:
                owner = _owner(target, mods)
                if owner is not None and owner != mod:
                    graph[mod].add(owner)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layers():
    graph = import_graph()
    for mod, deps in graph.items():
        if mod.startswith("seer_kernels"):
            assert not [d for d in deps if not d.startswith("seer_kernels")], mod
