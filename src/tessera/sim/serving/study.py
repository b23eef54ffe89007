"""A serving study: every policy on every seed's workload, on a fixed cluster or the smallest one that meets the
SLOs, through the same twin.

Cluster sizes (nodes of 8 GPUs of ``--gpus``'s model, H100-80GB by default):

- ``static`` is sized per model for its own peak: the smallest replica count with which that model alone meets
  its SLOs for >= 99% of its requests (never below one), found by doubling then bisection on a replay of that
  model's requests. Its cluster is the nodes those replicas need.
- With ``--gpus SPEC`` every other policy runs on that cluster. Without it, they run on static's cluster (the
  cluster a team that provisions statically has).
- With ``--gpus-for-slo`` each autoscaling policy gets the fewest GPUs (bisection over nodes between none and
  twice static's, then over the GPUs of the last node, which may be partly filled) with which every model meets its
  SLOs; the run reported is the one on that cluster. A policy that
  misses the SLOs even on the largest cluster tried is reported there, with its attainment.

GPU-hours are counted over the trace's duration (``fleet``): the GPUs holding a replica, integrated over time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tessera.core.cluster import NodeSpec
from tessera.serving.setups import PolicySetup, serving_setup
from tessera.serving.sizing import replica_shapes
from tessera.sim.serving.config import GpuCluster, StudyConfig, parse_gpu_cluster
from tessera.sim.serving.perf_choice import make_perf_factory
from tessera.sim.serving.result import PolicyRun
from tessera.sim.serving.twin import PerfFactory, ProvisioningError, Twin, TwinInputs
from tessera.sim.serving.workload import Workload, assign_models, build_workload

Progress = Callable[[str, float], None]
SLO_PCT = 99.0
DEFAULT_GPUS = "8xH100-80GB"
MAX_STATIC_REPLICAS = 256


def nodes_for(gpus: int, cluster: GpuCluster) -> list[NodeSpec]:
    """``gpus`` GPUs in nodes of ``gpus_per_node``, the last one holding the rest."""
    per = cluster.gpus_per_node
    full, rest = divmod(max(1, gpus), per)
    sizes = [per] * full + ([rest] if rest else [])
    return [NodeSpec(f"node-{i:03d}", 128_000, 2_048_000, n, cluster.model.name) for i, n in enumerate(sizes)]


def check_models_fit(config: StudyConfig) -> None:
    """Raise ``ModelDoesNotFitError`` (naming ``--gpus``) now, before any run, when a model of the study has no
    room for a KV cache on the cluster's GPUs under one of the policies."""
    kind = parse_gpu_cluster(config.gpus or DEFAULT_GPUS)
    for served in assign_models(config.models, config.zipf, config.mix, config.model_book().specs):
        for policy in config.policies:
            replica_shapes(served.spec, kind.model.name, config.setup(policy).sizing)


def run_study(config: StudyConfig, progress: Progress | None = None) -> list[PolicyRun]:
    """One run per (policy, seed), in the order of ``config.policies`` then ``config.seeds``. ``progress(label,
    fraction)`` reports each run's advance, ending at 1.0 for every (policy, seed), whichever way its run was found
    (the ``--gpus-for-slo`` search may stop early: then its bar stood at the fraction reached)."""
    trace = config.load_trace()
    book = config.model_book()
    perf = make_perf_factory(config.perf_profile, book=book)
    kind = parse_gpu_cluster(config.gpus or DEFAULT_GPUS)
    runs: dict[tuple[str, int], PolicyRun] = {}
    for seed in config.seeds:
        workload = build_workload(
            trace, config.models, config.zipf, config.load, seed, model_sizes=config.mix, known=book.specs
        )
        study = _SeedStudy(workload, perf, kind, seed, progress, frozenset(config.policies), config.setup)
        for policy in config.policies:
            if policy == "static":
                runs[(policy, seed)] = study.static()
            elif config.gpus_for_slo:
                runs[(policy, seed)] = study.smallest(policy)
            else:
                gpus = kind.count if config.gpus else study.static_gpus()
                runs[(policy, seed)] = study.run(policy, nodes_for(gpus, kind))
            study.report(policy, 1.0)
    return [runs[(p, s)] for p in config.policies for s in config.seeds]


class _SeedStudy:
    def __init__(
        self,
        workload: Workload,
        perf: PerfFactory,
        kind: GpuCluster,
        seed: int,
        progress: Progress | None,
        shown: frozenset[str],
        setup: Callable[[str], PolicySetup] = serving_setup,
    ) -> None:
        self.workload = workload
        self.setup = setup  # a setup by name, with the study's knobs
        self.perf = perf
        self.kind = kind
        self.seed = seed
        self.progress = progress
        # The policies with a progress bar (the study's): static's sizing, which the others' clusters are sized from,
        # advances static's bar only when static is studied, not a bar of its own that would never end.
        self.shown = shown
        self._static_sizes: dict[str, int] | None = None
        self._static_run: PolicyRun | None = None

    def report(self, policy: str, fraction: float) -> None:
        if self.progress is not None and policy in self.shown:
            self.progress(f"{policy} seed {self.seed}", min(max(fraction, 0.0), 1.0))

    def inputs(self, nodes: list[NodeSpec], fixed: dict[str, int] | None = None, only: str | None = None) -> TwinInputs:
        w = self.workload
        models = {m.name: m.spec for m in w.models if only is None or m.name == only}
        requests = w.requests if only is None else [r for r in w.requests if r.model == only]
        return TwinInputs(requests, models, w.duration_s, nodes, self.perf, fixed_replicas=fixed or {})

    def run(self, policy: str, nodes: list[NodeSpec], fraction: tuple[float, float] = (0.0, 1.0)) -> PolicyRun:
        lo, hi = fraction
        twin = Twin(self.inputs(nodes), self.setup(policy), self.seed)
        return twin.run(lambda f: self.report(policy, lo + (hi - lo) * f))

    # ---------------------------------------------------------------------------------------------- static
    def static_sizes(self) -> dict[str, int]:
        if self._static_sizes is None:
            sizes: dict[str, int] = {}
            for i, m in enumerate(self.workload.models):
                sizes[m.name] = self._replicas_for_peak(m.name, m.spec.tensor_parallel)
                self.report("static", 0.5 * (i + 1) / len(self.workload.models))
            self._static_sizes = sizes
        return self._static_sizes

    def static_gpus(self) -> int:
        specs = {m.name: m.spec for m in self.workload.models}
        return sum(n * specs[name].tensor_parallel for name, n in self.static_sizes().items())

    def _meets_alone(self, model: str, replicas: int, tp: int) -> bool:
        nodes = nodes_for(replicas * tp, self.kind)
        twin = Twin(self.inputs(nodes, {model: replicas}, only=model), self.setup("static"), self.seed)
        return twin.run().meets_slo(SLO_PCT)

    def _replicas_for_peak(self, model: str, tp: int) -> int:
        """The fewest replicas with which ``model`` alone meets its SLOs (doubling, then bisection)."""
        hi = 1
        while not self._meets_alone(model, hi, tp):
            if hi >= MAX_STATIC_REPLICAS:
                return hi
            hi *= 2
        lo = hi // 2  # fails (or 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._meets_alone(model, mid, tp):
                hi = mid
            else:
                lo = mid
        return hi

    def static(self) -> PolicyRun:
        if self._static_run is None:
            sizes = self.static_sizes()
            gpus = self.static_gpus()
            nodes = nodes_for(gpus, self.kind)
            while True:  # tensor-parallel replicas may leave holes a node short: add nodes until all fit
                try:
                    twin = Twin(self.inputs(nodes, sizes), self.setup("static"), self.seed)
                    self._static_run = twin.run(lambda f: self.report("static", 0.5 + 0.5 * f))
                    break
                except ProvisioningError:
                    nodes = nodes_for(len(nodes) * self.kind.gpus_per_node + self.kind.gpus_per_node, self.kind)
        return self._static_run

    # ------------------------------------------------------------------------------------------- the search
    def smallest(self, policy: str) -> PolicyRun:
        """The run on the fewest GPUs where every model meets its SLOs (see the module docstring): bisection over
        whole nodes, then over the GPUs of the last node."""
        per = self.kind.gpus_per_node
        top = 2 * max(1, math.ceil(self.static_gpus() / per)) * per
        tried: dict[int, PolicyRun | None] = {}

        def meets(gpus: int) -> bool:
            if gpus not in tried:
                fraction = (len(tried) / 10, (len(tried) + 1) / 10)
                try:
                    tried[gpus] = self.run(policy, nodes_for(gpus, self.kind), fraction)
                except ProvisioningError:  # the initial replicas do not fit
                    tried[gpus] = None
            run = tried[gpus]
            return run is not None and run.meets_slo(SLO_PCT)

        if not meets(top):
            best = tried[top]
            return best if best is not None else self.run(policy, nodes_for(2 * top, self.kind))
        lo, hi = 0, top // per  # in nodes: lo fails (or is nothing), hi meets
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid * per) else (mid, hi)
        lo, hi = lo * per, hi * per  # in GPUs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if meets(mid) else (mid, hi)
        self.report(policy, 1.0)
        best = tried[hi]
        assert best is not None
        return best
