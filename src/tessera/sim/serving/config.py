"""What one serving study runs: the trace, the model split, the policies, the seeds and the cluster.

``tessera simulate serving`` builds a ``StudyConfig`` from its options and hands it to
``tessera.sim.serving.study.run_study``; the report writer reads it back. Construction validates every field and
raises ``InvalidRequestError`` naming the command-line option (``--models``, ``--load``, ...), so that a bad value
is one clear line whichever caller made the config.

Bounds: ``--models`` 1..256; ``--zipf`` >= 0; ``--load`` in (0, 100]; policies among ``static``,
``static-autoscale`` and ``tessera``, each at most once; seeds >= 0, each at most once; ``--gpus`` (a fixed cluster,
``NxMODEL`` such as ``64xH100-80GB``, in nodes of ``GPUS_PER_NODE``; the model is any name or alias of the GPU
catalog) and ``--gpus-for-slo`` (search the smallest cluster meeting the SLOs) exclude each other; without either,
each policy sizes its own cluster. Without ``--trace`` the study replays the seeded synthetic Azure-like trace
(``tessera.sim.serving.synthetic_trace``).

Models: ``--model-mix`` names the models by popularity rank (repeated to ``--models``; default
``workload.DEFAULT_SIZE_PATTERN``), each known by name or brought by ``--model-config NAME=config.json`` or
``--model-profile [NAME=]PATH`` (``tessera.serving.model_book``). A brought model must be served: a
``--model-config`` or a named ``--model-profile`` whose model the mix does not name is refused, not ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from tessera.core.catalog import GpuModel, resolve_model
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError
from tessera.serving.model_book import CONFIG_OPTION, PROFILE_OPTION, ModelBook, build_model_book
from tessera.serving.setups import SETUP_NAMES, PolicySetup, serving_setup, with_setup_knobs
from tessera.sim.serving.synthetic_trace import SYNTHETIC_TRACE_NAME, synthetic_llm_trace
from tessera.sim.serving.trace import TraceArrays, read_llm_trace
from tessera.sim.serving.workload import DEFAULT_SIZE_PATTERN

KNOWN_POLICIES: tuple[str, ...] = SETUP_NAMES
MAX_MODELS = 256
MAX_LOAD = 100.0
GPUS_PER_NODE = 8
SYNTHETIC_TRACE_SEED = 0  # the synthetic trace is the same for every study seed: seeds vary the model split

_GPU_SPEC_RE = re.compile(r"\s*(\d+)\s*[xX]\s*(\S.*?)\s*")


@dataclass(frozen=True, slots=True)
class GpuCluster:
    """A fixed cluster of ``count`` GPUs of one model, in nodes of ``gpus_per_node`` (the last one may be smaller)."""

    count: int
    model: GpuModel
    gpus_per_node: int = GPUS_PER_NODE

    @property
    def node_gpu_counts(self) -> tuple[int, ...]:
        full, rest = divmod(self.count, self.gpus_per_node)
        return (self.gpus_per_node,) * full + ((rest,) if rest else ())

    def __str__(self) -> str:
        return f"{self.count}x{self.model.name}"


def parse_gpu_cluster(text: str, option: str = "--gpus") -> GpuCluster:
    """``"64xH100-80GB"`` as a ``GpuCluster``; raises ``InvalidRequestError`` naming ``option``."""
    match = _GPU_SPEC_RE.fullmatch(text)
    if match is None:
        raise InvalidRequestError(option, f"{text!r} is not a cluster like 64xH100-80GB (count x GPU model)")
    count = int(match.group(1))
    if count < 1:
        raise InvalidRequestError(option, f"the GPU count must be >= 1, got {count}")
    try:
        model = resolve_model(match.group(2))
    except UnknownGpuModelError as exc:
        raise InvalidRequestError(option, exc.message) from None
    return GpuCluster(count, model)


def parse_policy_names(text: str, option: str = "--setup") -> tuple[str, ...]:
    """Policy names from ``"static,tessera"``; raises ``InvalidRequestError`` for an unknown or repeated name."""
    return _check_policies(tuple(part.strip().lower() for part in text.split(",") if part.strip()), option)


def _check_policies(names: tuple[str, ...], option: str = "--setup") -> tuple[str, ...]:
    if not names:
        raise InvalidRequestError(option, f"no setup given (known: {', '.join(KNOWN_POLICIES)})")
    for name in names:
        if name not in KNOWN_POLICIES:
            raise InvalidRequestError(option, f"unknown serving setup {name!r} (known: {', '.join(KNOWN_POLICIES)})")
    if len(set(names)) != len(names):
        raise InvalidRequestError(option, f"a setup is named twice in {','.join(names)!r}")
    return names


def parse_model_mix(text: str, option: str = "--model-mix") -> tuple[str, ...]:
    """Model names from ``"llama2-13b,mine"`` (checked against the book later: ``StudyConfig.model_book``)."""
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not name for name in names):
        raise InvalidRequestError(option, f"give model names separated by commas, got {text!r}")
    return names


def parse_named_path(text: str, option: str, name_required: bool = True) -> tuple[str | None, Path]:
    """``NAME=PATH`` (or ``PATH`` alone where ``name_required`` is false) of ``--model-config`` and
    ``--model-profile``; the file must exist."""
    name, sep, path = text.partition("=")
    if not sep:
        if name_required:
            raise InvalidRequestError(option, f"{text!r} is not NAME=PATH (a model name, then its file)")
        name, path = "", text
    elif not name.strip():
        raise InvalidRequestError(option, f"{text!r} names no model before '='")
    file = Path(path)
    if not file.is_file():
        raise InvalidRequestError(option, f"no such file: {path}")
    return (name.strip() or None), file


@dataclass(frozen=True, slots=True)
class StudyConfig:
    """One study: every policy replayed on the workload of every seed (see the module for the bounds)."""

    trace: Path | None = None  # None: the synthetic Azure-like trace
    models: int = 8
    zipf: float = 1.0
    load: float = 1.0
    policies: tuple[str, ...] = KNOWN_POLICIES
    seeds: tuple[int, ...] = (0,)
    gpus: str | None = None  # a fixed cluster, e.g. "64xH100-80GB" (nodes of 8)
    gpus_for_slo: bool = False  # search, per policy, the smallest cluster that meets the SLOs
    perf_profile: Path | None = None  # a user CSV profile for the performance model
    out: Path = Path(".tessera/serving")
    model_mix: tuple[str, ...] | None = None  # models by popularity rank, repeated; None: the default pattern
    model_configs: tuple[tuple[str, Path], ...] = ()  # --model-config NAME=config.json
    model_profiles: tuple[tuple[str | None, Path], ...] = ()  # --model-profile [NAME=]PATH
    knobs: tuple[str, ...] = ()  # --set KEY=VALUE, applied to every setup studied (serving.setups)

    def __post_init__(self) -> None:
        if isinstance(self.models, bool) or not 1 <= self.models <= MAX_MODELS:
            raise InvalidRequestError("--models", f"must be 1..{MAX_MODELS}, got {self.models}")
        if not (math.isfinite(self.zipf) and self.zipf >= 0):
            raise InvalidRequestError("--zipf", f"must be a finite number >= 0, got {self.zipf:g}")
        if not 0 < self.load <= MAX_LOAD:
            raise InvalidRequestError("--load", f"must be > 0 and <= {MAX_LOAD:g}, got {self.load:g}")
        _check_policies(tuple(self.policies))
        if not self.seeds:
            raise InvalidRequestError("--seeds", "give at least one seed")
        if any(seed < 0 for seed in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise InvalidRequestError("--seeds", f"seeds are >= 0 and distinct, got {list(self.seeds)}")
        if self.gpus is not None and self.gpus_for_slo:
            raise InvalidRequestError("--gpus", "give either --gpus (a fixed cluster) or --gpus-for-slo, not both")
        if self.gpus is not None:
            parse_gpu_cluster(self.gpus)
        for policy in self.policies:
            self.setup(policy)  # an unknown knob or a bad value: InvalidRequestError naming --set
        if self.perf_profile is not None and not self.perf_profile.is_file():
            raise InvalidRequestError("--perf-profile", f"no such file: {self.perf_profile}")

    def model_book(self) -> ModelBook:
        """The known and brought models (reads the brought files); refuses a mix naming an unknown model and a
        brought model the mix leaves out."""
        book = build_model_book(self.model_configs, self.model_profiles)
        for name in self.mix:
            book.spec(name, "--model-mix")
        named = [(CONFIG_OPTION, n) for n, _ in self.model_configs]
        named += [(PROFILE_OPTION, n) for n, _ in self.model_profiles if n is not None]
        for option, name in named:
            if name not in self.mix:
                mix = ("" if self.model_mix is not None else "the default ") + f"--model-mix ({','.join(self.mix)})"
                raise InvalidRequestError(option, f"{name} is not in {mix}: name it there")
        return book

    def setup(self, name: str) -> PolicySetup:
        """The setup ``name`` with this study's knobs (``--set``)."""
        return with_setup_knobs(serving_setup(name, "--setup"), self.knobs, "--set")

    @property
    def mix(self) -> tuple[str, ...]:
        """The models by popularity rank (repeated to ``models``): ``--model-mix`` or the default pattern."""
        return self.model_mix if self.model_mix is not None else DEFAULT_SIZE_PATTERN

    @property
    def cluster(self) -> GpuCluster | None:
        """The fixed cluster of ``--gpus``; None when each policy sizes its own (or ``--gpus-for-slo`` searches)."""
        return None if self.gpus is None else parse_gpu_cluster(self.gpus)

    @property
    def trace_name(self) -> str:
        return SYNTHETIC_TRACE_NAME if self.trace is None else self.trace.stem

    def load_trace(self) -> TraceArrays:
        """The trace file's requests (``InputFileError`` for bad content), or the synthetic trace without one."""
        if self.trace is None:
            return synthetic_llm_trace(SYNTHETIC_TRACE_SEED)
        return read_llm_trace(self.trace)
