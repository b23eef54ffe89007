"""Wire types of the serving part of the API: ``POST /v1/models`` (``tessera models deploy``) and what
``GET /v1/models`` lists. A deployed model's replicas are ``service`` workloads; the OpenAI-compatible gateway
serves it under ``openai_base_url``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt

from tessera.api.schemas import REQUEST, Cpu, Memory, Name, QueueName, Text

Weights = Annotated[Text, Field(min_length=1, max_length=1000)]

EngineName = Literal["vllm", "sglang", "transformers", "sim"]
SloName = Literal["interactive", "standard", "batch"]
# serving.policies.router.ROUTER_NAMES (the wire types import nothing of serving; tests keep the two equal)
AutoscalerName = Literal["tessera", "knative", "none"]
RouterName = Literal["round-robin", "least-load", "power-of-two", "prefix-affinity", "session-affinity", "token-jsq"]
ModelState = Literal["deploying", "ready", "failing", "stopping", "scaled-to-zero", "deleting"]
CacheTier = Literal["hot", "warm", "cold"]
Duration = StrictInt | StrictFloat | Name  # seconds, or "30s", "5m"
EngineArg = Annotated[Text, Field(max_length=1000)]


class ModelDeploy(BaseModel):
    """What ``POST /v1/models`` takes. The name is what clients pass as ``model`` to the gateway."""

    model_config = REQUEST

    name: QueueName = Field(description="the model's name in OpenAI requests: letters, digits, '_', '.', '-'")
    engine: EngineName = Field("sim", description="the serving engine each replica runs")
    model: Weights | None = Field(
        None, description="weights: a local folder (vllm, transformers) or a catalog name (sim)"
    )
    gpus: StrictInt = Field(1, ge=0, le=8, description="GPUs per replica (tensor parallel); 0: CPU")
    gpu_mem: Memory | None = Field(None, description="device memory per replica and GPU: MiB, or '10GiB'")
    gpu_fraction: float | None = Field(None, gt=0, le=1, strict=True, description="share of each GPU (0.25)")
    min_replicas: StrictInt = Field(1, ge=0, le=64, description="0: scale to zero when idle")
    max_replicas: StrictInt | None = Field(None, ge=1, le=64, description="default: max(1, min_replicas)")
    idle_timeout: Duration = Field("30s", description="idle time before scaling to zero (min_replicas 0)")
    slo: SloName = Field("standard", description="the SLO class of its requests (a header may override it)")
    router: RouterName | None = Field(
        None,
        description="how the gateway picks a replica: least-load, prefix-affinity (requests sharing a prompt prefix "
        "go where it is cached), power-of-two, round-robin, session-affinity or token-jsq, as the serving twin names "
        "them; default: the server's serving setup's",
    )
    autoscaler: AutoscalerName | None = Field(
        None,
        description="how its replicas are scaled: tessera (SLO feedback, targets sized by the KV cache), knative, or "
        "none (min_replicas replicas, at least one); default: the server's serving setup's",
    )
    queue: QueueName | None = Field(None, description="default: the tenant's queue; replicas count against it")
    engine_args: list[EngineArg] = Field(
        default_factory=list,
        max_length=64,
        description="the engine's own arguments, one per item, after Tessera's flags and the server-wide "
        "TESSERA_<ENGINE>_ARGS; the flags Tessera sets (--host, --port, --uds, --served-model-name, ...) are refused",
    )
    cpus: Cpu | None = Field(
        None,
        description="CPU cores per replica (4, 0.5 or '500m'): its workload's CPU request; on the CPU path its "
        "engine's threads run on that many cores (at least one)",
    )
    cpu_bind: Annotated[Text, Field(max_length=200)] = Field(
        "",
        description="the cores a CPU replica's engine binds to are picked among these ('0-3,8'); 'none': no "
        "binding; default: among all the replica may use, distinct per replica as far as the host has cores",
    )
    kv_offload_gib: StrictInt | StrictFloat = Field(
        0, ge=0, le=4096, description="vllm on GPUs: host memory (GiB) to offload its KV cache to; 0: none"
    )
    kv_events: StrictBool = Field(
        False, description="vllm: publish KV-cache events (ZMQ, in the replica's runtime directory)"
    )


class ModelOut(BaseModel):
    name: str
    tenant: str
    queue: str
    engine: str
    model: str
    state: ModelState = Field(
        description="ready: a replica's engine answers; failing: its replicas keep ending on their own (last_error "
        "says why; the gateway answers 503 until one is ready); deploying, stopping, scaled-to-zero, deleting"
    )
    replicas: int = Field(description="replicas ready now (their engine answers)")
    desired_replicas: int
    min_replicas: int
    max_replicas: int
    idle_timeout_s: float
    slo: str
    router: str = Field("least-load", description="how the gateway picks a replica for each request")
    autoscaler: str = Field("tessera", description="how its replicas are scaled (none: a fixed number)")
    serving_setup: str = Field("tessera", description="the server's serving setup, which gives what was not set")
    gpus: int
    gpu_milli: int
    gpu_mem_mib: int
    engine_args: list[str] = Field(default_factory=list, description="the engine's own arguments")
    cpu_milli: int = Field(0, description="CPU request per replica in thousandths of a core (0: none)")
    cpu_bind: str = Field("", description="the cores its CPU replicas bind among ('': any; 'none': no binding)")
    kv_offload_gib: float = Field(0.0, description="vllm: KV-cache offloading to host memory, GiB (0: none)")
    kv_events: bool = Field(False, description="vllm: KV-cache events published")
    cache: CacheTier = Field(
        description="hot: a replica runs; warm: none, but the weights are in the host's page cache; cold: neither"
    )
    replica_workloads: list[int] = Field(description="ids of its replica workloads that are pending or running")
    openai_base_url: str = Field(description="point an OpenAI client here (with a tenant token as the API key)")
    created_at: float
    last_error: str | None = Field(None, description="why its last replica ended on its own, while failures go on")
    replica_failures: int = Field(0, description="replicas in a row that ended on their own, none ready meanwhile")
    retry_at: float | None = Field(None, description="when the next replica may start (backing off after failures)")
