"""The ``radix-global`` command: one subcommand per process kind, each a module's ``main(argv)``.

Subcommands are imported lazily so that the light router install never imports torch or sglang.
``replay``, ``cluster``, ``simulate`` and ``plan`` are ``radix_global_tools`` (the ``[tools]``
extra).
``bench`` lives in ``benchmarks/``, which the wheel does not carry (:data:`SOURCE_CHECKOUT_ONLY`):
run from a source checkout (an editable install included) it imports it from the checkout; from an
installed wheel it says it needs the source checkout and exits 2.
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
    "replay": ("radix_global_tools.replay.client",
               "replay a Mooncake-format trace against a router"),
    "cluster": ("radix_global_tools.cluster.main",
                "a cluster over test hosts (netns): `cluster up`"),
    "bench": ("benchmarks.scenarios.bench", "side-by-side trace replay against peer routers"),
    "simulate": ("radix_global_tools.simulate.main", "paper-scale discrete-event simulation"),
    "plan": ("radix_global_tools.plan.main",
             "the cheapest cluster meeting TTFT and TBT SLOs for a trace"),
}


# The subcommands whose modules are in ``benchmarks/`` (source checkout only, not in the wheel).
SOURCE_CHECKOUT_ONLY = frozenset(
    name for name, (module, _) in SUBCOMMANDS.items() if module.startswith("benchmarks."))


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
    module_name = SUBCOMMANDS[name][0]
    if name in SOURCE_CHECKOUT_ONLY:
        _add_checkout_to_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if name not in SOURCE_CHECKOUT_ONLY or not _is_module_or_parent(exc.name, module_name):
            raise  # a missing dependency inside the subcommand: its own message
        print(f"radix-global {name}: needs the source checkout (benchmarks/ is not in the wheel)",
              file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


def _add_checkout_to_path() -> None:
    """An editable install maps only the product packages: the checkout this package sits in (if
    it is one) goes on ``sys.path`` so that its ``benchmarks`` imports."""
    root = Path(__file__).resolve().parents[1]
    if (root / "benchmarks" / "__init__.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))


def _is_module_or_parent(missing: str | None, module_name: str) -> bool:
    """Whether the module not found is ``module_name`` itself or a package above it (so the
    ``benchmarks`` package is absent, or is some other distribution's ``benchmarks``)."""
    return bool(missing) and (module_name == missing or module_name.startswith(f"{missing}."))
