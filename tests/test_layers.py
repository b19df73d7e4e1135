"""The import graph of drift/ matches docs/internals.md: layers only import downwards and no
two files import each other, directly or around a cycle.

Every import counts: module level, inside functions (lazy), and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "drift"

# package -> the drift packages it may import (besides itself). "drift" is the package root
# (re-exported versions, lazy SDK names: for users, imported by no module); "paths" (the
# cache-dir rule), "metrics" (Prometheus text pieces), "openmp" (torch's OpenMP workers) and
# "waits" (a time limit that keeps cancellations) are leaf modules with no imports.
ALLOWED: dict[str, set[str]] = {
    "wire": set(),
    "identity": {"wire"},
    "swarm": {"wire", "identity", "waits"},
    "node": {"wire", "identity", "swarm", "waits"},
    "models": {"wire", "paths"},
    "server": {
        "wire",
        "identity",
        "swarm",
        "node",
        "models",
        "paths",
        "metrics",
        "openmp",
        "waits",
    },
    "client": {"wire", "identity", "swarm", "models", "paths", "openmp", "waits"},
    "api": {"wire", "swarm", "client", "models", "metrics"},
    "cli": {
        "wire",
        "identity",
        "swarm",
        "node",
        "models",
        "server",
        "client",
        "api",
        "paths",
        "openmp",
        "waits",
    },
    "paths": set(),
    "metrics": set(),
    "openmp": set(),
    "waits": set(),
    "drift": {"wire", "client"},  # drift/__init__.py: the version, lazy SDK names
}
# third-party imports a layer must not make (models run on any transport; wire and swarm
# stay importable without torch where they do not need it).
FORBIDDEN_THIRD_PARTY = {"models": {"aiohttp"}, "identity": {"torch", "aiohttp"}}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["drift", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, modules: dict[str, Path],
             face_value: bool = False) -> tuple[set[str], set[str]]:  # fmt: skip
    """(drift modules imported by `module`, top-level third-party packages it imports).
    `face_value`: `from pkg import sub` imports pkg (its __init__, which runs first) as written."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inner, outer = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import sub` imports pkg.sub; `from pkg import name` imports pkg itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules and not face_value
                     else base for a in node.names]  # fmt: skip
        for name in names:
            if name.startswith("drift"):
                target = _resolve(name, modules)
                if target and target != module:
                    inner.add(target)
            elif name:
                outer.add(name.split(".")[0])
    return inner, outer


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "drift"


def _graph(face_value: bool = False) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    modules = _modules()
    graph, third = {}, {}
    for module, path in modules.items():
        graph[module], third[module] = _imports(module, path, modules, face_value)
    return graph, third


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def _package_import(a: str, b: str) -> bool:
    """`a` importing its own package's __init__ (re-exports) is not a cycle through files."""
    return a.startswith(b + ".")


def test_no_import_cycles_between_files() -> None:
    graph, _ = _graph()
    files = {a: {b for b in bs if not _package_import(a, b)} for a, bs in graph.items()}
    assert _cycles(files) == []


def test_no_import_cycle_through_a_package_init() -> None:
    """`from drift.client import transport` in a module that drift/client/__init__.py reaches
    is a cycle through the package's __init__ (issue 34): import the module itself instead."""
    graph, _ = _graph(face_value=True)
    assert _cycles(graph) == []


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downwards(layer: str) -> None:
    graph, third = _graph()
    bad = []
    for module, targets in graph.items():
        if _layer(module) != layer:
            continue
        for target in targets:
            other = _layer(target)
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{module} imports {target}")
        for pkg in FORBIDDEN_THIRD_PARTY.get(layer, set()) & third[module]:
            bad.append(f"{module} imports {pkg}")
    assert bad == []


def test_the_graph_is_real() -> None:
    """The walk sees the imports (a test that cannot fail is a defect)."""
    graph, third = _graph()
    assert "drift.wire.errors" in graph["drift.client.remote"]
    assert "drift.swarm.reader" in graph["drift.client.swarm_view"]
    assert "torch" in third["drift.models.span"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
