"""What a replica of a deployed model runs: the engine's command line and environment for one port.

``tessera.serving.controller`` asks for a replica by handing the control plane this command; the replica is a
``service`` workload, so the backend adds the isolation settings (``CUDA_VISIBLE_DEVICES``, the share in
``TESSERA_GPU_MILLI`` / ``TESSERA_GPU_MEM_MIB``) when it launches it. An engine with its own memory cap gets it from
the share through ``tessera.serving.engine_exec``, which reads those variables at launch (the GPU, hence its memory,
is only known then) and then runs the engine in its place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import tessera
from tessera.serving.engine_exec import KEY_ENV, SERVER_ENV
from tessera.serving.engine_settings import EngineSettings, exec_flags

ENGINES = ("vllm", "sglang", "transformers", "sim")

PORT_ENV = "TESSERA_ENGINE_PORT"
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__)))
MODEL_ENV = "TESSERA_SERVED_MODEL"


@dataclass(frozen=True, slots=True)
class DeployedModel:
    """A deployed model as the controller sees it (the store's row, without its storage)."""

    id: int
    name: str
    tenant: str
    queue: str
    engine: str
    weights: str
    gpus: int
    gpu_milli: int
    gpu_mem_mib: int
    min_replicas: int
    max_replicas: int
    idle_timeout_s: float
    slo: str
    deleting: bool = False
    router: str | None = None  # how the gateway picks a replica (serving.policies.router); None: the setup's
    autoscaler: str | None = None  # "knative", "tessera" or "none" (a fixed number); None: the setup's
    created_s: float = 0.0
    engine_settings: EngineSettings = EngineSettings()  # its own engine arguments, CPUs, KV options

    @property
    def key(self) -> str:
        """How the gateway tells the models of different tenants apart."""
        return f"{self.tenant}/{self.name}"


@dataclass(frozen=True, slots=True)
class ReplicaRunner:
    """How a replica's shim is run: the interpreter, and this Tessera's import path (its source root first: the
    shim a replica runs is the server's own version, not whichever the interpreter has installed)."""

    python: str = sys.executable
    path: tuple[str, ...] = (PACKAGE_ROOT,)


def replica_command(
    model: DeployedModel,
    port: int | None,
    server_env: Mapping[str, str] | None = None,
    runner: ReplicaRunner | None = None,
    *,
    api_key: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and the extra environment of one replica of ``model``: listening on its Unix socket
    (``engine_exec --socket``) when ``port`` is None, else on 127.0.0.1:``port``; with ``api_key``, on the port the
    backend picks on the replica's node (``engine_exec --node-port``), requiring that key (given in the
    environment, ``KEY_ENV``: never on the command line, which every user can read). The engine settings in the
    server's environment (``engine_exec.SERVER_ENV``: which interpreter runs the real engines, their extra flags) go
    along, since a workload's environment is otherwise clean; the model's own settings (``engine_settings``) go on
    the command line."""
    given = os.environ if server_env is None else server_env
    runner = runner or ReplicaRunner()
    env = {k: given[k] for k in SERVER_ENV if given.get(k)}
    env |= {MODEL_ENV: model.name, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(runner.path)
    argv = [runner.python, "-m", "tessera.serving.engine_exec", model.engine, "--name", model.name]
    if api_key is not None:
        env[KEY_ENV] = api_key
        argv += ["--node-port"]
    elif port is None:
        argv += ["--socket"]
    else:
        env[PORT_ENV] = str(port)
        argv += ["--port", str(port)]
    if model.weights:
        argv += ["--weights", model.weights]
    return argv + exec_flags(model.engine_settings), env
