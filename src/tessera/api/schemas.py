"""Request and response bodies of the API (pydantic), shared by the server and the SDK. New fields always get
defaults, so old clients keep working.

Text fields refuse NUL characters and unencodable surrogates: they could not be stored or passed to a process.
Request bodies refuse non-finite numbers (Python's JSON reads ``NaN`` and ``Infinity``) and read integers strictly
(``true`` is not 1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from tessera.api.job_options import parse_array, parse_dependency, parse_duration
from tessera.api.version import API_VERSION


def _storable(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text") from None
    return text


Text = Annotated[str, AfterValidator(_storable)]
Name = Annotated[str, AfterValidator(_storable), Field(max_length=200)]
QueueName = Annotated[str, AfterValidator(_storable), Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]
# Strict numbers in the unions below: in lax mode a string of digits too long for the ``str`` branch would be read
# as a number instead of being refused; a short one reaches the ``str`` branch and is parsed there.
Memory = StrictInt | StrictFloat | Annotated[str, Field(max_length=50)]
Cpu = StrictInt | StrictFloat | Annotated[str, Field(max_length=50)]


REQUEST = ConfigDict(extra="forbid", allow_inf_nan=False)
MAX_WORKERS = 64  # workers of one job


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("must be an absolute path (the CLI sends the directory it runs in)")
    return path


def _checked(parse: Any) -> Any:
    """A validator that keeps the text and refuses what ``parse`` refuses (its ValueError names the problem)."""

    def check(value: Any) -> Any:
        parse(value)
        return value

    return AfterValidator(check)


Directory = Annotated[str, AfterValidator(_storable), AfterValidator(_absolute), Field(max_length=4096)]
Duration = Annotated[StrictInt | StrictFloat | Annotated[str, Field(max_length=50)], _checked(parse_duration)]


class WorkloadSpec(BaseModel):
    """What ``POST /v1/workloads`` takes (``tessera submit``). The server also refuses what the OS could not
    ``exec`` (an argument or environment entry over 128 KiB, too much in all) and an empty program name."""

    model_config = REQUEST

    command: list[Text] = Field(min_length=1, max_length=1000, description="argv of the process; argv[0] on PATH")
    name: Name = ""
    kind: Literal["batch", "service"] = Field("batch", description="a service is restarted when it exits")
    gpus: StrictInt = Field(0, ge=0, le=64, description="GPUs per worker (0: CPU only)")
    gpu_milli: StrictInt | None = Field(None, ge=1, le=1000, description="share of each GPU in thousandths")
    gpu_fraction: float | None = Field(None, gt=0, le=1, strict=True, description="share of the GPU (0.3)")
    gpu_compute: StrictInt | None = Field(None, ge=1, le=100, description="compute share in percent (MPS limit)")
    gpu_mem: Memory | None = Field(None, description="device memory per GPU: MiB, or '10GiB'")
    gpu_types: list[Annotated[str, Field(max_length=50)]] = Field(default_factory=list, max_length=20)
    cpu: Cpu | None = Field(None, description="CPU cores: 4, 0.5 or '500m'")
    mem: Memory | None = Field(None, description="host memory: MiB, or '16GiB'")
    priority: StrictInt | Annotated[str, Field(max_length=50)] | None = Field(
        None,
        description="a number (larger first) or a priority class: inference-critical (1000), training (500), "
        "best-effort (100); default: training",
    )
    queue: QueueName | None = Field(None, description="default: the tenant's queue")
    env: dict[Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Text] = Field(
        default_factory=dict, max_length=200
    )
    cwd: Directory | None = Field(
        None, description="working directory (absolute); absent: the account's home, or the server's directory"
    )
    time_limit: Duration | None = Field(
        None, description="walltime: seconds, or '2h', '90m', '1:30:00'; stopped (SIGTERM, grace, SIGKILL) past it"
    )
    array: Annotated[str, Field(max_length=500), _checked(parse_array)] | None = Field(
        None, description="a job array: '0-9', '0-9:2', '1,3,5', '%N' to run at most N at once"
    )
    dependency: Annotated[str, Field(max_length=2000), _checked(parse_dependency)] | None = Field(
        None, description="'afterok:ID[:ID...]', 'afterany:...' or 'afternotok:...'; an array's id means its tasks"
    )
    hold: bool = Field(False, strict=True, description="held: not scheduled until released")
    workers: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_WORKERS,
        description="workers (a gang): one process per worker, each with `gpus` GPUs, placed all or nothing and "
        "started together with torchrun's variables (WORLD_SIZE, RANK, ...); default 1, or elastic_min",
    )
    elastic_min: StrictInt | None = Field(None, ge=1, le=MAX_WORKERS, description="elastic: the fewest workers")
    elastic_max: StrictInt | None = Field(
        None, ge=1, le=MAX_WORKERS, description="elastic: the most workers it grows to in idle GPUs"
    )
    job_type: Annotated[str, Field(max_length=100)] | None = Field(
        None, description="the model it trains, as the throughput model names it (GET /v1/config lists them)"
    )
    checkpointable: bool | None = Field(
        None,
        strict=True,
        description="it resumes from its own checkpoints, so preemption may stop and requeue it; false: it cannot "
        "(least-attained-service preemption and borrowing then leave it alone); default: as its priority class is "
        "preemptible",
    )


class PlacementOut(BaseModel):
    node: str
    gpus: list[int]
    gpu_milli: int
    uuids: list[str]


class WorkloadOut(BaseModel):
    id: int
    name: str
    tenant: str
    queue: str
    kind: str
    state: Literal["pending", "running", "succeeded", "failed", "cancelled", "preempted"]
    reason: str = Field(description="why it is pending, or how it ended")
    priority: int
    priority_class: str
    gpus: int
    gpu_milli: int
    gpu_mem_mib: int
    gpu_types: list[str]
    cpu_milli: int
    mem_mib: int
    command: list[str]
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    attempts: int
    placement: list[PlacementOut] | None
    simulated_gpus: bool = Field(description="placed on simulated GPUs: the process sees no real GPU")
    cwd: str | None = None
    time_limit_s: float | None = Field(None, description="walltime in seconds; None: none")
    held: bool = False
    dependency: str | None = Field(None, description="e.g. 'afterok:12:13'; None: none")
    array_id: int | None = Field(None, description="the array it belongs to (the id of its first task)")
    array_index: int | None = Field(None, description="its index in the array (TESSERA_ARRAY_INDEX)")
    workers: int = Field(1, description="workers it runs now (running), else the workers it asks for")
    workers_asked: int = Field(1, description="the workers it asked for (its gang)")
    elastic_min: int | None = Field(None, description="elastic: the fewest workers; None: rigid")
    elastic_max: int | None = Field(None, description="elastic: the most workers")
    job_type: str = Field("", description="the model it trains; '' = not given")
    checkpointable: bool = Field(False, description="it resumes from its own checkpoints")


class EventOut(BaseModel):
    workload_id: int | None
    at: float
    kind: str
    message: str


class LogChunk(BaseModel):
    data: str
    offset: int = Field(description="byte offset of data in the log")
    next_offset: int
    finished: bool = Field(description="the workload has ended: no more output will come")


class GpuOut(BaseModel):
    index: int
    uuid: str
    model: str
    mem_mib: int
    simulated: bool
    allocated_milli: int
    workloads: list[int] = Field(description="the workloads on it: all for an admin, a tenant's own for a tenant")


class NodeOut(BaseModel):
    name: str
    gpu_model: str | None
    cpu_milli: int
    cpu_free_milli: int
    mem_mib: int
    mem_free_mib: int
    gpus: list[GpuOut]


class QuotaIn(BaseModel):
    model_config = REQUEST

    gpus: float | None = Field(
        None, ge=0, le=1_000_000, strict=True, description="GPUs (1.5 = one and a half); absent: no limit"
    )
    cpu: Cpu | None = None
    mem: Memory | None = None


class QueueIn(BaseModel):
    model_config = REQUEST

    name: QueueName
    tenant: QueueName
    cohort: QueueName | None = None
    nominal: dict[Annotated[str, Field(max_length=50)], QuotaIn] = Field(
        default_factory=dict, max_length=50, description="per GPU model or '*'; empty: the whole pool"
    )
    borrowing_limit: dict[Annotated[str, Field(max_length=50)], QuotaIn] | None = Field(None, max_length=50)
    lending_limit: dict[Annotated[str, Field(max_length=50)], QuotaIn] | None = Field(None, max_length=50)
    weight: float = Field(1.0, gt=0, le=1e6, strict=True)
    strategy: Literal["StrictFIFO", "BestEffortFIFO"] = "BestEffortFIFO"


class QueueOut(BaseModel):
    name: str
    tenant: str
    cohort: str | None
    nominal: dict[str, dict[str, int]]
    borrowing_limit: dict[str, dict[str, int]] | None
    lending_limit: dict[str, dict[str, int]] | None
    weight: float
    strategy: str
    usage: dict[str, dict[str, int]] = Field(description="what runs now, per quota entry")
    pending: int
    running: int


class TokenIn(BaseModel):
    model_config = REQUEST

    tenant: QueueName
    label: Name = ""


class TokenOut(BaseModel):
    token: str = Field(description="shown once; only its hash is stored")
    tenant: str
    queue: str


class TokenInfo(BaseModel):
    """A stored token, without its secret (``GET /v1/tokens``)."""

    id: int
    tenant: str | None = Field(description="None for the admin token")
    label: str
    admin: bool
    created_at: float
    last_used_at: float | None = Field(description="to the minute; None: not used since it was made")


class ErrorOut(BaseModel):
    """Every error response: 401, 403, 404, 422 (``field`` names the offending field), 503 while starting."""

    detail: str
    field: str | None = Field(None, description="the request field at fault (422)")
    errors: list[dict[str, Any]] | None = Field(None, description="every validation error of the body (422)")


class Health(BaseModel):
    """``GET /healthz`` once the server is ready (503 with an ``ErrorOut`` before)."""

    status: Literal["ok"]
    simulated_gpus: bool
    gpus: int
    api_version: str = Field(API_VERSION, description="the server's API_VERSION (servers before it existed: 1)")
    policy: str = Field("", description="the scheduling policy (preset) it runs: GET /v1/config says more")
    placement: str = Field("", description="the placement policy it runs (the preset's own, or --placement)")


class ServingSetupOut(BaseModel):
    """The serving setup in force, as ``tessera simulate serving --setup NAME --set KEY=VALUE`` replays it."""

    name: str = Field(description="the setup (tessera simulate serving --setup NAME runs the same)")
    router: str = Field(description="the router of a model deployed without --router")
    autoscaler: str = Field(description="the autoscaler of a model deployed without --autoscaler (none: fixed)")
    admission: bool = Field(description="batch requests are shed under overload")
    engine_priority: bool = Field(description="SLO classes order the engines' queues where engines take a priority")
    late_binding: bool = Field(description="the gateway holds requests until a replica has room")
    tick_s: float = Field(description="the serving controller's period")
    max_hold_s: float = Field(description="a request held for a replica is refused after this long")
    knobs: list[str] = Field(default_factory=list, description="what this server changed (--serving-set KEY=VALUE)")
    knob_names: dict[str, str] = Field(default_factory=dict, description="every knob --serving-set takes")
    setups: list[str] = Field(default_factory=list, description="every setup (tessera up --serving-setup)")


class SchedulingOut(BaseModel):
    """``GET /v1/config``: the scheduler this server runs, as ``tessera simulate`` would name and configure it (any
    token may read it)."""

    policy: str = Field(description="the preset (tessera simulate timeline --policies NAME runs the same)")
    placement: str = Field(description="the placement policy in effect (the preset's own, or tessera up --placement)")
    placement_summary: str = Field(description="what that placement does, in a line")
    whole_gpus: bool = Field(description="GPU shares are rounded up to whole GPUs (static binding)")
    discipline: str = Field(description="StrictFIFO or BestEffortFIFO (backfill)")
    borrowing: bool = Field(description="queues borrow idle quota in their cohort and reclaim it by preemption")
    las_thresholds_gpu_s: list[float] = Field(description="least-attained-service levels (empty: no LAS)")
    las_within_class: bool
    gang_one_node: bool = Field(description="a gang goes onto one node when one can hold it")
    head_reservation: bool
    elastic: bool = Field(description="elastic workloads grow and shrink")
    colocation_rule: bool = Field(description="typed training jobs share a GPU only when it is a net gain")
    presets: list[str] = Field(description="every preset a server may run (tessera up --policy)")
    placements: list[str] = Field(description="every placement policy (tessera up --placement)")
    knobs: list[str] = Field(
        default_factory=list, description="the preset's knobs this server changed (tessera up --set KEY=VALUE)"
    )
    knob_names: dict[str, str] = Field(
        default_factory=dict, description="every knob --set takes (tessera up and simulate timeline), and what it does"
    )
    job_types: list[str] = Field(
        default_factory=list, description="the job types its throughput model knows (tessera submit --job-type)"
    )
    serving: ServingSetupOut | None = Field(
        None, description="the serving setup its gateway and controller run (tessera up --serving-setup)"
    )
