"""Nodes that join and leave while the server runs (``server.node_sync``), in process with the fake backend and a
feed the test sets by hand: a node that joins gets the work that waited for it; a node that leaves is drained at
once and removed only once what ran there has ended (by the backend's report, through the usual end policy); one
that comes back before that takes work again; a GPU model the scheduler does not know is refused."""

from __future__ import annotations

from collections.abc import Sequence

from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.cluster import NodeSpec
from tessera.gpu.gpus import parse_gpu_spec
from tessera.server.node_sync import NodeFollower, PoolNode


class Feed:
    def __init__(self) -> None:
        self.news: list[PoolNode] | None = None

    def set(self, nodes: Sequence[PoolNode]) -> None:
        self.news = list(nodes)

    def __call__(self) -> list[PoolNode] | None:
        news, self.news = self.news, None
        return news


def node(name: str, spec: str) -> PoolNode:
    devices = tuple(parse_gpu_spec(spec, node=name))
    return PoolNode(NodeSpec(name, 8_000, 64 * 1024, len(devices), devices[0].model), devices)


def setup(make_harness: MakeHarness) -> tuple[Harness, Feed, PoolNode]:
    h = make_harness("1xA100-80GB")
    feed = Feed()
    NodeFollower(feed, h.server.ctx.loop).attach()
    pool = h.server.ctx.pool
    return h, feed, PoolNode(pool.nodes[0], pool.devices[0])


def node_names(h: Harness) -> list[str]:
    return [n["name"] for n in h.http.get("/v1/nodes", headers=h.as_(ADMIN)).json()]


def test_a_node_that_joins_takes_the_work_that_waited(make_harness: MakeHarness) -> None:
    h, feed, first = setup(make_harness)
    running = h.submit(gpus=1)["id"]
    waiting = h.submit(gpus=1)["id"]
    h.step()
    assert h.get(waiting)["state"] == "pending"
    feed.set([first, node("n2", "1xA100-80GB")])
    h.step()  # the follower runs after the step: the next one places on n2
    h.step()
    assert h.get(running)["state"] == "running" and h.get(waiting)["state"] == "running"
    assert h.get(waiting)["placement"][0]["node"] == "n2"
    assert node_names(h) == [first.spec.name, "n2"]


def test_a_node_that_leaves_is_drained_then_removed_once_its_workload_ended(make_harness: MakeHarness) -> None:
    h, feed, first = setup(make_harness)
    feed.set([first, node("n2", "1xA100-80GB")])
    h.step()
    on_n2 = [h.submit(gpus=1)["id"] for _ in range(2)]
    h.step()
    assert {h.get(w)["placement"][0]["node"] for w in on_n2} == {first.spec.name, "n2"}
    lost = next(w for w in on_n2 if h.get(w)["placement"][0]["node"] == "n2")
    feed.set([first])  # n2 is lost with a workload on it
    h.step()
    loop = h.server.ctx.loop
    index = 1
    assert loop.state.drained[index] and not loop.state.gone[index]  # kept until the backend reports the end
    later = h.submit(gpus=1)["id"]
    h.step()
    assert h.get(later)["state"] == "pending"  # nothing new goes to a drained node
    h.backend.finish(str(lost), None)  # the backend reports it gone, exit code unknown
    h.step()
    h.step()
    assert h.get(lost)["state"] == "failed" and h.get(lost)["attempts"] == 1
    assert loop.state.gone[index] and index in h.server.ctx.pool.gone
    assert node_names(h) == [first.spec.name]
    kinds = [e["kind"] for e in h.http.get(f"/v1/workloads/{lost}/events", headers=h.as_(ADMIN)).json()]
    assert "node-lost" in kinds
    feed.set([first, node("n2", "1xA100-80GB")])  # back: a new index, and the waiting workload goes there
    h.step()
    h.step()
    assert h.get(later)["state"] == "running" and h.get(later)["placement"][0]["node"] == "n2"
    assert h.server.ctx.pool.node_index["n2"] == 2


def test_a_node_back_before_its_removal_takes_work_again(make_harness: MakeHarness) -> None:
    h, feed, first = setup(make_harness)
    second = node("n2", "1xA100-80GB")
    feed.set([first, second])
    h.step()
    kept = [h.submit(gpus=1, gpu_fraction=0.5)["id"] for _ in range(4)]
    h.step()
    feed.set([first])
    h.step()
    assert h.server.ctx.loop.state.drained[1]
    feed.set([first, second])  # a blip: back before its workloads ended
    h.step()
    loop = h.server.ctx.loop
    assert not loop.state.drained[1] and not loop.state.gone[1]
    assert {h.get(w)["state"] for w in kept} == {"running"}


def test_a_node_of_an_unknown_gpu_model_is_refused(make_harness: MakeHarness) -> None:
    h, feed, first = setup(make_harness)
    feed.set([first, node("t4", "1xT4")])
    h.step()
    h.step()
    assert node_names(h) == [first.spec.name]
    assert h.server.ctx.loop.state.num_nodes == 1
