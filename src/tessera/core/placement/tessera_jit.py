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
- ``refresh_hosts`` and ``lost_bits``: ``ShapeReserve``'s hosted shapes of the nodes that changed and the shapes a
  placement would take away, as bits (integer arithmetic);
- ``charge_terms``: the reserve's charge per host of each shape and the lost shapes as a 0/1 matrix, for NumPy's
  ``einsum`` (again one call, so that the charge is rounded as before).

The functions here are plain Python that numba compiles (``compiled()``, ``cache=True``: the machine code is kept
in ``__pycache__`` and loaded in a fraction of a second by later processes); the tests run them uncompiled too.
When numba is not installed, ``compiled()`` returns ``None`` and the NumPy code runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from tessera.core.cluster import IntArray
from tessera.core.fragmentation import FloatArray

MILLI = 1000  # MILLI_PER_GPU, as a literal the compiler folds
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
        idle_int = 0
        for j in range(g):
            idle_int += buf[j]
        md = model_all[n]
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


def refresh_hosts(
    nodes: IntArray,
    every: bool,
    version: IntArray,
    seen: IntArray,
    drained: Any,
    gpu_all: IntArray,
    cpu_all: IntArray,
    mem_all: IntArray,
    model_all: IntArray,
    needs: IntArray,
    allowed_bits: IntArray,
    host_bits: IntArray,
    host_count: IntArray,
    hosts: Any,
) -> None:
    """``ShapeReserve._refresh`` of ``nodes`` (``every``: all nodes) whose version changed: the shapes each can host
    now (``needs[shape] = (GPUs, CPU, memory)``, ``allowed_bits[model]``), as bits, as rows of ``hosts`` and in the
    per-shape ``host_count``."""
    shapes = needs.shape[0]
    count = version.shape[0] if every else nodes.shape[0]
    for t in range(count):
        n = t if every else nodes[t]
        if seen[n] == version[n]:
            continue
        now = 0
        if not drained[n]:
            whole = 0
            for j in range(gpu_all.shape[1]):
                if gpu_all[n, j] == MILLI:
                    whole += 1
            c = cpu_all[n]
            mm = mem_all[n]
            for s in range(shapes):
                if whole >= needs[s, 0] and c >= needs[s, 1] and mm >= needs[s, 2]:
                    now |= 1 << s
            now &= allowed_bits[model_all[n]]
        before = host_bits[n]
        if now != before:
            for s in range(shapes):
                bit_now = (now >> s) & 1
                if bit_now != (before >> s) & 1:
                    host_count[s] += 1 if bit_now else -1
                    hosts[s, n] = bit_now == 1
            host_bits[n] = now
        seen[n] = version[n]


def lost_bits(
    nodes: IntArray,
    taken: IntArray,
    gpu_all: IntArray,
    cpu_all: IntArray,
    mem_all: IntArray,
    host_bits: IntArray,
    needs: IntArray,
    cpu: int,
    mem: int,
) -> IntArray:
    """``ShapeReserve.lost_bits`` with the hosted shapes up to date: the shapes each of ``nodes`` hosts now and not
    after a placement that takes ``taken`` whole GPUs, ``cpu`` and ``mem`` there."""
    k = nodes.shape[0]
    out = np.zeros(k, dtype=np.int64)
    for i in range(k):
        n = nodes[i]
        bits = host_bits[n]
        if bits == 0:
            continue
        whole = -taken[i]
        for j in range(gpu_all.shape[1]):
            if gpu_all[n, j] == MILLI:
                whole += 1
        c = cpu_all[n] - cpu
        mm = mem_all[n] - mem
        for s in range(needs.shape[0]):
            if (bits >> s) & 1 and whole >= needs[s, 0] and c >= needs[s, 1] and mm >= needs[s, 2]:
                bits &= ~(1 << s)
        out[i] = bits
    return out


def charge_terms(
    bits: IntArray, count_of_shape: FloatArray, requests_seen: int, gpus: IntArray, host_count: IntArray
) -> tuple[FloatArray, FloatArray]:
    """``ShapeReserve.charge_bits``' operands: the charge per host of each shape, ``share * 1000 * GPUs / hosts``,
    and ``lost[shape, node]`` (0 or 1) from each node's lost ``bits``."""
    shapes = gpus.shape[0]
    k = bits.shape[0]
    per_host = np.empty(shapes, dtype=np.float64)
    lost = np.empty((shapes, k), dtype=np.float64)
    for s in range(shapes):
        share = count_of_shape[s] / requests_seen
        per_host[s] = share * MILLI * gpus[s] / max(host_count[s], 1)
        for i in range(k):
            lost[s, i] = float((bits[i] >> s) & 1)
    return per_host, lost


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
    """The compiled functions."""

    def __init__(self, njit: Any) -> None:
        self.measure_rows = njit(measure_rows)
        self.finish_scores = njit(finish_scores)
        self.refresh_hosts = njit(refresh_hosts)
        self.lost_bits = njit(lost_bits)
        self.charge_terms = njit(charge_terms)


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


@functools.cache
def compiled() -> Kernels | None:
    """The compiled functions, compiled (or loaded from numba's cache) on the first call, or ``None`` when numba
    is not installed (the caller then runs NumPy)."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; a build without it runs the NumPy code
        return None
    kernels = Kernels(functools.partial(numba.njit, cache=True, nogil=True))
    warm_up(kernels)
    return kernels
