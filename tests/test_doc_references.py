"""Docs true to the code (issue 40): what the sources and docs cite must exist.

- ``docs/interfaces.md`` is cited by section NAME (``docs/interfaces.md``, "Worker registration"),
  never by number: numbers change whenever a section moves. A cited name must be a heading's
  (its title without the number and the parenthesised file list).
- A repository path named anywhere in a ``*.py``, ``*.md``, ``*.sh``, ``*.toml`` or Makefile
  (a top-level folder of this repository, then a file with an extension) must exist.

Outside the check: ``build/``, hidden folders (``.venv*``, ``.git``), ``CHANGELOG.md`` (history
names what was true then), ``benchmarks/results/`` (run outputs, not committed) and this file.
Pure file reading, well under a second.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERFACES = ROOT / "docs" / "interfaces.md"

TOP_LEVEL = ("benchmarks", "tests", "docs", "router", "radix_global", "radix_global_tools",
             "radix_global_cli", "sglang_patch", "scripts")
SKIP_DIRS = {"build", "node_modules", "__pycache__"}
SKIP_FILES = {"CHANGELOG.md"}
SELF = Path(__file__).resolve()  # its patterns and KNOWN are what it looks for
SKIP_PREFIXES = ("benchmarks/results/",)
SUFFIXES = (".py", ".md", ".sh", ".toml")

# Paths in other repositories, named as such where they are cited.
EXTERNAL = {
    "docs/source/api-reference/http/conductor-indexer.md",  # kvcache-ai/Mooncake
}
# Findings (file, the offending text) known and not yet fixed (none today). A finding not listed
# here fails, and so does an entry that no longer is found (remove it then).
KNOWN: set[tuple[str, str]] = set()

# "interfaces.md s. 15", "``docs/interfaces.md`` section 12", "interfaces.md, § 3", split over lines
CITED_BY_NUMBER = re.compile(
    r"interfaces(?:\.md)?[`'\"]*[,:;]?[\s#]*(?:s\.|§|sections?\b)\s?\d+")
# a bare "(s. 15)" / "section 2", in the files where it can only mean interfaces.md's sections:
# the Python sources (their comments) and interfaces.md itself
BARE_NUMBER = re.compile(r"(?<![\w/.\-])(?<!\d\s)(?:s\.|§)\s?\d+|\bsections?\s\d+\b")
# ``docs/interfaces.md``, "Name" / docs/interfaces.md section "Name" (the first name cited)
CITED_NAME = re.compile(
    r"interfaces\.md[`']*,?[\s#]*\(?(?:sections?[\s#]+)?\\?\"((?:[^\"\\]|\\[^\"])+)")
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(TOP_LEVEL) + r")/[\w./-]*\.[A-Za-z]\w*)")


def section_names(text: str) -> list[str]:
    """interfaces.md's section names: each ``## N. Title (files)`` heading's title, without the
    number and without any parenthesised part."""
    names = []
    for m in re.finditer(r"^## \d+\.\s+(.*)$", text, re.M):
        names.append(_spaces(re.sub(r"\s*\([^()]*\)", "", m.group(1))))
    return names


def _spaces(text: str) -> str:
    return " ".join(text.split())


def _source_files() -> Iterator[tuple[str, Path]]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                         and not d.endswith(".egg-info"))
        for name in sorted(files):
            if not (name.endswith(SUFFIXES) or name == "Makefile") or name in SKIP_FILES:
                continue
            path = Path(folder, name)
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(SKIP_PREFIXES) and path != SELF:
                yield rel, path


def findings(rel: str, text: str, names: list[str],
             exists: Callable[[str], bool] | None = None) -> list[tuple[str, str, str]]:
    """Every problem of one file's ``text``: (file, the offending text, what is wrong).
    ``exists``: a path test (default: the file is in this repository)."""
    exists_fn = exists or (lambda p: (ROOT / p).exists())
    out: list[tuple[str, str, str]] = []
    for m in CITED_BY_NUMBER.finditer(text):
        out.append((rel, m.group(0), "cites docs/interfaces.md by section number"))
    if rel.endswith(".py") or rel == "docs/interfaces.md":
        for m in BARE_NUMBER.finditer(text):
            out.append((rel, m.group(0), "cites a section by number"))
    for m in CITED_NAME.finditer(text):
        cited = _spaces(re.sub(r"\n\s*#", " ", m.group(1)).replace("\\", ""))
        # a name split between two string literals ends at the first: a heading's beginning
        if not any(name == cited or name.startswith(cited.rstrip()) for name in names):
            out.append((rel, cited, "names no section of docs/interfaces.md"))
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if path.startswith(SKIP_PREFIXES) or path in EXTERNAL or exists_fn(path):
            continue
        out.append((rel, path, "names a repository path that does not exist"))
    return out


def test_doc_references() -> None:
    names = section_names(INTERFACES.read_text())
    assert len(names) >= 20, names
    found = []
    for rel, path in _source_files():
        found += findings(rel, path.read_text(errors="replace"), names)
    new = sorted(f for f in found if f[:2] not in KNOWN)
    gone = sorted(KNOWN - {f[:2] for f in found})
    assert not new, "stale doc references:\n" + "\n".join(f"{r}: {t!r}: {w}" for r, t, w in new)
    assert not gone, f"fixed, remove from KNOWN: {gone}"


def test_the_checks_catch_planted_references() -> None:
    """The negative control: each kind of bad reference is found, the good forms are not."""
    names = ["Worker registration", "Shared platform prefixes across isolated tenants"]
    doc = "docs/" + "interfaces.md"
    bad = {
        f"see ``{doc}`` s" + ". 15 for it": "section number",
        f"# ({doc}\n# sect" + "ion 2): more": "section number",
        f"({doc}, \"Shared prefixes\")": "names no section",
        "moved: ``benchmarks/netns_" + "thread.py``": "path that does not exist",
    }
    for text, what in bad.items():
        got = findings("x.md", text, names, exists=lambda p: False)
        assert [w for _, _, w in got if what in w], (text, got)
    assert findings("x.py", "# the pool (s" + ". 16)", names)
    good = (f"({doc}, \"Worker registration\"), ``{doc}`` section \"Shared platform "
            f"prefixes across isolated tenants\"; ({doc}, \"Shared platform \"\n"
            "\"prefixes across isolated tenants\"); 2 s. 0.5/s. the results in "
            "benchmarks/results/run.json")
    assert findings("x.py", good, names, exists=lambda p: p == doc) == []
