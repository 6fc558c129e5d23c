"""``scripts/gpu_smoke.sh`` cannot run here (no GPU) and CI never runs it, so it must not rot
silently: its bash parses, and every flag it passes is one the commands define today.

- ``bash -n``: syntax.
- The router's flags (its ``ROUTER_ARGS=(...)`` array) are flags of ``radix-global router``'s
  parser (``router.cli.main.build_parser``), and its default ``POLICY_OPTIONS`` are options of
  the conductor (``check_policy``).
- The workers' flags (``WORKER_ARGS=(...)``): every ``--radix-global...`` one is declared by the
  wrapper (``sglang_patch.launch_args.our_options``, the new spelling, never an old alias); every
  other one is SGLang's (its own parser, where SGLang is installed) and none is a deprecated
  unprefixed spelling of ours.
- The router endpoints and the ``x-radix-*`` headers the checks read exist in the router's code.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from router.cli.main import build_parser
from router.routing.policies import check_policy
from sglang_patch.launch_args import our_options

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"
TEXT = SCRIPT.read_text()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _array(name: str) -> str:
    """The body of the script's multi-line bash array ``NAME=(`` ... ``)``."""
    found = re.search(rf"^\s*{name}=\(\n(.*?)^\s*\)\s*$", TEXT, re.M | re.S)
    assert found, f"{SCRIPT.name} has no {name}=( ... ) array"
    return found.group(1)


def _flags(name: str) -> list[str]:
    flags = FLAG.findall(_array(name))
    assert flags, name
    return flags


def _parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_bash_syntax() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr


def test_script_is_strict_and_cleans_up() -> None:
    assert "set -euo pipefail" in TEXT
    assert re.search(r"^trap \S+ EXIT", TEXT, re.M)
    assert "GPU SMOKE PASS" in TEXT and "GPU SMOKE FAIL" in TEXT
    assert "--device" not in _array("WORKER_ARGS")  # a GPU script (CPU flags: WORKER_EXTRA_ARGS)
    # the commands it starts are the product's, as an operator runs them
    assert re.search(r'"\$\{RG_ROUTER_CMD\[@\]\}" router "\$\{ROUTER_ARGS\[@\]\}"', TEXT)
    assert re.search(r'"\$\{RG_WORKER_CMD\[@\]\}" sglang "\$\{WORKER_ARGS\[@\]\}"', TEXT)


def test_router_flags_exist() -> None:
    known = _parser_flags(build_parser())
    used = _flags("ROUTER_ARGS")
    assert {"--port", "--policy", "--admin-token"} <= set(used)
    assert not [f for f in used if f not in known], (used, sorted(known))
    policy = re.search(r"^ROUTER_ARGS=\(.*?--policy (\w+)", TEXT, re.M | re.S)
    assert policy and policy.group(1) == "conductor"
    default = re.search(r"^POLICY_OPTIONS=\$\{POLICY_OPTIONS:-([^}]*)\}", TEXT, re.M)
    assert default, "POLICY_OPTIONS has no default"
    options = dict(item.split("=", 1) for item in default.group(1).split())
    check_policy("conductor", {k: {"true": True, "false": False}.get(v, v)
                               for k, v in options.items()})


def test_wrapper_flags_exist() -> None:
    opts = our_options()
    ours = {o.flag for o in opts}
    aliases = {a for o in opts for a in o.aliases}
    used = _flags("WORKER_ARGS")
    wrapper = [f for f in used if f.startswith("--radix-global")]
    assert {"--radix-global", "--radix-global-pool-id", "--radix-global-worker-id",
            "--radix-global-admin-token"} <= set(wrapper)
    assert not [f for f in wrapper if f not in ours], (wrapper, sorted(ours))
    assert not [f for f in used if f in aliases], "an old unprefixed spelling of our flags"


def test_sglang_flags_exist() -> None:
    pytest.importorskip("sglang.srt.server_args", reason="SGLang is not installed here")
    from sglang_patch.launch_args import sglang_parser

    theirs = sglang_parser().flags
    used = [f for f in _flags("WORKER_ARGS") if not f.startswith("--radix-global")]
    assert "--model-path" in used and "--port" in used
    assert not [f for f in used if f not in theirs], used


def test_router_endpoints_and_headers_exist() -> None:
    admin = (ROOT / "router" / "http" / "admin.py").read_text()
    routes = set(re.findall(r'Route\("([^"]+)"', admin))
    for path in ("/admin/workers", "/admin/workers/{worker_id}/drain", "/admin/stats",
                 "/admin/diagnostics"):
        assert path in routes, path
    assert "/admin/workers/{first}/drain" in TEXT
    route = (ROOT / "router" / "request" / "route.py").read_text()
    for header in set(re.findall(r"x-radix-[a-z-]+", TEXT)):
        assert f'b"{header}"' in route, header
