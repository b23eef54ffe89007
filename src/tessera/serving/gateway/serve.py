"""Running the gateway under uvicorn: ``uvicorn_server`` (for a caller that owns the registry, e.g. the controller
or a test) and ``python -m tessera.serving.gateway.serve`` (a standalone gateway over fixed replicas, for the
overhead benchmark and trying things by hand)::

    python -m tessera.serving.gateway.serve --port 8100 --model chat=http://127.0.0.1:8001,http://127.0.0.1:8002 \
        [--key sk-team-a=team-a ...] [--router least-load] [--replica-concurrency N]

Without ``--key`` every caller is let in and sees every model. Bad options: one line naming the option, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import ANY_TENANT, Authenticator, OpenAccess, StaticKeys
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.policies.router import ROUTER_NAMES


def uvicorn_server(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> uvicorn.Server:
    """A uvicorn server for ``gateway`` (run it with ``server.run()`` or ``await server.serve()``); its lifespan
    starts and stops the gateway. uvloop and httptools are used when installed."""
    config = uvicorn.Config(
        gateway,
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
        proxy_headers=False,  # the client's address is not used: no middleware around every request
        server_header=False,
        date_header=False,
    )
    return uvicorn.Server(config)


def _fail(option: str, message: str) -> None:
    sys.stderr.write(f"{option}: {message}\n")
    raise SystemExit(2)


def build(argv: Sequence[str]) -> tuple[Gateway, str, int]:
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.gateway.serve", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", action="append", default=[], help="NAME=URL[,URL...] (repeat per model)")
    parser.add_argument("--key", action="append", default=[], help="API key for a tenant: KEY=TENANT (repeatable)")
    parser.add_argument("--router", default="least-load", choices=ROUTER_NAMES)
    parser.add_argument("--max-prefix-entries", type=int, default=200_000, help="prefix index cap per model")
    parser.add_argument(
        "--replica-concurrency", type=int, default=0,
        help="requests in flight per replica; more wait at the gateway for room (0: no cap)",
    )  # fmt: skip
    parser.add_argument("--tenant", default="", help="the tenant owning the --model models (default: the first key's)")
    ns = parser.parse_args(list(argv))
    keys: dict[str, str] = {}
    for item in ns.key:
        key, _, tenant = item.partition("=")
        if not key or not tenant:
            _fail("--key", f"expected KEY=TENANT, got {item!r}")
        keys[key] = tenant
    owner = ns.tenant or (next(iter(keys.values())) if keys else ANY_TENANT)
    registry = InMemoryRegistry()
    for item in ns.model:
        name, _, urls = item.partition("=")
        if not name or not urls:
            _fail("--model", f"expected NAME=URL[,URL...], got {item!r}")
        registry.deploy(ModelRoute(name, owner, router=ns.router))
        for url in urls.split(","):
            registry.add_replica(name, url.rstrip("/"))
    auth: Authenticator = StaticKeys(keys) if keys else OpenAccess()
    if ns.max_prefix_entries < 1:
        _fail("--max-prefix-entries", f"must be >= 1, got {ns.max_prefix_entries}")
    if ns.replica_concurrency < 0:
        _fail("--replica-concurrency", f"must be >= 0, got {ns.replica_concurrency}")
    config = GatewayConfig(
        max_prefix_entries=ns.max_prefix_entries, replica_concurrency=ns.replica_concurrency, freeze_heap_on_start=True
    )
    return Gateway(registry, auth, config), ns.host, ns.port


def main(argv: Sequence[str] | None = None) -> int:
    gateway, host, port = build(sys.argv[1:] if argv is None else argv)
    uvicorn_server(gateway, host, port).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
