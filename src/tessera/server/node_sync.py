"""Nodes that join and leave while the server runs: the pool and the scheduler's books follow a node feed.

A backend whose nodes come and go (the Ray backend: ``server.ray_up``) gives a ``NodeFeed``, polled on its own thread
(never inside a step). ``NodeFollower.follow`` runs on the loop's thread after each step (``build_server`` chains it
into the loop's ``on_step``): when the feed has news, or a node is still draining, ``sync_nodes`` brings the pool and
the scheduler's books in line, the changes are stored as events, the scheduler is configured again (the one
whole-cluster queue's quota follows the cluster) and failed request shapes are offered again, so a node that joined
gets work at the next step:

- a node in the feed and not in the pool is added (``ClusterState.add_node`` and ``Pool.add_node``, same index);
  one whose GPU model the scheduler's state does not know is refused (logged once), as the state's model indices
  never change;
- a node in the pool and not in the feed (lost, or declared differently now) is drained at once: nothing new is
  placed there. What runs there is not ended here: the backend reports each end (the Ray backend once Ray declares
  the actor dead, exit code unknown) and the loop's usual end policy decides (failed; a service restarts; a
  preempted one is requeued), so a workload is never started elsewhere while its process may still run. Once
  nothing is bound there the node is removed (its index kept, empty). A node declared differently is added anew
  after that, at a new index;
- a drained node that is back in the feed unchanged before it was removed takes new work again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.presets import scheduler_config
from tessera.gpu.gpus import GpuDevice
from tessera.server.loop import SchedulerLoop
from tessera.server.loop_values import StepReport
from tessera.server.pool import Pool
from tessera.server.store.store import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolNode:
    """One node as the backend declares it: the core's spec and its GPUs in index order."""

    spec: NodeSpec
    devices: tuple[GpuDevice, ...]


NodeFeed = Callable[[], Sequence[PoolNode] | None]  # the nodes now; None when nothing changed since the last call


@dataclass(slots=True)
class NodeChanges:
    added: list[int] = field(default_factory=list)  # pool indices
    drained: list[int] = field(default_factory=list)
    undrained: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # names of nodes the state cannot take (an unknown GPU model)

    def __bool__(self) -> bool:
        return bool(self.added or self.drained or self.undrained or self.removed)


def sync_nodes(state: ClusterState, pool: Pool, wanted: Sequence[PoolNode], refused: set[str]) -> NodeChanges:
    """Bring ``state`` and ``pool`` in line with ``wanted`` (see the module docstring). ``refused`` holds the names
    refused before (not logged again); returns what changed. Pending: ``draining(state, pool)``."""
    by_name = {node.spec.name: node for node in wanted}
    changes = NodeChanges()
    present: set[str] = set()
    for index, spec in enumerate(pool.nodes):
        if index in pool.gone:
            continue
        want = by_name.get(spec.name)
        if want is not None and _same(want, spec, pool.devices[index]):
            present.add(spec.name)
            if state.drained[index]:
                state.undrain(index)
                changes.undrained.append(index)
            continue
        if not state.drained[index]:
            state.drain(index)
            changes.drained.append(index)
        if state.bound[index] == 0:
            state.remove_node(index)
            pool.remove_node(index)
            changes.removed.append(index)
        else:
            present.add(spec.name)  # its name is taken until it is removed
    for name, node in by_name.items():
        if name in present:
            continue
        try:
            index = state.add_node(node.spec)
        except InvalidRequestError as error:
            changes.refused.append(name)
            if name not in refused:
                log.warning("node %s joined but cannot be scheduled on: %s", name, error.message)
            continue
        if pool.add_node(node.spec, node.devices) != index:  # both append: the indices always agree
            raise AssertionError(f"node {name}: pool and scheduler state disagree on its index")
        changes.added.append(index)
    return changes


def draining(state: ClusterState, pool: Pool) -> bool:
    """Whether a node is drained and not removed yet (``sync_nodes`` must run again to remove it)."""
    return any(bool(state.drained[i]) for i in range(len(pool.nodes)) if i not in pool.gone)


def _same(want: PoolNode, spec: NodeSpec, devices: Sequence[GpuDevice]) -> bool:
    return want.spec == spec and [d.uuid for d in want.devices] == [d.uuid for d in devices]


class NodeFollower:
    """The loop's pool follows ``feed`` (see the module docstring); ``follow`` is called after each step."""

    def __init__(self, feed: NodeFeed, loop: SchedulerLoop) -> None:
        self.feed, self.loop = feed, loop
        self._wanted: list[PoolNode] | None = None  # the feed's latest nodes
        self._refused: set[str] = set()
        self._then: Callable[[StepReport], None] | None = None

    def attach(self) -> None:
        """Follow the feed after each of the loop's steps (before what ``on_step`` did so far)."""
        self._then, self.loop.on_step = self.loop.on_step, self._after_step

    def _after_step(self, report: StepReport) -> None:
        self.follow()
        if self._then is not None:
            self._then(report)

    def follow(self) -> NodeChanges | None:
        loop = self.loop
        news = self.feed()
        if news is not None:
            self._wanted = list(news)
        elif self._wanted is None or not draining(loop.state, loop.pool):
            return None
        changes = sync_nodes(loop.state, loop.pool, self._wanted, self._refused)
        self._refused = set(changes.refused)
        if changes:
            self._apply(changes)
        return changes

    def _apply(self, changes: NodeChanges) -> None:
        loop, now = self.loop, self.loop.clock()
        names = loop.pool.nodes
        events = [Event(None, "node-joined", f"node {names[i].name} joined") for i in changes.added]
        events += [Event(None, "node-back", f"node {names[i].name} is back") for i in changes.undrained]
        events += [Event(None, "node-removed", f"node {names[i].name} left the pool") for i in changes.removed]
        for index in changes.drained:
            events.append(Event(None, "node-lost", f"node {names[index].name} left the cluster; drained"))
            for entry in loop.running.values():
                if any(p.node == index for p in entry.placements):
                    text = f"its node {names[index].name} left the cluster; it ends when the backend reports it"
                    events.append(Event(entry.row.id, "node-lost", text))
        for event in events:
            log.log(logging.WARNING if event.kind == "node-lost" else logging.INFO, "%s", event.message)
        loop.store.update_workloads([], events, now)
        config = scheduler_config(loop.preset, loop.state, loop.queue_specs, loop.config.max_tries_per_step)
        loop.scheduler.reconfigure(config)  # a new ledger, charged again with what runs
        for wid, entry in loop.running.items():
            if entry.admission is not None and str(wid) in loop.scheduler.books.uncharged:
                entry.admission = None  # as after a queue change: it keeps running, uncharged
        loop.intake.offer.released()  # shapes that failed may fit now
