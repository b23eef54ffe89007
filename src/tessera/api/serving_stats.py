"""Wire types of ``GET /v1/models/{name}/stats`` (the dashboard's models view, ``tessera models show``): a served
model's recent requests as the gateway answered them, measured against its SLO class's targets, its replicas over
time, and the setup it is served with."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SloTargetOut(BaseModel):
    ttft_s: float = Field(description="time to first token, seconds")
    tpot_s: float = Field(description="time per output token after the first, seconds")


class RequestWindowOut(BaseModel):
    """The gateway's answers for the model over the last ``window_s`` (docs/dashboard.md, "How each model serves")."""

    window_s: float = Field(description="how far back the figures look")
    span_s: float = Field(description="the time the counts cover (less than window_s on a server younger than it)")
    requests: int = Field(description="requests answered, any status")
    rate_per_s: float = Field(description="requests answered per second over span_s")
    errors: int = Field(description="answered with an error status (4xx, 5xx)")
    slo_met: int = Field(description="answered successfully within their class's TTFT and TPOT targets")
    slo_attainment_pct: float | None = Field(description="slo_met over requests; null without requests")
    samples: int = Field(description="successful answers the percentiles are over (the newest ones)")
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = Field(None, description="over streamed answers of two chunks or more")
    tpot_p99_s: float | None = None


class ReplicaPointOut(BaseModel):
    at: float = Field(description="the server's clock, seconds since the epoch")
    ready: int = Field(description="replicas the gateway serves (proven ready)")
    running: int = Field(description="replicas started, ready or not yet")
    pending: int = Field(description="replicas waiting to be placed or launched")
    desired: int = Field(description="the autoscaler's target")


class ModelSetupOut(BaseModel):
    """How the model is served: the server's serving setup and the model's own choices."""

    serving_setup: str | None = Field(None, description="the server's serving setup (tessera up --serving-setup)")
    router: str = Field(description="how the gateway picks a replica for each request")
    autoscaler: str | None = Field(None, description="how the controller sizes its replica count")
    slo: str = Field(description="the SLO class of its requests (a request's header may override it)")
    min_replicas: int
    max_replicas: int
    idle_timeout_s: float
    replica_concurrency: int = Field(
        description="requests one replica takes at once (the autoscaler's target per replica); more wait at "
        "the gateway; 0: no cap"
    )


class ModelStatsOut(BaseModel):
    name: str
    tenant: str
    now: float = Field(description="the server's clock when this was read")
    targets: SloTargetOut = Field(description="the targets of the model's SLO class")
    window: RequestWindowOut | None = Field(description="null: this server runs no gateway")
    replicas: list[ReplicaPointOut] = Field(
        description="its replica counts when they changed, oldest first, over the last replicas_window_s (the first "
        "point may be older: the counts when the window began)"
    )
    replicas_window_s: float
    setup: ModelSetupOut
