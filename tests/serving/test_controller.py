"""The serving controller against an in-memory control plane: replicas follow the autoscaler within the model's
bounds, surplus replicas leave pending ones first, a deleted model is forgotten only once its replicas are gone,
one model's failure does not stop the others', and replicas that keep failing are replaced with a growing back-off
while the model shows ``failing`` with the last error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tessera.serving.controller import DEFAULT_TARGETS, Controller, Demand, ReplicaView
from tessera.serving.policies.autoscaler import knative_defaults
from tessera.serving.replica_health import BACKOFF_CAP_S, ModelHealth, ReplicaEnd
from tessera.serving.replicas import DeployedModel, replica_command
from tessera.serving.setups import serving_setup

MODEL = DeployedModel(
    id=1, name="chat", tenant="t", queue="t", engine="sim", weights="", gpus=1, gpu_milli=250, gpu_mem_mib=0,
    min_replicas=1, max_replicas=3, idle_timeout_s=30.0, slo="standard",
)  # fmt: skip


class Plane:
    def __init__(self, *models: DeployedModel) -> None:
        self.listed = list(models)
        self.reps: dict[int, list[ReplicaView]] = {m.id: [] for m in models}
        self.next_id = 100
        self.stopped: list[int] = []
        self.forgotten: list[int] = []
        self.desired: dict[int, int] = {}
        self.broken: set[int] = set()
        self.ends: dict[int, ReplicaEnd] = {}
        self.health: dict[int, ModelHealth] = {}
        self.starts: list[int] = []

    def models(self) -> list[DeployedModel]:
        return list(self.listed)

    def replicas(self, models: Sequence[DeployedModel]) -> dict[int, list[ReplicaView]]:
        return {m.id: list(self.reps[m.id]) for m in models}

    def start_replica(self, model: DeployedModel) -> int:
        if model.id in self.broken:
            raise RuntimeError("the store is down")
        self.starts.append(model.id)
        self.next_id += 1
        self.reps[model.id].append(ReplicaView(self.next_id, running=False, address=f"unix:/r/{self.next_id}"))
        return self.next_id

    def stop_replica(self, workload_id: int) -> None:
        self.stopped.append(workload_id)
        for reps in self.reps.values():
            reps[:] = [replace(r, stopping=True) if r.workload_id == workload_id else r for r in reps]

    def record_desired(self, model: DeployedModel, desired: int) -> None:
        self.desired[model.id] = desired

    def forget(self, model: DeployedModel) -> None:
        self.forgotten.append(model.id)
        self.listed = [m for m in self.listed if m.id != model.id]

    def replica_end(self, workload_id: int) -> ReplicaEnd | None:
        return self.ends.get(workload_id)

    def record_health(self, model: DeployedModel, health: ModelHealth) -> None:
        self.health[model.id] = health

    def crash_all(self, line: str) -> None:
        """Every replica ends on its own, as an engine that cannot start does."""
        for reps in self.reps.values():
            for r in reps:
                self.ends[r.workload_id] = ReplicaEnd(r.workload_id, "failed", "exit code 1", line)
            reps.clear()

    def run_all(self) -> None:
        for reps in self.reps.values():
            reps[:] = [replace(r, running=True) for r in reps if not r.stopping]


class Traffic:
    def __init__(self) -> None:
        self.demand: dict[str, Demand] = {}

    def take_demand(self, model_key: str) -> Demand:
        return self.demand.get(model_key, Demand())


def make(plane: Plane, traffic: Traffic | None = None) -> Controller:
    return Controller(plane, traffic or Traffic())


def test_a_model_starts_its_minimum_and_grows_with_its_requests_up_to_its_maximum() -> None:
    plane, traffic = Plane(MODEL), Traffic()
    c = make(plane, traffic)
    c.tick(0.0)
    assert len(plane.reps[1]) == 1 and plane.desired[1] == 1
    plane.run_all()
    for t in range(1, 20):
        traffic.demand["t/chat"] = Demand(in_flight=500, arrivals=50, last_request_s=float(t))
        c.tick(float(t))
        plane.run_all()
    assert len(plane.reps[1]) == 3 and plane.desired[1] == 3  # the maximum, not the 500 / 32 the load asks
    assert len({r.address for r in plane.reps[1]}) == 3  # each replica its own address


def test_scaling_down_cancels_pending_replicas_before_running_ones() -> None:
    model = replace(MODEL, min_replicas=0, max_replicas=2, idle_timeout_s=5.0)
    plane = Plane(model)
    plane.reps[1] = [ReplicaView(7, True, "unix:/r/7"), ReplicaView(8, False, "unix:/r/8")]
    c = make(plane)
    for t in range(0, 120, 2):
        c.tick(float(t))
    assert plane.stopped[0] == 8 and set(plane.stopped) == {7, 8}


def test_a_deleted_model_is_forgotten_only_after_its_replicas_have_ended() -> None:
    plane = Plane(replace(MODEL, deleting=True))
    plane.reps[1] = [ReplicaView(7, running=True, address="unix:/r/7")]
    c = make(plane)
    c.tick(0.0)
    assert plane.stopped == [7] and plane.forgotten == []
    c.tick(1.0)  # still stopping
    assert plane.forgotten == [] and plane.stopped == [7]  # not stopped twice
    plane.reps[1] = []
    c.tick(2.0)
    assert plane.forgotten == [1]


def test_one_failing_model_does_not_stop_the_others() -> None:
    other = replace(MODEL, id=2, name="other")
    plane = Plane(MODEL, other)
    plane.reps[2] = []
    plane.broken.add(1)
    make(plane).tick(0.0)
    assert len(plane.reps[2]) == 1 and plane.desired[2] == 1 and not plane.reps[1]


def test_a_replica_listens_on_its_private_socket_and_names_no_port_or_secret_on_its_command_line() -> None:
    argv, env = replica_command(replace(MODEL, engine="sim"), None)
    assert argv[1:] == ["-m", "tessera.serving.engine_exec", "sim", "--name", "chat", "--socket"]
    assert "TESSERA_ENGINE_PORT" not in env  # its address is its runtime directory's, known only at launch


def test_a_replica_runs_the_engine_shim_on_its_own_port() -> None:
    argv, env = replica_command(replace(MODEL, engine="vllm", weights="/models/smol"), 41_234)
    assert argv[1:] == [
        "-m", "tessera.serving.engine_exec", "vllm", "--name", "chat", "--port", "41234", "--weights", "/models/smol",
    ]  # fmt: skip
    assert env["TESSERA_ENGINE_PORT"] == "41234" and env["HF_HUB_OFFLINE"] == "1"


def test_replicas_that_keep_failing_are_replaced_with_a_growing_back_off_and_the_model_shows_failing() -> None:
    """An engine that cannot start (``--model /nonexistent``) once had 55 replicas started and failed in 60 s with
    no back-off while the model showed ready. Each start now waits twice as long as the last, up to a cap."""
    plane = Plane(MODEL)
    c = make(plane)
    starts_at: list[float] = []
    for t in range(0, 700):
        before = len(plane.starts)
        c.tick(float(t))
        starts_at += [float(t)] * (len(plane.starts) - before)
        plane.crash_all("FileNotFoundError: /nonexistent")
    gaps = [b - a for a, b in zip(starts_at, starts_at[1:], strict=False)]
    # seen ended at the next tick, then 1 s of back-off after the first failure, doubling with each one after
    assert gaps[:6] == [2.0, 3.0, 5.0, 9.0, 17.0, 33.0]
    assert max(gaps) <= BACKOFF_CAP_S + 1 and len(starts_at) < 20  # not one per tick
    health = plane.health[1]
    assert health.failing and health.last_error == "exit code 1: FileNotFoundError: /nonexistent"
    assert health.retry_at_s is not None and health.retry_at_s > 699


def test_a_replica_that_becomes_ready_ends_the_failure_streak() -> None:
    plane = Plane(MODEL)
    c = make(plane)
    for t in range(0, 4):
        c.tick(float(t))
        plane.crash_all("boom")
    assert plane.health[1].failing
    for t in range(4, 40):
        c.tick(float(t))
        plane.run_all()
    assert plane.health[1] == ModelHealth(None, 0, "", None)


def test_a_replica_that_cannot_even_be_submitted_is_a_failure_too() -> None:
    plane = Plane(MODEL)
    plane.broken.add(1)  # e.g. no interpreter the tenant's user may run
    c = make(plane)
    for t in range(0, 10):
        c.tick(float(t))
    assert plane.health[1].failing and "cannot start a replica: the store is down" in plane.health[1].last_error
    assert plane.health[1].failures < 10  # backing off, not one try per tick


def test_the_autoscaler_is_the_models_own_else_the_setups_and_none_keeps_a_fixed_number() -> None:
    fixed = replace(MODEL, id=2, name="fixed", min_replicas=2, autoscaler="none")
    plane, traffic = Plane(MODEL, fixed), Traffic()
    c = Controller(plane, traffic, setup=serving_setup("static"))  # static: no autoscaler for anyone
    for t in range(5):
        traffic.demand["t/chat"] = traffic.demand["t/fixed"] = Demand(in_flight=500, last_request_s=float(t))
        c.tick(float(t))
        plane.run_all()
    assert (plane.desired[1], plane.desired[2]) == (1, 2)  # fixed: min_replicas (at least one), whatever the load
    knative = replace(MODEL, autoscaler="knative")
    assert c.config(knative, "knative").target_concurrency == knative_defaults().target_concurrency
    assert c.config(knative, "knative").scale_to_zero_grace_s == knative.idle_timeout_s  # the model's own


def test_tessera_aims_at_the_sequences_a_replicas_kv_cache_holds_as_the_twin_does() -> None:
    """The twin's target: a replica's KV tokens over the model's mean footprint (``concurrency_target``); without a
    KV size from the engines, the engine's default target."""
    c = make(Plane(MODEL))
    sizing = serving_setup("tessera").sizing
    held = Demand(kv_tokens_per_replica=24_576, tokens_per_sequence=800.0)
    assert c.config(MODEL, "tessera", held).target_concurrency == round(24_576 / 800)
    assert c.config(MODEL, "tessera", Demand(kv_tokens_per_replica=24_576)).target_concurrency == round(
        24_576 / sizing.tokens_per_sequence
    )
    assert c.config(MODEL, "tessera", Demand()).target_concurrency == DEFAULT_TARGETS["sim"]
    config = c.config(MODEL, "tessera", held)
    assert (config.ttft_target_s, config.tpot_target_s) == (2.0, 0.2)  # the interactive class's, as the twin


def test_slow_first_tokens_add_a_replica_and_a_slow_start_keeps_the_model_off_zero() -> None:
    model = replace(MODEL, min_replicas=0, max_replicas=4, idle_timeout_s=5.0, slo="interactive")
    plane, traffic = Plane(model), Traffic()
    c = Controller(plane, traffic, readiness=lambda workload_id, attempt: True)
    traffic.demand["t/chat"] = Demand(in_flight=1, last_request_s=0.0)
    c.tick(0.0)  # scale from zero: one replica asked for at t=0
    plane.run_all()
    c.tick(3.0)  # it serves 3 s later: longer than half the interactive TTFT target
    traffic.demand["t/chat"] = Demand(in_flight=2, queued=1, last_request_s=3.0, ttft_recent_s=1.9)
    c.tick(4.0)
    assert plane.desired[1] == 2  # SLO feedback: one more than the load alone asks
    traffic.demand["t/chat"] = Demand(last_request_s=4.0)
    plane.run_all()
    c.tick(7.0)  # the second replica too serves 3 s after it was asked for
    for t in range(8, 200):
        c.tick(float(t))
    assert plane.desired[1] >= 1  # a replica takes 3 s to serve: zero would miss the 2 s TTFT target
    quick = Controller(Plane(replace(model, slo="standard")), Traffic(), readiness=lambda w, a: True)
    quick.plane.reps[1] = [ReplicaView(7, True, "unix:/r/7")]  # type: ignore[attr-defined]
    for t in range(0, 200):
        quick.tick(float(t))
    assert quick.plane.desired[1] == 0  # type: ignore[attr-defined]  # no start measured: it may go to zero
