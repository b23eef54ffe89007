"""``GET /v1/config`` and ``/healthz`` say which scheduler a server runs, named as ``tessera simulate`` names it, so a
tenant can replay its workload in the twin with the cluster's very configuration (issue 26: one registry per policy
family, reported by the server)."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, MakeHarness

from tessera.core.errors import InvalidRequestError
from tessera.core.placement import PLACEMENTS
from tessera.core.presets import PRESETS
from tessera.server.up import UpConfig


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


def test_the_serving_setup_in_force_is_reported_with_its_knobs_and_followed_by_models(
    make_harness: MakeHarness,
) -> None:
    """tessera up --serving-setup static-autoscale --serving-set router=least-load: /v1/config says so, as
    simulate serving --setup static-autoscale --set router=least-load would replay it, and a model deployed without
    a router or an autoscaler takes the setup's."""
    h = make_harness(serving_setup="static-autoscale", serving_knobs=("router=least-load",))
    serving = h.http.get("/v1/config", headers=h.as_(ADMIN)).json()["serving"]
    assert (serving["name"], serving["router"], serving["autoscaler"]) == ("static-autoscale", "least-load", "knative")
    assert (serving["late_binding"], serving["admission"], serving["tick_s"]) == (False, False, 2.0)
    assert serving["knobs"] == ["router=least-load"] and "late_binding" in serving["knob_names"]
    assert serving["setups"] == ["static", "static-autoscale", "tessera"]
    body = {"name": "chat", "engine": "sim", "gpu_fraction": 0.25}
    model = h.http.post("/v1/models", json=body, headers=h.as_(ADMIN)).json()
    assert (model["router"], model["autoscaler"], model["serving_setup"]) == (
        "least-load",
        "knative",
        "static-autoscale",
    )


@pytest.mark.parametrize(
    ("setup", "knobs", "option", "words"),
    [
        ("ray-serve", (), "--serving-setup", "unknown serving setup 'ray-serve'"),
        ("tessera", ("router=fastest",), "--serving-set", "router:"),
        ("tessera", ("late_binding",), "--serving-set", "not KEY=VALUE"),
    ],
)
def test_a_bad_serving_setup_or_knob_names_its_option(
    setup: str, knobs: tuple[str, ...], option: str, words: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        UpConfig(serving_setup=setup, serving_knobs=knobs)
    assert caught.value.field == option and words in caught.value.message
