"""Replicas where the backend picks ports on the nodes (Ray, played by the fake backend): each replica listens on
its own node's address and the port picked there, and requires a key made for it alone, which the gateway is told
and which appears on no command line and in no API answer."""

from __future__ import annotations

from server_harness import ADMIN, MakeHarness
from test_models_api import controller, deploy, model

from tessera.backends.base import LISTEN_HOST_ENV, LISTEN_PORT_ENV, BackendNode
from tessera.backends.fake import FakeBackend
from tessera.server.serving_plane import ServingPlane
from tessera.serving.engine_exec import KEY_ENV

NODES = [BackendNode("node-a", "10.0.0.1"), BackendNode("node-b", "10.0.0.2")]


def test_a_replica_on_another_node_is_reached_at_that_nodes_address_with_a_key_of_its_own(
    make_harness: MakeHarness,
) -> None:
    backend = FakeBackend(NODES, node_ports=True)
    h = make_harness(backend=backend, hosts={"node-a": "1xA100-80GB", "node-b": "1xA100-80GB"})
    deploy(h, name="chat", engine="sim", gpu_fraction=1.0, min_replicas=2, max_replicas=2)
    controller(h).tick(h.clock())
    h.step()
    shown = model(h, "chat")
    plane = ServingPlane(h.server.ctx)
    [views] = plane.replicas(plane.models()).values()
    launched = {spec.workload_id: spec for spec in backend.launched}
    assert sorted(launched) == sorted(str(i) for i in shown["replica_workloads"]) and len(views) == 2
    keys = set()
    for view in views:
        spec = launched[str(view.workload_id)]
        node = h.get(view.workload_id)["placement"][0]["node"]
        host = {n.name: n.address for n in NODES}[node]
        assert spec.node_port and "--node-port" in spec.argv and spec.env[LISTEN_HOST_ENV] == host
        assert view.address == f"http://{host}:{spec.env[LISTEN_PORT_ENV]}"
        assert view.api_key == spec.env[KEY_ENV] and len(view.api_key) >= 32
        assert not any(view.api_key in arg for arg in spec.argv)
        assert view.api_key not in h.http.get(f"/v1/workloads/{view.workload_id}", headers=h.as_(ADMIN)).text
        keys.add(view.api_key)
    assert len(keys) == 2  # one key per replica: one replica's key opens no other
    assert {h.get(v.workload_id)["placement"][0]["node"] for v in views} == {"node-a", "node-b"}

    gone = views[0].workload_id
    backend.finish(str(gone), 1)
    h.step()
    after = {v.workload_id: v for v in plane.replicas(plane.models())[1]}
    assert gone not in after and len(after) == 1  # an ended replica is no longer offered to the gateway


def test_without_ports_on_nodes_a_replica_keeps_its_loopback_port_and_needs_no_key(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")  # the fake backend as the local one without runtime directories
    deploy(h, name="chat", engine="sim", gpu_fraction=0.5, min_replicas=1, max_replicas=1)
    controller(h).tick(h.clock())
    h.step()
    plane = ServingPlane(h.server.ctx)
    [[view]] = plane.replicas(plane.models()).values()
    [spec] = h.backend.launched
    assert view.address is not None and view.address.startswith("http://127.0.0.1:") and view.api_key is None
    assert "--port" in spec.argv and KEY_ENV not in spec.env and LISTEN_PORT_ENV not in spec.env
