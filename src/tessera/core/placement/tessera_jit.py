"""``tessera``'s per-decision scoring as compiled loops (numba), with the same numbers as the NumPy code.

A decision rescores a handful of nodes, and at that size NumPy costs about a microsecond per call whatever it
computes: ``tessera_scores.score_nodes`` made some sixty calls per decision (the measure ``F`` alone about twenty,
the reserve's lost shapes and their charge most of the rest). The loops below do the same arithmetic in a few
compiled calls:

- ``measure_rows``: which nodes' ``F`` is not known yet, the sharing candidates (as ``_sharing_candidates`` picks
  them) and the after-states, and for each of these rows the per-typical-pod terms of
  ``TesseraFragmentation._node_frag_fused`` (the same integer and floating-point operations, in the same order),
  the idle part and the per-GPU waste, summed in NumPy's order (pairwise from eight GPUs on);
- the weighted sum over the typical pods stays NumPy's ``einsum`` (its rounding depends on the machine's SIMD
  width, so a loop could not match it everywhere), one call;
- ``finish_scores``: ``F`` of each row, the kept ``F`` of the nodes measured as they are, and the score and GPU
  of each node (first best GPU), with the whole GPUs the placement would take there (for the reserve);
- the reserve's part (``reserve_jit``): the hosted shapes of the nodes that changed, the shapes a placement would
  take away, and which nodes to charge, as bits; the charge's sum stays NumPy's ``einsum`` too.

The functions are plain Python that numba compiles (``compiled()``, ``cache=True``: the machine code is kept in
``__pycache__`` and loaded in a fraction of a second by later processes; the first process after an install or a
change of these files compiles, some seconds). The tests also run them uncompiled (``uncompiled()``). When numba is
not installed, ``compiled()`` returns ``None`` and the NumPy code runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.core.cluster import IntArray
from tessera.core.fragmentation import FloatArray
from tessera.core.placement import reserve_jit

MILLI = 1000  # MILLI_PER_GPU, as a literal the compiler folds
DEDUP_ROWS = 64  # measure_rows measures each distinct state once in batches of at least this many rows
HASH_MASK = (1 << 28) - 1  # keeps the states' hash small (no overflow, compiled or not)
PAIRWISE_MAX = 128  # NumPy sums up to this many values per block (pairwise_sum): rows of more GPUs use NumPy

# Rows of the per-pod integer table ``pods`` (TesseraFragmentation.kernel_tables):
POD_GPUS_FIELD, POD_CPU, POD_CPU_EACH, POD_MEM_EACH, POD_MEM_KNOWN, POD_GPU_EACH, POD_GPUS = range(7)
# Entries of the float parameters ``weights``: stranding weight, joint weight, idle weight.
# Entries of the request ``ask``: GPUs, scoring CPU, memory, CPU (feasibility), use memory, all memory known.
ASK_GPUS, ASK_SCORING_CPU, ASK_MEM, ASK_CPU, ASK_USE_MEM, ASK_ALL_MEM_KNOWN = range(6)


def measure_rows(
    gpu_all: IntArray,
    cpu_all: IntArray,
    mem_all: IntArray,
    model_all: IntArray,
    version: IntArray,
    known_at: IntArray,
    nodes: IntArray,
    need: IntArray,
    ask: IntArray,
    fit_packed_pod: IntArray,
    pods: IntArray,
    allowed: Any,
    gpu_waste: FloatArray,
    weights: FloatArray,
) -> tuple[FloatArray, FloatArray, IntArray, IntArray]:
    """The rows ``tessera_scores.score_nodes`` measures, and for each its per-pod terms, before the weighted sum.

    Rows: the nodes (positions in ``nodes``) whose ``F`` is not known at their version, as they are; the sharing
    candidates (node, GPU), node by node and GPU by GPU; the other nodes after the placement. Returns
    ``terms[row, pod]``, ``parts[row] = (idle * idle weight, summed per-GPU waste)``, ``layout[row] = (position,
    GPU or -1, kind)`` (kind 0: as it is, 1: sharing candidate, 2: whole GPUs or CPU only) and the row counts
    ``(unknown, candidates)``."""
    k = nodes.shape[0]
    g = gpu_all.shape[1]
    m = pods.shape[1]
    num_gpus = ask[ASK_GPUS]
    layout = np.empty((k + k * g, 3), dtype=np.int64)
    rows = 0
    for i in range(k):
        n = nodes[i]
        if known_at[n] != version[n]:
            layout[rows, 0] = i
            layout[rows, 1] = -1
            layout[rows, 2] = 0
            rows += 1
    unknown = rows
    if num_gpus == 1:
        for i in range(k):
            if need[i] < MILLI:
                n = nodes[i]
                for j in range(g):
                    free = gpu_all[n, j]
                    if free < need[i]:
                        continue
                    same = False
                    for e in range(j):
                        if gpu_all[n, e] == free:
                            same = True
                            break
                    if not same:
                        layout[rows, 0] = i
                        layout[rows, 1] = j
                        layout[rows, 2] = 1
                        rows += 1
    candidates = rows - unknown
    for i in range(k):
        if num_gpus != 1 or need[i] >= MILLI:
            layout[rows, 0] = i
            layout[rows, 1] = -1
            layout[rows, 2] = 2
            rows += 1
    counts = np.empty(2, dtype=np.int64)
    counts[0] = unknown
    counts[1] = candidates
    terms = np.empty((rows, m), dtype=np.float64)
    parts = np.empty((rows, 2), dtype=np.float64)
    buf = np.empty(g, dtype=np.int64)
    stranding_w, joint_w, idle_w = weights[0], weights[1], weights[2]
    use_mem, all_mem_known = ask[ASK_USE_MEM] != 0, ask[ASK_ALL_MEM_KNOWN] != 0
    # Many rows of a large batch are the same state (idle nodes of one kind above all): measure each distinct state
    # once, found through a hash table of the states measured (open addressing); a row's numbers depend on its state
    # alone, so a copy is exact.
    dedup = rows >= DEDUP_ROWS
    size = 1
    while dedup and size < 2 * rows:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    state = np.empty((rows if dedup else 1, g + 3), dtype=np.int64)
    for r in range(rows):
        i = layout[r, 0]
        n = nodes[i]
        for j in range(g):
            buf[j] = gpu_all[n, j]
        c = cpu_all[n]
        mm = mem_all[n]
        kind = layout[r, 2]
        if kind != 0:
            c -= ask[ASK_SCORING_CPU]
            mm -= ask[ASK_MEM]
            if kind == 1:
                buf[layout[r, 1]] -= need[i]
            elif num_gpus > 0:
                taken = 0
                for j in range(g):
                    if taken < num_gpus and buf[j] == MILLI:
                        buf[j] = 0
                        taken += 1
        md = model_all[n]
        if dedup:
            h = (((c & HASH_MASK) * 31 + mm) & HASH_MASK) * 31 + md
            for j in range(g):
                h = ((h & HASH_MASK) * 31 + buf[j]) & HASH_MASK
            slot = h & (size - 1)
            copied = False
            while table[slot] >= 0:
                q = table[slot]
                same = state[q, 0] == c and state[q, 1] == mm and state[q, 2] == md
                for j in range(g):
                    same = same and state[q, 3 + j] == buf[j]
                if same:
                    terms[r] = terms[q]
                    parts[r] = parts[q]
                    copied = True
                    break
                slot = (slot + 1) & (size - 1)
            if copied:
                continue
            table[slot] = r
            state[r, 0] = c
            state[r, 1] = mm
            state[r, 2] = md
            for j in range(g):
                state[r, 3 + j] = buf[j]
        idle_int = 0
        for j in range(g):
            idle_int += buf[j]
        for p in range(m):
            packed = 0
            for j in range(g):
                packed += fit_packed_pod[buf[j], p]
            ok = allowed[md, p]
            cpu_fit = c // pods[POD_CPU_EACH, p]
            fits = (packed & 0xFFFF0000) >= pods[POD_GPUS_FIELD, p] and c >= pods[POD_CPU, p] and ok
            per_pod = idle_int - (packed >> 32) if fits else idle_int
            if ok:
                fed = cpu_fit
                if use_mem and (all_mem_known or pods[POD_MEM_KNOWN, p] != 0):
                    fed = min(cpu_fit, mm // pods[POD_MEM_EACH, p])
                short = idle_int - fed * pods[POD_GPU_EACH, p]
                extra = stranding_w * max(short, 0)
                if joint_w != 0.0:
                    used = min((packed & 0xFFFF) // pods[POD_GPUS, p], cpu_fit) * pods[POD_GPU_EACH, p]
                    extra = extra - joint_w * used
                terms[r, p] = per_pod + extra
            else:
                terms[r, p] = per_pod + 0.0
        parts[r, 0] = float(idle_int) * idle_w
        # sum(gpu_waste[buf]) in NumPy's order: one by one below eight values, else eight running sums
        # (pairwise_sum), combined pairwise, then the rest one by one.
        if g < 8:
            waste = 0.0
            for j in range(g):
                waste += gpu_waste[buf[j]]
        else:
            acc = np.empty(8, dtype=np.float64)
            for j in range(8):
                acc[j] = gpu_waste[buf[j]]
            j = 8
            while j < g - g % 8:
                for e in range(8):
                    acc[e] += gpu_waste[buf[j + e]]
                j += 8
            waste = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
            while j < g:
                waste += gpu_waste[buf[j]]
                j += 1
        parts[r, 1] = waste
    return terms, parts, layout[:rows], counts


def finish_scores(
    gpu_all: IntArray,
    version: IntArray,
    known_at: IntArray,
    known_frag: FloatArray,
    nodes: IntArray,
    parts: FloatArray,
    weighted: FloatArray,
    layout: IntArray,
    num_gpus: int,
) -> tuple[FloatArray, IntArray, IntArray]:
    """From ``measure_rows``' rows and the weighted sums: keeps the ``F`` of the nodes measured as they are in
    ``known_*`` and returns each node's score ``F_before - F_after`` (a sharing request: its first best GPU), that GPU
    (-1: none chosen) and the whole GPUs the placement takes there."""
    k = nodes.shape[0]
    rows = layout.shape[0]
    measured = np.empty(rows, dtype=np.float64)
    for r in range(rows):
        measured[r] = (parts[r, 0] + weighted[r]) + parts[r, 1]
        if layout[r, 2] == 0:
            n = nodes[layout[r, 0]]
            known_frag[n] = measured[r]
            known_at[n] = version[n]
    score = np.empty(k, dtype=np.float64)
    gpu = np.full(k, -1, dtype=np.int64)
    taken = np.full(k, num_gpus, dtype=np.int64)
    for r in range(rows):
        kind = layout[r, 2]
        if kind == 0:
            continue
        i = layout[r, 0]
        value = known_frag[nodes[i]] - measured[r]
        if kind == 2:
            score[i] = value
        elif gpu[i] == -1 or value > score[i]:
            score[i] = value
            gpu[i] = layout[r, 1]
    for i in range(k):
        if gpu[i] >= 0:
            taken[i] = 1 if gpu_all[nodes[i], gpu[i]] == MILLI else 0
    return score, gpu, taken


@dataclass(frozen=True, slots=True)
class Tables:
    """What ``measure_rows`` reads of a ``TesseraFragmentation`` (its fused measure's tables)."""

    fit_packed_pod: IntArray  # [free milli, pod]: packed fit count, fit flag and free milli
    pods: IntArray  # [POD_* row, pod]
    allowed: Any  # [model, pod]: bool
    gpu_waste: FloatArray  # [free milli]: sliver and gap waste of a GPU
    weights: FloatArray  # stranding, joint and idle weights
    pod_weight: FloatArray  # [pod]: popularity, the weighted sum's weights
    use_mem: bool  # host memory limits the pods fed
    all_mem_known: bool  # every typical pod states its memory


class Kernels:
    """The functions, each passed through ``njit`` (numba's compiler, or nothing)."""

    def __init__(self, njit: Any) -> None:
        self.measure_rows = njit(measure_rows)
        self.finish_scores = njit(finish_scores)
        self.refresh_hosts = njit(reserve_jit.refresh_hosts)
        self.lost_bits = njit(reserve_jit.lost_bits)
        self.charge_terms = njit(reserve_jit.charge_terms)
        self.charge_candidates = njit(reserve_jit.charge_candidates)


def warm_up(kernels: Kernels | Any) -> None:
    """Call each function once on a tiny cluster with the argument types of the real calls, so that numba compiles
    them (or loads them from its cache) now rather than in the first decision."""
    i8, f8 = np.int64, np.float64
    gpu_all = np.full((2, 2), MILLI, dtype=i8)
    cpu_all, mem_all, model_all = np.full(2, 8000, dtype=i8), np.full(2, 8000, dtype=i8), np.zeros(2, dtype=i8)
    version, at = np.zeros(2, dtype=i8), np.full(2, -1, dtype=i8)
    nodes, need = np.arange(2, dtype=i8), np.full(2, 500, dtype=i8)
    ask = np.array([1, 1000, 1000, 1000, 1, 1], dtype=i8)
    fit = np.zeros((MILLI + 1, 1), dtype=i8)
    pods = np.ones((7, 1), dtype=i8)
    allowed = np.ones((2, 1), dtype=np.bool_)
    terms, parts, layout, _ = kernels.measure_rows(
        gpu_all, cpu_all, mem_all, model_all, version, at, nodes, need, ask, fit, pods, allowed,
        np.zeros(MILLI + 1, dtype=f8), np.ones(3, dtype=f8),
    )  # fmt: skip
    weighted = np.zeros(layout.shape[0], dtype=f8)
    kernels.finish_scores(gpu_all, version, at, np.zeros(2, dtype=f8), nodes, parts, weighted, layout, 1)
    needs, bits = np.ones((1, 3), dtype=i8), np.zeros(2, dtype=i8)
    count, hosts = np.zeros(1, dtype=i8), np.zeros((1, 2), dtype=np.bool_)
    drained = np.zeros(2, dtype=np.bool_)
    for every in (False, True):
        kernels.refresh_hosts(
            nodes, every, version, at.copy(), drained, gpu_all, cpu_all, mem_all, model_all, needs,
            np.ones(1, dtype=i8), bits, count, hosts,
        )  # fmt: skip
    kernels.lost_bits(nodes, np.ones(2, dtype=i8), gpu_all, cpu_all, mem_all, bits, needs, 1000, 1000)
    kernels.charge_terms(bits, np.ones(1, dtype=f8), 1, np.ones(1, dtype=i8), count)
    score = np.ones(2, dtype=f8)
    _, top, _, _ = kernels.charge_candidates(score, nodes, bits, version, 0, np.zeros(0, dtype=i8), score)
    kernels.charge_candidates(score, nodes, bits, version, 0, top, score)


def uncompiled() -> Kernels:
    """The same functions as plain Python (slow: for the tests)."""
    return Kernels(lambda function: function)


@functools.cache
def compiled() -> Kernels | None:
    """The compiled functions, compiled (or loaded from numba's cache) on the first call, or ``None`` when numba
    is not installed (the caller then runs NumPy). Where numba can keep no cache (a read-only install run by a user
    whose cache directory is not writable either: numba refuses ``cache=True`` with a RuntimeError), they are
    compiled without one."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; a build without it runs the NumPy code
        return None
    try:
        kernels = Kernels(functools.partial(numba.njit, cache=True, nogil=True))
    except RuntimeError:  # numba has nowhere to keep its cache (the package and the user's cache dir read-only)
        kernels = Kernels(functools.partial(numba.njit, cache=False, nogil=True))  # compiled in each process
    warm_up(kernels)
    return kernels
