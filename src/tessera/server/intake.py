"""The scheduler loop's waiting workloads, as the scheduler is offered them (``Intake``).

Stored pending workloads become ``PendingWorkload`` values once (their request as the preset places it) and join a
``core.pending.PendingOffer``, the same structure the simulator offers its steps from: the first workload of each
request shape, a failed shape again only after a release. The intake also keeps the LAS rechecks: when a running
workload's LAS level drops or its preemption guard expires, failed shapes are offered again (the simulator's recheck
events). Used by ``server.loop``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from tessera.core.allocation import gpus_held
from tessera.core.pending import PendingOffer, Shape
from tessera.core.presets import ONE_QUEUE, Preset
from tessera.core.scheduler import PendingWorkload, QueueDiscipline, Scheduler
from tessera.server.records import request_of
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import PendingRow


class Intake:
    def __init__(self, preset: Preset, scheduler: Callable[[], Scheduler]) -> None:
        self.preset = preset
        self.scheduler = scheduler  # the loop's current scheduler
        self.pending: dict[int, PendingWorkload] = {}  # built once per workload; whole rows are read at bind
        self.now_s = 0.0  # the current tick's time (shapes carry LAS priorities as of now)
        self.own_queues = False  # False: no queues are stored, workloads run in the preset's one queue
        self.offer = self._new_offer()
        self._rechecks: list[tuple[float, str, float]] = []  # LAS: (when, workload, its run's start)

    def reset(self, own_queues: bool) -> None:
        """The queues changed: every workload is read again (its queue may change)."""
        self.own_queues = own_queues
        self.pending.clear()
        self.offer = self._new_offer()

    def sync(self, stored: set[int], load: Callable[[list[int]], Iterable[PendingRow]]) -> list[int]:
        """The offer holds exactly the ``stored`` pending ids (new ones added in submission order, read with
        ``load``); returns the ids that are no longer pending."""
        gone = sorted(self.pending.keys() - stored)
        for wid in gone:
            self.offer.remove(str(wid))
            del self.pending[wid]
        for row in load(sorted(stored - self.pending.keys())):
            self.add(row)
        return gone

    def add(self, row: WorkloadRow | PendingRow) -> None:
        """``row`` waits (again): it joins the end of its shape's line."""
        if row.id not in self.pending:
            self.pending[row.id] = self.workload(row)
            self.offer.add(str(row.id))

    def bound(self, workload_id: str) -> PendingWorkload:
        """``workload_id`` was bound: it leaves the offer; returns it as it was offered (for ``put_back``)."""
        self.offer.remove(workload_id)
        return self.pending.pop(int(workload_id))

    def put_back(self, workloads: Sequence[PendingWorkload]) -> None:
        """``workloads`` were bound and their binds undone (not stored): they wait again at the head of their lines,
        in the order given (those the intake holds again already stay where they are)."""
        back = [w for w in workloads if int(w.workload_id) not in self.pending]
        for workload in back:
            self.pending[int(workload.workload_id)] = workload
        self.offer.put_back([w.workload_id for w in back])

    def offered(self, workload_id: str) -> PendingWorkload:
        return self.pending[int(workload_id)]

    def workload(self, row: WorkloadRow | PendingRow) -> PendingWorkload:
        """A stored workload as the scheduler is handed it: its request as the preset places it, without queues in
        the preset's one queue, its workers as a gang, its elastic range when the preset runs elastic workloads
        (``Preset.elastic_bounds``: a live workload's run is work that more workers do faster). Its priority class
        says whether it may be preempted; ``--checkpointable`` that it resumes from its own checkpoints (presets
        that preempt only resumable work, e.g. LAS, preempt only those), as the simulator's jobs say both."""
        request = self.preset.request_of(request_of(row))
        queue = row.queue if self.own_queues else ONE_QUEUE
        preemptible = bool(row.preemptible)
        elastic_min, elastic_max = self.preset.elastic_bounds(row.elastic_min, row.elastic_max, False)
        return PendingWorkload(
            str(row.id),
            request,
            row.submitted_at,
            row.priority,
            queue,
            gang=int(row.workers or 1),
            preemptible=preemptible,
            checkpointed=bool(row.checkpointable),
            elastic_min=elastic_min,
            elastic_max=elastic_max,
        )

    # ---------------------------------------------------------------------------------------------- rechecks

    def recheck(self, now_s: float) -> None:
        """A running workload whose LAS level dropped or whose guard expired by ``now_s`` may now be a victim:
        failed shapes are offered again."""
        books = self.scheduler().books
        while self._rechecks and self._rechecks[0][0] <= now_s:
            _, workload_id, started_s = heapq.heappop(self._rechecks)
            running = books.running.get(workload_id)
            if running is not None and running.started_s == started_s:
                self.offer.released()

    def started(self, workload_id: str, now_s: float) -> None:
        """LAS: when the run of ``workload_id`` that starts at ``now_s`` drops a level or leaves its guard."""
        scheduler = self.scheduler()
        las = scheduler.books.las
        if las is None:
            return
        running = scheduler.books.running[workload_id]
        delays = las.recheck_delays(workload_id, gpus_held(running.placements))
        delays.append(scheduler.config.preemption_min_runtime_s)
        for delay in delays:
            heapq.heappush(self._rechecks, (now_s + delay, workload_id, now_s))

    def _shape(self, workload_id: str) -> Shape:
        w = self.scheduler().effective(self.pending[int(workload_id)], self.now_s)
        return (w.request, w.gang, w.priority, w.queue, w.preemptible, w.elastic_min)

    def _new_offer(self) -> PendingOffer:
        strict = self.preset.discipline is QueueDiscipline.STRICT_FIFO
        return PendingOffer(strict, self._shape, lambda w: self.pending[int(w)].queue)
