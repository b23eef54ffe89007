"""A preset's knobs set by name (``tessera up --set`` and ``simulate timeline --set``): each is a field of the preset,
parsed one way for both runtimes; a bad key or value names the option and the key."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.core.decisions import QueueDiscipline
from tessera.core.errors import InvalidRequestError
from tessera.core.preset_knobs import KNOBS, knob_label, parse_knobs, with_knobs
from tessera.core.presets import PRESETS, Preset


def test_every_preset_field_but_its_name_and_placement_is_a_knob() -> None:
    fields = {f.name for f in dataclasses.fields(Preset)} - {"name", "placement"}
    assert set(KNOBS) == fields


def test_knobs_change_the_preset_and_keep_its_name() -> None:
    tessera = PRESETS["tessera"]
    changed = with_knobs(tessera, ["elastic=false", "discipline=strictfifo", "las-thresholds-gpu-s=60,600"])
    assert changed.name == "tessera" and not changed.elastic
    assert changed.discipline is QueueDiscipline.STRICT_FIFO and changed.las_thresholds_gpu_s == (60.0, 600.0)
    assert with_knobs(tessera, ["las_thresholds_gpu_s=none"]).las_thresholds_gpu_s == ()
    assert with_knobs(tessera, []) is tessera
    assert knob_label(["elastic=off", "elastic=on"]) == "[elastic=true]"  # the last setting of a key wins


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("elastic", "not KEY=VALUE"),
        ("speed=fast", "unknown knob 'speed'"),
        ("elastic=maybe", "elastic: 'maybe' is not true or false"),
        ("discipline=lifo", "discipline: 'lifo' is not one of StrictFIFO, BestEffortFIFO"),
        ("las_thresholds_gpu_s=600,60", "increasing"),
        ("las_thresholds_gpu_s=nan", "finite"),
        ("las_thresholds_gpu_s=1h", "GPU-seconds"),
    ],
)
def test_a_bad_knob_names_the_option_and_the_key(setting: str, fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_knobs([setting], "--set")
    assert caught.value.field == "--set" and fragment in caught.value.message
