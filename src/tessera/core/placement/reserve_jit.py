"""The reserve's part of tessera's compiled scoring (``tessera_jit``): integer loops over the hosted shapes as bits.

- ``refresh_hosts``: ``ShapeReserve._refresh`` of the nodes that changed (the shapes each can host now);
- ``lost_bits``: the shapes a placement would take away (``ShapeReserve.lost_bits``);
- ``charge_terms``: the charge per host of each shape and the lost shapes as a 0/1 matrix, the operands of the
  ``einsum`` that ``ShapeReserve.charge_bits`` keeps (one call, so that the charge is rounded as before);
- ``charge_candidates``: ``ShapeReserve.adjust_best_bits``' choice of the nodes to charge (the best scores, then
  those whose score reaches the best charged one), with their kept bits.

Plain Python that ``tessera_jit.compiled()`` compiles with numba; the tests also run it uncompiled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.core.cluster import IntArray
from tessera.core.fragmentation import FloatArray

MILLI = 1000  # MILLI_PER_GPU, as a literal the compiler folds


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


def charge_candidates(
    score: FloatArray,
    nodes: IntArray,
    bits: IntArray,
    shapes_known: IntArray,
    shapes: int,
    top: IntArray,
    charge: FloatArray,
) -> tuple[FloatArray, IntArray, IntArray, int]:
    """The positions ``ShapeReserve.adjust_best_bits`` charges, with their kept lost-shape ``bits`` (by node).

    With no ``top`` yet: the positions of the best ``score``. Given the ``top`` positions and their ``charge``:
    ``score`` with them charged, and the other positions whose score reaches the best charged one (they may win
    once charged too). Also whether any of the positions' bits is set: 1 or 0, or -1 when one of them was kept
    before the reserve knew ``shapes`` shapes (the caller then completes it)."""
    final = score.copy()
    first = top.shape[0] == 0
    if first:
        best = score[0]
        for i in range(1, score.shape[0]):
            if score[i] > best:
                best = score[i]
        bar = best
    else:
        best = score[top[0]]
        bar = score[top[0]] - charge[0]
        for t in range(top.shape[0]):
            final[top[t]] = score[top[t]] - charge[t]
            if final[top[t]] > bar:
                bar = final[top[t]]
    count = 0
    for i in range(score.shape[0]):
        if (score[i] == best) if first else (score[i] >= bar and score[i] != best):
            count += 1
    at = np.empty(count, dtype=np.int64)
    out = np.empty(count, dtype=np.int64)
    status = 0
    t = 0
    for i in range(score.shape[0]):
        if (score[i] == best) if first else (score[i] >= bar and score[i] != best):
            at[t] = i
            out[t] = bits[nodes[i]]
            if shapes_known[nodes[i]] != shapes:
                status = -1
            elif out[t] != 0 and status == 0:
                status = 1
            t += 1
    return final, at, out, status
