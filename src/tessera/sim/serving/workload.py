"""Split one LLM request trace into the requests of N models: sizes, Zipf popularity, load, SLO classes, sessions.

``tessera simulate serving`` (through ``tessera.sim.serving.study``) calls ``build_workload`` once per seed. The
rules, all seeded by ``seed`` (one numpy ``SeedSequence`` split into independent streams for the arrivals, the SLO
classes and the sessions, so that changing the SLO mix leaves the arrivals unchanged):

**Model sizes by popularity rank.** Rank r (1 = most popular) gets ``size_pattern[(r - 1) % len(size_pattern)]``.
The default pattern, period 8, is 13B, 8B, 70B, 7B, 13B, 8B, 34B, 7B: half the models are 7-8B, a quarter 13B and
a quarter 34B/70B, interleaved so that the most popular model is mid-sized and every size appears among the popular
ones. Names are ``m{rank - 1:02d}-{model name}``, e.g. ``m00-llama2-13b``. ``model_sizes`` (``--model-mix``)
replaces the pattern with any models of ``known``: the catalog, bloom-176b, and the models a study brought.

**Popularity and load by time shift.** Model m's share is ``s_m = m^-zipf / sum_k k^-zipf`` (ranks from 1; zipf 0
gives equal shares). Its arrivals are ``c_m = max(1, ceil(load * s_m))`` copies of the whole trace, each rotated by
its own uniform random offset in ``[0, duration)`` (wrapping around the trace's duration) and thinned, request by
request, with keep probability ``load * s_m / c_m``. Each copy keeps the trace's burst shape, but bursts land at
independent times for different models (and copies). The expected number of requests of model m is
``load * s_m * n`` for a trace of n requests, and since the shares sum to 1 the expected total is ``load * n``: the
total rate is ``load`` times the trace's rate, over the trace's duration. A request keeps the prompt and output
token counts of the trace row it was copied from (so lengths follow the trace, and stay correlated with its time).

**SLO classes.** Each request's class is drawn from ``slo_mix`` (default 70% interactive, 20% standard, 10% batch);
``deadline_s = arrival_s + DEFAULT_SLO_TARGETS[class].ttft_s``.

**Sessions and prefixes** (synthetic, for session- and prefix-affinity routing). In arrival order per model, a
request starts a new conversation with probability ``NEW_SESSION_PROB`` (always the model's first request), else it
continues one of the model's ``RECENT_SESSIONS`` most recently active conversations, chosen uniformly. ``prefix``
holds chained hashes of the prompt's full 16-token blocks, at most ``prefix_block_cap`` of them: every request of a
model starts with the model's system prompt (``SYSTEM_PROMPT_BLOCKS`` blocks, shared by all its requests); a
continued conversation shares the blocks of its previous turn's prompt (all of them but the last block of this
prompt, which is the new message), and the rest of its blocks are new. A block's hash is ``hash((parent, salt,
request, block))``: chained like vLLM's, deterministic for a seed (integer hashing does not depend on
PYTHONHASHSEED), and shared by the requests that share the block (the very same int objects).

Measured on the Azure conversation trace at load 5 with 32 models (96,837 requests): about 0.5 s to build and
about 80 MB in all (25 MB of it the requests themselves, the rest the prefix tuples at the default cap of 32 blocks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tessera.core.errors import InvalidRequestError
from tessera.serving.model_book import HOW_TO_BRING
from tessera.serving.models import KNOWN_ARCHITECTURES, ModelSpec
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass
from tessera.sim.serving.trace import TraceArrays

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DEFAULT_SIZE_PATTERN: tuple[str, ...] = (
    "llama2-13b",
    "llama3-8b",
    "llama2-70b",
    "llama2-7b",
    "llama2-13b",
    "llama3-8b",
    "codellama-34b",
    "llama2-7b",
)
DEFAULT_SLO_MIX: Mapping[SloClass, float] = {SloClass.INTERACTIVE: 0.7, SloClass.STANDARD: 0.2, SloClass.BATCH: 0.1}
BLOCK_TOKENS = 16  # the paged KV cache's block, the unit of prefix hashing
SYSTEM_PROMPT_BLOCKS = 4  # a 64-token system prompt shared by all requests of a model
DEFAULT_PREFIX_BLOCK_CAP = 32  # hashed blocks per request (512 tokens): enough to tell replicas apart
NEW_SESSION_PROB = 0.3  # so a conversation has 1 / 0.3 = 3.3 turns on average
RECENT_SESSIONS = 16  # a continued request picks one of the model's 16 most recently active conversations
_HASH_MASK = (1 << 62) - 1


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # e.g. "m00-llama2-13b"
    spec: ModelSpec
    rank: int  # 1 = most popular
    share: float  # its Zipf share of the requests (the shares sum to 1)


@dataclass(frozen=True)
class Workload:
    """The requests of one seed, sorted by arrival (ids 0..n-1 in that order), and the models they ask for."""

    requests: list[InferenceRequest]
    models: list[ServedModel]
    duration_s: float  # the trace's duration: every arrival is in [0, duration_s)
    requests_per_model: dict[str, int]
    trace_rows: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # source row of each request

    @property
    def rate_per_s(self) -> float:
        return len(self.requests) / self.duration_s


def assign_models(
    models: int,
    zipf: float,
    size_pattern: Sequence[str] = DEFAULT_SIZE_PATTERN,
    known: Mapping[str, ModelSpec] = KNOWN_ARCHITECTURES,
) -> list[ServedModel]:
    """The N models by popularity rank: sizes from ``size_pattern`` (repeated), each a name of ``known`` (the
    catalog and the grid's models, plus those a study brought: ``ModelBook.specs``), and Zipf shares."""
    if models < 1:
        raise InvalidRequestError("models", f"must be >= 1, got {models}")
    if not zipf >= 0 or not math.isfinite(zipf):
        raise InvalidRequestError("zipf", f"must be a finite number >= 0, got {zipf}")
    if not size_pattern:
        raise InvalidRequestError("model_sizes", "give at least one model of the catalog")
    unknown = [name for name in size_pattern if name not in known]
    if unknown:
        raise InvalidRequestError(
            "model_sizes", f"unknown model {unknown[0]!r} (known: {', '.join(known)}); {HOW_TO_BRING}"
        )
    weights = np.arange(1, models + 1, dtype=np.float64) ** -zipf
    shares = weights / weights.sum()
    width = max(2, len(str(models - 1)))
    served = []
    for index in range(models):
        spec = known[size_pattern[index % len(size_pattern)]]
        served.append(ServedModel(f"m{index:0{width}d}-{spec.name}", spec, index + 1, float(shares[index])))
    return served


def build_workload(
    trace: TraceArrays,
    models: int,
    zipf: float,
    load: float,
    seed: int,
    slo_mix: Mapping[SloClass, float] | None = None,
    model_sizes: Sequence[str] | None = None,
    prefix_block_cap: int = DEFAULT_PREFIX_BLOCK_CAP,
    known: Mapping[str, ModelSpec] = KNOWN_ARCHITECTURES,
) -> Workload:
    """The requests of ``models`` models taken from ``trace`` at ``load`` times its rate (see the module's rules)."""
    if not load > 0 or not math.isfinite(load):
        raise InvalidRequestError("load", f"must be a finite number > 0, got {load}")
    if prefix_block_cap < 0:
        raise InvalidRequestError("prefix_block_cap", f"must be >= 0, got {prefix_block_cap}")
    served = assign_models(models, zipf, DEFAULT_SIZE_PATTERN if model_sizes is None else model_sizes, known)
    mix = _slo_probabilities(DEFAULT_SLO_MIX if slo_mix is None else slo_mix)
    arrival_rng, slo_rng, session_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))

    times, rows, model_index = _shifted_arrivals(trace, served, load, arrival_rng)
    order = np.lexsort((rows, model_index, times))  # by time, then model, then trace row: a total order
    times, rows, model_index = times[order], rows[order], model_index[order]
    classes = slo_rng.choice(len(mix), size=times.size, p=mix)
    sessions, prefixes = _sessions_and_prefixes(trace, rows, model_index, len(served), session_rng, prefix_block_cap)

    ttft = [DEFAULT_SLO_TARGETS[SloClass(c)].ttft_s for c in range(len(mix))]
    names = [m.name for m in served]
    prompt = trace.prompt_tokens[rows].tolist()
    output = trace.output_tokens[rows].tolist()
    requests = [
        InferenceRequest(i, names[m], t, p, o, SloClass(c), t + ttft[c], s, prefix)
        for i, (m, t, p, o, c, s, prefix) in enumerate(
            zip(model_index.tolist(), times.tolist(), prompt, output, classes.tolist(), sessions, prefixes, strict=True)
        )
    ]
    counts = np.bincount(model_index, minlength=len(served))
    return Workload(requests, served, trace.duration_s, dict(zip(names, counts.tolist(), strict=True)), rows)


def _slo_probabilities(mix: Mapping[SloClass, float]) -> list[float]:
    weights = [float(mix.get(c, 0.0)) for c in SloClass]
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise InvalidRequestError("slo_mix", f"weights must be >= 0 with a positive sum, got {dict(mix)}")
    total = sum(weights)
    return [w / total for w in weights]


def _shifted_arrivals(
    trace: TraceArrays, served: Sequence[ServedModel], load: float, rng: np.random.Generator
) -> tuple[FloatArray, IntArray, IntArray]:
    """Arrival times, source rows and model indexes of every kept request (unsorted): rotated, thinned copies."""
    times: list[FloatArray] = []
    rows: list[IntArray] = []
    owners: list[IntArray] = []
    period = trace.duration_s
    for index, model in enumerate(served):
        multiple = load * model.share
        copies = max(1, math.ceil(multiple))
        keep = multiple / copies
        for _ in range(copies):
            offset = rng.uniform(0.0, period)
            kept = np.flatnonzero(rng.random(len(trace)) < keep)
            shifted = np.mod(trace.arrival_s[kept] + offset, period)
            times.append(np.where(shifted >= period, 0.0, shifted))  # mod can round up to the period itself
            rows.append(kept.astype(np.int64))
            owners.append(np.full(kept.size, index, dtype=np.int64))
    return np.concatenate(times), np.concatenate(rows), np.concatenate(owners)


def _sessions_and_prefixes(
    trace: TraceArrays,
    rows: IntArray,
    model_index: IntArray,
    models: int,
    rng: np.random.Generator,
    cap: int,
) -> tuple[list[int], list[tuple[int, ...]]]:
    """Each request's conversation id and prefix block hashes, in the (sorted) order of ``rows``."""
    blocks = np.minimum(trace.prompt_tokens[rows] // BLOCK_TOKENS, cap).tolist()
    starts_new = (rng.random(rows.size) < NEW_SESSION_PROB).tolist()
    picks = rng.integers(0, RECENT_SESSIONS, size=rows.size).tolist()
    salt = int(rng.integers(0, 1 << 62))
    system = [_chain(salt, model, 0, SYSTEM_PROMPT_BLOCKS) for model in range(models)]
    recent: list[list[int]] = [[] for _ in range(models)]  # per model, most recently active conversation last
    chains: list[tuple[int, ...]] = []  # per conversation: its latest turn's prefix
    sessions: list[int] = []
    prefixes: list[tuple[int, ...]] = []
    for i, model in enumerate(model_index.tolist()):
        active = recent[model]
        wanted = blocks[i]
        if starts_new[i] or not active:
            session = len(chains)
            chains.append(system[model])
        else:
            session = active.pop(len(active) - 1 - picks[i] % len(active))
        # A conversation's chain starts with (part of) the system prompt; one shorter than it is a prefix of it.
        source = chains[session] if len(chains[session]) >= SYSTEM_PROMPT_BLOCKS else system[model]
        shared = min(len(source), wanted - 1 if wanted > SYSTEM_PROMPT_BLOCKS else wanted)
        base = source[:shared]
        prefix = base + _chain(salt, base[-1] if base else model, i + 1, wanted - shared)  # 0: system prompts
        chains[session] = prefix
        active.append(session)
        if len(active) > RECENT_SESSIONS:
            del active[0]
        sessions.append(session)
        prefixes.append(prefix)
    return sessions, prefixes


def _chain(salt: int, parent: int, counter: int, length: int) -> tuple[int, ...]:
    """``length`` chained block hashes after ``parent``: each hashes its parent, the salt and a content counter."""
    hashes = []
    for block in range(length):
        parent = hash((parent, salt, counter, block)) & _HASH_MASK
        hashes.append(parent)
    return tuple(hashes)
