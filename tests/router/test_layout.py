"""The router's layout (``router/__init__.py``): imports run one way, and no module keeps state
keyed by a ``RouterState`` (``RouterState`` owns what the router holds)."""

from __future__ import annotations

import ast
from collections.abc import Container, Iterable, Mapping
from pathlib import Path

ROUTER = Path(__file__).resolve().parents[2] / "router"
# Higher imports lower, never the other way; equal ranks do not import each other.
RANK = {"cli": 9, "http": 8, "request": 7, "state": 6, "config": 5, "pd": 4, "coordination": 4,
        "cluster": 3, "economics": 3, "admission_ledger": 3, "routing": 2, "keying": 1,
        "transport": 1, "metrics": 0}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "router" and len(parts) > 1 else None


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    found += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return [m for m in found if m.startswith("router.")]


def test_every_part_has_a_rank():
    parts = {p.stem if p.is_file() else p.name for p in ROUTER.iterdir()
             if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert parts == set(RANK)


def test_imports_run_one_way():
    upward = []
    for path in ROUTER.rglob("*.py"):
        rel = path.relative_to(ROUTER.parent).with_suffix("")
        src = _part(".".join(rel.parts))
        if src is None:
            continue
        for module in _imports(path):
            dst = _part(module)
            if dst is not None and dst != src and RANK[dst] >= RANK[src]:
                upward.append(f"{rel} imports {module}")
    assert upward == []


def test_no_module_level_state_keyed_by_router_state():
    offenders = [str(p.relative_to(ROUTER)) for p in ROUTER.rglob("*.py")
                 if "WeakKeyDictionary" in p.read_text()]
    assert offenders == []


# --- no import cycle anywhere in the project's own packages ------------------------------------

ROOT = ROUTER.parent
PACKAGES = ("benchmarks", "radix_global", "radix_global_cli", "radix_global_tools", "router",
            "sglang_patch")
# Cycles known and not yet broken, each a sorted tuple of modules (none today: issue 40 broke the
# last one). A cycle not listed here fails the test, and so does one listed that is gone.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _resolve(name: str, modules: Container[str]) -> str | None:
    """The longest leading part of dotted ``name`` that is a project module (None if none)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from ``{module: (source, is_package)}``.

    Every ``import``/``from ... import`` statement counts wherever it stands: at module level,
    inside a function (a deferred import still runs when the function does, so a cycle hidden
    that way is still a cycle) and under ``if TYPE_CHECKING:`` (it does not run, but the module
    still cannot be read or type-checked without the other one; the cycle issue 40 names,
    ``router.pd.orchestrator`` <-> ``router.pd.run``, was exactly such an import). Relative
    imports are resolved; ``from pkg import name`` is an import of ``pkg.name`` when that is a
    module, else of ``pkg``. An import is an edge to the module it names, not to the packages
    above it (their ``__init__`` runs too, but counting that would tie every package to its
    children). Imports of anything outside ``sources`` are left out."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        package = module if is_package else module.rpartition(".")[0]
        edges: set[str | None] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                edges.update(_resolve(a.name, sources) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    edges.add(target if target in sources else _resolve(base, sources))
        graph[module] = {e for e in edges if e is not None and e != module}
    return graph


def import_cycles(graph: Mapping[str, Iterable[str]]) -> set[tuple[str, ...]]:
    """Every import cycle of ``graph``: its strongly connected components of more than one
    module (or of one importing itself), each as a sorted tuple (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: set[tuple[str, ...]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.add(tuple(sorted(component)))
    return cycles


def test_cycle_finder_reports_planted_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": set(), "f": {"f"},
             "g": {"h"}, "h": {"g", "a"}}
    assert import_cycles(graph) == {("a", "b", "c"), ("f",), ("g", "h")}
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == set()


def test_import_graph_reads_every_kind_of_import():
    sources = {
        "p": ("", True),
        "p.a": ("from . import b\nfrom .b import thing\n", False),
        "p.b": ("def f():\n    import p.c.d\n", False),
        "p.c": ("", True),
        "p.c.d": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from ..a import x\nimport os\n", False),
        "p.e": ("from p import a, VALUE\nimport p.c.missing\n", False),
    }
    assert import_graph(sources) == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.c.d"}, "p.c": set(),
                                     "p.c.d": {"p.a"}, "p.e": {"p", "p.a", "p.c"}}
    assert import_cycles(import_graph(sources)) == {("p.a", "p.b", "p.c.d")}


def test_no_import_cycle():
    modules = _project_modules()
    sources = {m: (p.read_text(), p.name == "__init__.py") for m, p in modules.items()}
    graph = import_graph(sources)
    found = import_cycles(graph)
    report = [", ".join(c) + ":\n    " + "\n    ".join(
        f"{m} imports {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in sorted(found)]
    assert found == KNOWN_CYCLES, "import cycles:\n" + "\n".join(report)
