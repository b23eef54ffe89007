"""The wire types of Tessera's HTTP API, shared by the server (``tessera.server.api``) and the SDK
(``tessera.client``): the pydantic request and response bodies (``schemas``, ``serving``, ``accounting``) and
``API_VERSION``.

Imports only pydantic (and may use ``tessera.core``): no FastAPI, no server, no HTTP client.
"""

from tessera.api.accounting import HistoryOut, QueueUsageHistory, QueueUsageOut, UsageOut, UsagePoint
from tessera.api.schemas import (
    ErrorOut,
    EventOut,
    GpuOut,
    Health,
    LogChunk,
    NodeOut,
    PlacementOut,
    QueueIn,
    QueueOut,
    QuotaIn,
    SchedulingOut,
    ServingSetupOut,
    TokenIn,
    TokenInfo,
    TokenOut,
    WorkloadOut,
    WorkloadSpec,
)
from tessera.api.serving import ModelDeploy, ModelOut
from tessera.api.version import API_VERSION

__all__ = [
    "API_VERSION",
    "ErrorOut",
    "EventOut",
    "GpuOut",
    "Health",
    "SchedulingOut",
    "ServingSetupOut",
    "HistoryOut",
    "LogChunk",
    "ModelDeploy",
    "ModelOut",
    "NodeOut",
    "PlacementOut",
    "QueueIn",
    "QueueOut",
    "QueueUsageHistory",
    "QueueUsageOut",
    "QuotaIn",
    "TokenIn",
    "TokenInfo",
    "TokenOut",
    "UsageOut",
    "UsagePoint",
    "WorkloadOut",
    "WorkloadSpec",
]
