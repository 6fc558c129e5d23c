"""The router's layout (``router/__init__.py``): imports run one way, and no module keeps state
keyed by a ``RouterState`` (``RouterState`` owns what the router holds)."""

from __future__ import annotations

import ast
from pathlib import Path

ROUTER = Path(__file__).resolve().parents[2] / "router"
# Higher imports lower, never the other way; equal ranks do not import each other.
RANK = {"cli": 9, "http": 8, "request": 7, "state": 6, "config": 5, "pd": 4, "coordination": 4,
        "cluster": 3, "routing": 2, "keying": 1, "transport": 1, "metrics": 0}


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
