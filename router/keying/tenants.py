"""API key -> tenant -> cache namespace (SGLang ``cache_salt``).

A tenant's prompts are keyed with its own salt, so two tenants never share (or probe) each other's
KV cache: the router keys pages with the salt and forwards it to the engine as ``cache_salt``, and
the engine seeds its page-hash chain with it. A tenant may opt in to the shared namespace
(``shared = true``): no salt, its common prefixes (system prompts) hit everyone's cache.

File (TOML or YAML)::

    [tenants.acme]
    api_keys = ["sk-acme-1", "sk-acme-2"]
    shared = false          # default: isolated

    [shared_prefixes.support-agent]   # platform prompts every tenant reuses (prefix_specs.py)
    model = "tiny"
    text = "You are ..."

Without a tenants file every request is in the shared namespace. With one, a request whose
``Authorization: Bearer <key>`` names no tenant is refused (401): a typo must not silently put a
tenant into the shared namespace.

The router decides every request's salt (:func:`effective_salt`, ``docs/interfaces.md`` section
"What a client controls, and what the router decides"): ``tenant:<name>`` for an isolated tenant,
none for the shared namespace. A client's own ``cache_salt`` only narrows its namespace to a part of
it (``tenant:<name>/<salt>``, or ``shared/<salt>`` for a shared tenant), so no client salt can name
another tenant's namespace. Tenant names may not contain ``/``, which keeps the format unambiguous.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, NamedTuple


class TenantError(ValueError):
    """Unknown or missing API key (HTTP 401), or a bad tenants file."""


class Tenant(NamedTuple):
    name: str
    salt: str | None  # None = shared namespace


SHARED = Tenant(name="shared", salt=None)
SHARED_PREFIXES_TABLE = "shared_prefixes"  # the tenants file's table of platform prefixes


class Tenants:
    """Immutable API-key table; :meth:`resolve` maps a request's key to its tenant."""

    def __init__(self, by_key: dict[str, Tenant] | None = None) -> None:
        self._by_key = dict(by_key or {})

    @property
    def enabled(self) -> bool:
        return bool(self._by_key)

    def __len__(self) -> int:
        return len({t.name for t in self._by_key.values()})

    def resolve(self, authorization: str | None) -> Tenant:
        if not self._by_key:
            return SHARED
        if not authorization or not authorization.startswith("Bearer "):
            raise TenantError("missing API key (Authorization: Bearer <key>)")
        tenant = self._by_key.get(authorization.removeprefix("Bearer ").strip())
        if tenant is None:
            raise TenantError("unknown API key")
        return tenant

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> Tenants:
        """``data``: a tenants file's content (its ``shared_prefixes`` table is not ours:
        ``router/keying/prefix_specs.py`` reads it)."""
        table = data["tenants"] if "tenants" in data else {
            k: v for k, v in data.items() if k != SHARED_PREFIXES_TABLE}
        if not isinstance(table, dict):
            raise TenantError("tenants must be a table of name -> {api_keys, shared}")
        by_key: dict[str, Tenant] = {}
        for name, spec in table.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("api_keys"), list):
                raise TenantError(f"tenant {name!r} needs api_keys = [...]")
            if not isinstance(name, str) or not name or "/" in name:
                raise TenantError(f"tenant name {name!r} must be non-empty and without '/'")
            shared = spec.get("shared", False)
            if not isinstance(shared, bool):
                raise TenantError(f"tenant {name!r}: shared must be true or false")
            tenant = Tenant(name=str(name), salt=None if shared else f"tenant:{name}")
            for key in spec["api_keys"]:
                if not isinstance(key, str) or not key:
                    raise TenantError(f"tenant {name!r}: api keys must be non-empty strings")
                if key in by_key:
                    raise TenantError(f"API key listed for two tenants ({name!r})")
                by_key[key] = tenant
        return cls(by_key)

    @classmethod
    def from_file(cls, path: str | Path | None) -> Tenants:
        return cls.from_mapping(read_tenants_file(path))



def read_tenants_file(path: str | Path | None) -> dict[str, Any]:
    """A tenants file's content (TOML by suffix, else YAML); an empty mapping without a file."""
    if path is None:
        return {}
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".toml":
        data = tomllib.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise TenantError(f"{path}: a tenants file must be a table")
    return data


CLIENT_SALT_MAX_CHARS = 256
SHARED_SUBSPACE = "shared"  # prefix of a shared tenant's narrowed namespaces ("shared/<salt>")


def effective_salt(tenant: Tenant, client_salt: object) -> str | None:
    """The ``cache_salt`` to key and forward: the tenant's own namespace, narrowed by the
    client's salt (never replaced by it). Raises ``ValueError`` for a salt that is not a
    string of at most ``CLIENT_SALT_MAX_CHARS`` characters."""
    if client_salt is None or client_salt == "":
        return tenant.salt
    if not isinstance(client_salt, str) or len(client_salt) > CLIENT_SALT_MAX_CHARS:
        raise ValueError(f"'cache_salt' must be a string of at most {CLIENT_SALT_MAX_CHARS} "
                         "characters")
    return f"{tenant.salt or SHARED_SUBSPACE}/{client_salt}"
