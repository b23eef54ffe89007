"""The replica registry seam: which models the gateway serves, whose they are, and which of their replicas are ready.

The serving controller owns the truth (models deployed as workloads, replicas launched and healthy) and feeds a
registry; the gateway only reads it and listens for changes (``subscribe``: a model's replicas changed, so held
requests may go). ``InMemoryRegistry`` is the implementation shipped here, for tests, benchmarks and a controller
that keeps its state in memory; every method must be called on the gateway's event loop thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.serving.policies.requests import SloClass


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A deployed model as the gateway sees it."""

    name: str  # what clients put in ``model``
    tenant: str  # the tenant that deployed it: only that tenant sees and uses it
    slo: SloClass = SloClass.STANDARD  # default class of its requests (a request header may override it)
    router: str = "least-load"  # one of policies.router.ROUTER_NAMES
    created_s: int = 0  # Unix time, for /v1/models
    # Why its replicas keep failing ("" while they do not): with none ready, its requests are answered 503 at once
    # (``Retry-After``: ``retry_after_s``) instead of waiting for a replica that will not come.
    failing: str = ""
    retry_after_s: int = 0
    # Requests in flight per replica before more wait at the gateway for room (late binding, ``binding``);
    # 0: the gateway's default (``GatewayConfig.replica_concurrency``, itself 0: no cap).
    replica_concurrency: int = 0
    # Late binding as the twin's (``setups.PolicySetup.late_binding``): a replica that serves some request takes
    # another only while its KV cache (as its engine exports it) has room for it beside what is in flight there.
    kv_room: bool = False
    admission: bool = False  # batch requests are shed under overload (``policies.admission``)
    # Its engine schedules by request priority (``engine_exec.PRIORITY_ENGINES``): a client's own ``priority`` may
    # not be more urgent than its SLO class (``gateway.priority``) ...
    engine_priority: bool = False
    # ... and, where the serving setup orders engines' queues by class (``PolicySetup.engine_priority``), the gateway
    # puts each request's class into the forwarded body as its ``priority``.
    class_priority: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaEndpoint:
    replica: int  # id, unique per model (the router's replica id)
    base_url: str  # http://host:port or unix:PATH of its OpenAI-compatible API
    # The process proven to be the replica when it was registered (it listens on ``base_url``'s Unix socket and
    # belongs to the replica's workload); the upstream refuses a connection served by any other. None: not checked.
    peer_pid: int | None = None
    # Its own key, sent as ``Authorization: Bearer`` on every request to it (a replica on a TCP port of another
    # node requires it); None: it requires none (a replica behind its private socket).
    api_key: str | None = field(default=None, repr=False)


ChangeListener = Callable[[str], None]  # called with the model whose replicas (or route) changed


class ReplicaRegistry(Protocol):
    def route(self, model: str) -> ModelRoute | None: ...

    def routes(self) -> Sequence[ModelRoute]: ...

    def replicas(self, model: str) -> Sequence[ReplicaEndpoint]:
        """The model's ready replicas (empty while it is at zero or starting)."""
        ...

    def subscribe(self, listener: ChangeListener) -> None: ...


class InMemoryRegistry:
    """A ``ReplicaRegistry`` held in memory (see the module docstring)."""

    def __init__(self) -> None:
        self._routes: dict[str, ModelRoute] = {}
        self._replicas: dict[str, dict[int, ReplicaEndpoint]] = {}
        self._listeners: list[ChangeListener] = []
        self._next_id = 0

    def route(self, model: str) -> ModelRoute | None:
        return self._routes.get(model)

    def routes(self) -> Sequence[ModelRoute]:
        return list(self._routes.values())

    def replicas(self, model: str) -> Sequence[ReplicaEndpoint]:
        by_id = self._replicas.get(model)
        return list(by_id.values()) if by_id else ()

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------------------------ the controller's side
    def deploy(self, route: ModelRoute) -> None:
        self._routes[route.name] = route
        self._notify(route.name)

    def undeploy(self, model: str) -> None:
        self._routes.pop(model, None)
        self._replicas.pop(model, None)
        self._notify(model)

    def add_replica(self, model: str, base_url: str, peer_pid: int | None = None, api_key: str | None = None) -> int:
        """A replica of ``model`` is ready at ``base_url`` (served by process ``peer_pid``, requiring ``api_key``);
        returns its id."""
        if model not in self._routes:
            raise KeyError(f"model {model!r} is not deployed")
        rid = self._next_id
        self._next_id += 1
        self._replicas.setdefault(model, {})[rid] = ReplicaEndpoint(rid, base_url, peer_pid, api_key)
        self._notify(model)
        return rid

    def remove_replica(self, model: str, replica: int) -> None:
        by_id = self._replicas.get(model)
        if by_id is not None and by_id.pop(replica, None) is not None:
            self._notify(model)

    def _notify(self, model: str) -> None:
        for listener in list(self._listeners):
            listener(model)
