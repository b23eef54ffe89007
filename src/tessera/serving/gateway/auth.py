"""The authentication seam: an API key (``Authorization: Bearer KEY``) names a tenant, and a tenant sees and uses
only its own models.

``StaticKeys`` maps keys to tenants (tests, benchmarks, a controller that mirrors the control plane's tenant
tokens); ``OpenAccess`` lets everyone in as ``ANY_TENANT``, who sees every model (a single-user ``make run``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

from tessera.serving.gateway.registry import ModelRoute

ANY_TENANT = "*"


class Authenticator(Protocol):
    def tenant(self, api_key: str | None) -> str | None:
        """The tenant ``api_key`` belongs to, or None (the request gets 401)."""
        ...


class StaticKeys:
    """Keys are looked up by their SHA-256 digest: the table holds no key, and a look-up's timing says nothing
    about how close a wrong key came."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._tenants = {_digest(key): tenant for key, tenant in keys.items()}  # digest of the API key -> tenant

    def tenant(self, api_key: str | None) -> str | None:
        return self._tenants.get(_digest(api_key)) if api_key else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class OpenAccess:
    def tenant(self, api_key: str | None) -> str | None:
        return ANY_TENANT


def visible(route: ModelRoute, tenant: str) -> bool:
    return tenant == ANY_TENANT or route.tenant == tenant
