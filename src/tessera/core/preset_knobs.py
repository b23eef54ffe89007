"""The knobs of a preset, settable by name on both runtimes: ``tessera up --set KEY=VALUE`` and ``tessera simulate
timeline --set KEY=VALUE`` (repeatable) change the preset the same way (``with_knobs``), so a configuration measured
in the twin is the one a cluster runs, and ``GET /v1/config`` reports every knob's value and what was set.

A knob is a field of ``core.presets.Preset`` (its placement has its own option, ``--placement``); ``KNOBS`` says
what each does. Values: ``true``/``false`` (also ``on``/``off``, ``yes``/``no``, ``1``/``0``), a discipline
(``StrictFIFO``, ``BestEffortFIFO``), or LAS thresholds in GPU-seconds (``3600,36000``; ``none`` for no LAS). A bad
key or value is an ``InvalidRequestError`` naming the option and the key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.core.decisions import QueueDiscipline
from tessera.core.errors import InvalidRequestError
from tessera.core.presets import Preset
from tessera.core.queueing.las import check_thresholds


@dataclass(frozen=True, slots=True)
class Knob:
    summary: str
    parse: Callable[[str], Any]  # raises ValueError with a reason


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _discipline(text: str) -> QueueDiscipline:
    for discipline in QueueDiscipline:
        if text.strip().lower() == discipline.value.lower():
            return discipline
    raise ValueError(f"{text!r} is not one of {', '.join(d.value for d in QueueDiscipline)}")


def _thresholds(text: str) -> tuple[float, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not GPU-seconds separated by commas (e.g. 3600,36000)") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{text!r}: thresholds must be finite, positive and increasing")
    try:
        check_thresholds(values)  # the preset's own rule
    except InvalidRequestError:
        raise ValueError(f"{text!r}: thresholds must be finite, positive and increasing") from None
    return values


KNOBS: dict[str, Knob] = {
    "whole_gpus": Knob("every GPU share is rounded up to whole GPUs (static binding)", _flag),
    "discipline": Knob(
        "StrictFIFO (the first that does not fit blocks the rest) or BestEffortFIFO (backfill)", _discipline
    ),
    "borrowing": Knob("queues borrow idle quota in their cohort and reclaim it by preemption", _flag),
    "las_thresholds_gpu_s": Knob("least-attained-service levels in GPU-seconds (none: no LAS)", _thresholds),
    "las_within_class": Knob("LAS orders only preemptible jobs within one priority class", _flag),
    "gang_one_node": Knob("a gang goes onto one node when one can hold it", _flag),
    "head_reservation": Knob("the first blocked job reserves capacity; backfill never delays it", _flag),
    "assume_checkpoints": Knob("every preempted job resumes from a checkpoint (Tiresias' assumption)", _flag),
    "elastic": Knob("elastic jobs start smaller, grow into idle GPUs and shrink for others", _flag),
    "elastic_fixed_durations": Knob("twin only: a fixed-duration job with an elastic range is elastic too", _flag),
    "colocation_rule": Knob("typed training jobs share a GPU only when the co-location model says it gains", _flag),
}


def parse_knobs(settings: Sequence[str], option: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` settings as knob values (a later setting of a key wins); raises ``InvalidRequestError``."""
    values: dict[str, Any] = {}
    for setting in settings:
        key, equals, text = setting.partition("=")
        key = key.strip().replace("-", "_")
        if not equals:
            raise InvalidRequestError(option, f"{setting!r} is not KEY=VALUE (e.g. elastic=false)")
        knob = KNOBS.get(key)
        if knob is None:
            raise InvalidRequestError(option, f"unknown knob {key!r} (known: {', '.join(KNOBS)})")
        try:
            values[key] = knob.parse(text)
        except ValueError as exc:
            raise InvalidRequestError(option, f"{key}: {exc}") from None
    return values


def with_knobs(preset: Preset, settings: Sequence[str], option: str = "--set") -> Preset:
    """``preset`` with ``settings`` (``KEY=VALUE``) applied; its name stays (``knob_label`` names the change)."""
    values = parse_knobs(settings, option)
    if not values:
        return preset
    try:
        return dataclasses.replace(preset, **values)
    except InvalidRequestError as exc:
        raise InvalidRequestError(option, f"{exc.field}: {exc.message}") from None


def knob_label(settings: Sequence[str], option: str = "--set") -> str:
    """The settings as a label suffix, ``[elastic=false,...]`` ("" for none), in a canonical form."""
    values = parse_knobs(settings, option)
    if not values:
        return ""
    return "[" + ",".join(f"{key}={knob_text(value)}" for key, value in values.items()) + "]"


def knob_text(value: Any) -> str:
    """A knob's value as ``--set`` takes it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, QueueDiscipline):
        return value.value
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value) or "none"
    return str(value)
