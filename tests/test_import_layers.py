"""The package's imports form no cycle, deferred (in-function) imports included: an import of quantkit.a in
quantkit.b puts b above a, so each module can be read and tested on top of the ones below it."""

from __future__ import annotations

import ast
from pathlib import Path

import quantkit

ROOT = Path(quantkit.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """quantkit modules imported by the file at ``path``, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quantkit"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("quantkit")]
        out |= {n for n in names if n in known}
    return out


def test_imports_have_no_cycle():
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    graph = {m: _imports(p, known) - {m} for m, p in files.items()}
    # a package's __init__ importing its own submodules is how a package exposes them, not a layer inversion
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
