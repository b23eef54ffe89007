"""``GET /v1/config`` and ``/healthz`` say which scheduler a server runs, named as ``tessera simulate`` names it, so a
tenant can replay its workload in the twin with the cluster's very configuration (issue 26: one registry per policy
family, reported by the server)."""

from __future__ import annotations

from server_harness import ADMIN, MakeHarness

from tessera.core.placement import PLACEMENTS
from tessera.core.presets import PRESETS


def test_a_tenant_reads_the_preset_the_placement_and_every_knob(make_harness: MakeHarness) -> None:
    h = make_harness(policy="tessera")
    tenant = h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"]
    config = h.http.get("/v1/config", headers=h.as_(tenant))
    assert config.status_code == 200, config.text
    body = config.json()
    preset = PRESETS["tessera"]
    assert body["policy"] == "tessera" and body["placement"] == preset.placement
    assert body["placement_summary"] == PLACEMENTS[preset.placement].summary
    assert body["elastic"] is preset.elastic and body["borrowing"] is preset.borrowing
    assert body["discipline"] == "BestEffortFIFO" and body["las_thresholds_gpu_s"] == [3600.0, 36000.0]
    assert set(body["placements"]) == set(PLACEMENTS) and "static" in body["presets"]
    assert h.http.get("/v1/config").status_code == 401  # a token, any token


def test_a_placement_given_to_the_server_is_the_one_reported(make_harness: MakeHarness) -> None:
    h = make_harness(policy="fifo-share", placement="packing")
    config = h.http.get("/v1/config", headers=h.as_(ADMIN)).json()
    health = h.http.get("/healthz").json()
    assert (config["policy"], config["placement"]) == ("fifo-share", "packing")
    assert (health["policy"], health["placement"]) == ("fifo-share", "packing")
