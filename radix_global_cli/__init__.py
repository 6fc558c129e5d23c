"""The ``radix-global`` command: one subcommand per process kind, each a module's ``main(argv)``.

Subcommands are imported lazily so that the light router install never imports torch or sglang.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
from pathlib import Path

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "make-model": ("sglang_patch.make_model", "build the offline tiny test model and tokenizer"),
    "sglang": ("sglang_patch.launch_server", "start an SGLang server that joins radix-global"),
    "index": ("radix_global.service", "the standalone index service (gRPC): `index serve`"),
    "router": ("router.cli.main", "start the Conductor router"),
    "status": ("router.cli.status", "print the cluster at a glance"),
    "replay": ("benchmarks.replay", "replay a Mooncake-format trace against a router"),
    "cluster": ("benchmarks.cluster_up", "a cluster over test hosts (netns): `cluster up`"),
    "bench": ("benchmarks.bench", "side-by-side trace replay against peer routers"),
    "simulate": ("benchmarks.simulate.main", "paper-scale discrete-event simulation"),
}


def package_version() -> str:
    """The installed distribution's version; from a source tree that was never installed, the
    ``version`` of the ``pyproject.toml`` beside this package (no TOML parser needed)."""
    try:
        return importlib.metadata.version("radix-global")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
        except OSError:
            found = None
        return found.group(1) if found else "unknown"


def _usage() -> str:
    lines = ["usage: radix-global [--version] <command> [args...]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"radix-global {package_version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"radix-global: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)

