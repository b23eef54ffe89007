"""The models a serving study may name, and where each one's architecture and timing come from.

Who calls it: the serving twin's study (``tessera simulate serving``, ``tessera.sim.serving.config``) and the fidelity
benchmark (``tessera.sim.serving.fidelity``). ``build_model_book`` turns the user's files into a ``ModelBook``:

- **Known by name**: the catalog (``models.CATALOG``) and the other architecture of the Splitwise grid
  (``models.GRID_MODELS``: bloom-176b). Timed as every model without a profile of its own: the calibrated model
  (its own grid rows when the calibration file measures it, else the nearest measured configuration scaled to it)
  or, without the file, the roofline.
- **By architecture** (``--model-config NAME=config.json``, ``hf_config``): weights, KV bytes per token and tensor
  parallelism from the shape; timed like the above (scaled or roofline).
- **By measured profile** (``--model-profile [NAME=]PATH``), which gives timings only:
  - a Splitwise perf-model CSV (``model,hardware,...``) times every model it holds (or only NAME) from that model's
    own rows: its measured configuration when the twin's GPU and TP are among them, else the nearest of them scaled
    by the model's shape;
  - a profile in the project's format (``kind,batch_size,tokens,kv_tokens,time_ms``, ``perf_csv``) times NAME (a
    profile does not say which model it measured, so NAME is required) as measured, on whatever GPU the study uses.

  Memory sizing (weights, KV cache per token), the model cache's load times, tensor parallelism and scaling to
  another GPU all need the architecture, which a profile does not give: a profiled model must also be known by name
  or brought by ``--model-config`` under the same name, else the book refuses it, naming what is missing.

Every refusal is an ``InvalidRequestError`` naming the option, or an ``InputFileError`` naming the file (and line
and key); nothing falls back to a default model.
"""

from __future__ import annotations

import csv
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.serving.gpus import SERVING_GPUS, gpu_spec
from tessera.serving.hf_config import read_hf_config
from tessera.serving.models import CATALOG, GIB, KNOWN_ARCHITECTURES, ModelSpec
from tessera.serving.perf_calibrated import SPLITWISE_HARDWARE, splitwise_gpu
from tessera.serving.perf_csv import PROFILE_COLUMNS, SPLITWISE_COLUMNS, read_profile_rows, read_splitwise_rows
from tessera.serving.perf_model import PerfModel, ProfilePerf, ReplicaShape, calibrated_perf_for, default_perf
from tessera.textfiles import read_text_file

CONFIG_OPTION = "--model-config"
PROFILE_OPTION = "--model-profile"
HOW_TO_BRING = (
    f"bring one by its architecture ({CONFIG_OPTION} NAME=config.json, a Hugging Face config) "
    f"or with a measured profile too ({PROFILE_OPTION} [NAME=]profile.csv)"
)


class ProfileFormat(enum.Enum):
    SPLITWISE = "Splitwise perf-model CSV"
    PROFILE = "profile"


@dataclass(frozen=True, slots=True)
class MeasuredProfile:
    path: Path
    format: ProfileFormat


@dataclass(frozen=True, slots=True)
class BookEntry:
    spec: ModelSpec
    architecture: str  # where the shape comes from: "catalog", "Splitwise grid" or the config.json's path
    profile: MeasuredProfile | None = None  # its own measured timings, if brought


class ModelBook:
    """Model name -> its architecture and timing source (see the module docstring)."""

    def __init__(self, entries: Mapping[str, BookEntry]) -> None:
        self.entries = dict(entries)

    @classmethod
    def default(cls) -> ModelBook:
        return cls({name: BookEntry(spec, _origin(name)) for name, spec in KNOWN_ARCHITECTURES.items()})

    @property
    def specs(self) -> dict[str, ModelSpec]:
        return {name: entry.spec for name, entry in self.entries.items()}

    def spec(self, name: str, field: str = "model") -> ModelSpec:
        """The architecture of ``name``; ``InvalidRequestError(field)`` listing the known ones and how to bring one."""
        entry = self.entries.get(name)
        if entry is None:
            known = ", ".join(self.entries)
            raise InvalidRequestError(field, f"unknown model {name!r} (known: {known}); {HOW_TO_BRING}")
        return entry.spec

    def perf(
        self, spec: ModelSpec, gpu: str, tensor_parallel: int, calibration_csv: str | Path | None = None
    ) -> PerfModel:
        """The timing of ``spec`` on ``tensor_parallel`` GPUs of type ``gpu``: its own profile when brought with one,
        else ``default_perf`` (calibrated from ``calibration_csv`` and scaled, or the roofline)."""
        entry = self.entries.get(spec.name)
        profile = entry.profile if entry is not None else None
        if profile is None:
            return default_perf(spec, gpu, tensor_parallel, calibration_csv)
        if profile.format is ProfileFormat.SPLITWISE:
            return calibrated_perf_for(profile.path, spec, gpu, tensor_parallel, own_rows_only=True)
        return ProfilePerf.from_csv(profile.path, ReplicaShape(spec, gpu_spec(gpu), tensor_parallel))

    def grid_for(self, name: str, calibration_csv: Path) -> Path:
        """The Splitwise-format file that measures ``name``: its own profile if it is one, else ``calibration_csv``."""
        entry = self.entries.get(name)
        if entry is not None and entry.profile is not None:
            if entry.profile.format is ProfileFormat.SPLITWISE:
                return entry.profile.path
            raise InvalidRequestError(
                PROFILE_OPTION, f"{name}: {entry.profile.path} is a profile, not Splitwise perf-model rows (model,...)"
            )
        return calibration_csv

    def describe(self, name: str, default_timing: str) -> str:
        """One line: the model's size and where its shape and timing come from (``default_timing`` says what times
        a model without a profile of its own, e.g. ``perf_choice.describe``)."""
        entry = self.entries[name]
        spec = entry.spec
        profile = entry.profile
        timing = f"{profile.format.value} {profile.path}" if profile is not None else default_timing
        return (
            f"{name}: {spec.params_b:.2f}B parameters, {spec.weights_bytes / GIB:.1f} GiB of weights, "
            f"{spec.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token, TP {spec.tensor_parallel}; "
            f"architecture: {entry.architecture}; timing: {timing}"
        )


def _origin(name: str) -> str:
    return "catalog" if name in CATALOG else "Splitwise grid"


def build_model_book(
    configs: Sequence[tuple[str, Path]] = (), profiles: Sequence[tuple[str | None, Path]] = ()
) -> ModelBook:
    """The default book plus the models brought by ``configs`` (name, config.json) and ``profiles`` (name or None,
    CSV); every file is read and checked now."""
    entries = ModelBook.default().entries
    for name, path in configs:
        _check_name(name, CONFIG_OPTION)
        if name in entries:
            known = entries[name].architecture
            raise InvalidRequestError(CONFIG_OPTION, f"{name} is already known ({known}): give yours another name")
        entries[name] = BookEntry(read_hf_config(path, name), str(path))
    profiled: set[str] = set()
    for only, path in profiles:
        if only is not None:
            _check_name(only, PROFILE_OPTION)
        measured = MeasuredProfile(path, profile_format(path))
        for model in _profiled_models(measured, only):
            if model in profiled:
                raise InvalidRequestError(PROFILE_OPTION, f"{model} is given two profiles")
            if model not in entries:
                raise InvalidRequestError(
                    PROFILE_OPTION,
                    f"{path} measures {model!r}, whose architecture is unknown: a profile gives timings only, the twin "
                    f"also needs its weights and KV bytes per token: give {CONFIG_OPTION} {model}=config.json",
                )
            profiled.add(model)
            entries[model] = BookEntry(entries[model].spec, entries[model].architecture, measured)
    return ModelBook(entries)


def _check_name(name: str, option: str) -> None:
    if not name or name != name.strip() or "," in name or "=" in name:
        raise InvalidRequestError(option, f"{name!r} is not a model name (no blanks around it, no ',' or '=')")


def _profiled_models(profile: MeasuredProfile, name: str | None) -> list[str]:
    if profile.format is ProfileFormat.PROFILE:
        read_profile_rows(profile.path)  # checks it now
        if name is None:
            raise InvalidRequestError(
                PROFILE_OPTION,
                f"{profile.path} is a profile of one engine ({','.join(PROFILE_COLUMNS)}): name its model, NAME=PATH",
            )
        return [name]
    rows = read_splitwise_rows(profile.path)
    models = sorted({row.model for row in rows})
    if name is not None and name not in models:
        have = ", ".join(models)
        raise InputFileError(str(profile.path), None, "model", f"no rows for {name!r} (the file has: {have})")
    chosen = models if name is None else [name]
    for row in rows:
        if row.model in chosen and splitwise_gpu(row.hardware) is None:
            known = ", ".join([*SPLITWISE_HARDWARE, *SERVING_GPUS])
            raise InputFileError(
                str(profile.path),
                row.line,
                "hardware",
                f"unknown GPU {row.hardware!r}: the twin has no figures for it (known: {known})",
            )
    return chosen


def profile_format(path: Path) -> ProfileFormat:
    """Which of the two formats ``path`` is, from its header (the first line that is neither blank nor a comment)."""
    for number, raw in enumerate(read_text_file(path).splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        header = {field.strip() for field in next(csv.reader([raw]))}
        if header >= set(SPLITWISE_COLUMNS):
            return ProfileFormat.SPLITWISE
        if header >= set(PROFILE_COLUMNS):
            return ProfileFormat.PROFILE
        raise InputFileError(
            str(path),
            number,
            None,
            f"neither a Splitwise perf-model CSV ({','.join(SPLITWISE_COLUMNS)}) nor a "
            f"profile ({','.join(PROFILE_COLUMNS)})",
        )
    raise InputFileError(str(path), None, None, "empty file: no header")
