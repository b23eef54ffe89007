"""The engine model: one replica's iteration-level continuous batching over a paged KV cache, in virtual time.

What it models (the way vLLM-class engines schedule):

- **Iterations.** Each iteration gives every decoding sequence one new token, then spends what is left of the token
  budget (``max_batch_tokens``) on prompt chunks: first of sequences already mid-prefill, then of waiting ones
  admitted in priority order (SLO class, then deadline). The iteration that finishes a sequence's prefill emits its
  next token (the first one for a new request). Its duration comes from the ``IterationTimes`` seam. With
  ``prefill_first`` the order is reversed (vLLM v0, the Splitwise simulator): prompts take the budget first and
  decoding sequences fill what is left, earliest first; the others skip that iteration, keeping their blocks.
- **Paged KV cache.** A sequence holds ``ceil(tokens / block_tokens)`` blocks. A new sequence is admitted only if
  the blocks of its whole prompt leave ``watermark`` blocks free, and it takes them all at once (a prefill that
  could not finish would only be preempted: long prompts in a small cache thrashed otherwise). When a decoding
  sequence needs a block and none is free, the lowest-priority running sequence is **preempted by recompute**: its
  blocks are freed and it waits again, to prefill its prompt plus what it had generated. A waiting sequence of a
  strictly more urgent class that cannot be admitted preempts running sequences of less urgent classes the same
  way, so a higher class is never starved by a lower one; a lower class is never admitted while a higher one
  waits.
- **Fast-forward.** A run of decode-only iterations with a fixed batch changes nothing but lengths, and its
  iteration times are affine in the KV tokens (``decode_affine``), so the engine plans it as one *segment* of k
  iterations in closed form, up to the next completion or the last iteration the free blocks allow. A request that
  arrives mid-segment cuts it at the next iteration boundary (it joins the batch there, as in a real engine).
- **Sharing a GPU.** ``slowdown`` (>= 1) stretches every iteration: the twin sets it from how many replicas on the
  same GPU are busy (they share its compute and memory bandwidth). A change takes effect at the next iteration
  boundary.

The engine is a state machine driven by the caller's clock: every call takes ``now`` and returns what completed as
data (``Completion``); ``next_event_s`` says when the caller must call ``advance`` next. No I/O, no clock.
"""

from __future__ import annotations

import heapq
import math

from tessera.serving.policies.engine_parts import (
    Completion,
    EngineConfig,
    EngineLoad,
    IterationTimes,
    Seq,
)
from tessera.serving.policies.requests import InferenceRequest, SloClass

_IDLE = math.inf


class Engine:
    """One replica's engine (see the module docstring)."""

    def __init__(self, config: EngineConfig, times: IterationTimes) -> None:
        self.config = config
        self.times = times
        self.slowdown = 1.0
        self.free_blocks = config.kv_blocks
        self.waiting: list[Seq] = []  # a heap by Seq.key
        self.running: list[Seq] = []
        self.iterations = 0  # iterations run so far
        self.preemptions = 0
        # The planned segment: k iterations from _start to _end (_end is inf when idle).
        self._start = 0.0
        self._end = _IDLE
        self._k = 0
        self._sigma = 1.0
        self._decode_only = True
        self._decoders: list[Seq] = []
        self._chunks: list[tuple[Seq, int]] = []
        self._c0 = 0.0  # decode segment: first iteration's duration before slowdown
        self._d = 0.0  # and how much each later iteration adds
        # Load counters kept incrementally (routers read them on every request).
        self._waiting_tokens = 0
        self._prefill_left = 0
        self._generated_running = 0

    # ----------------------------------------------------------------------------------------------- observers
    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def next_event_s(self) -> float:
        """When the planned segment ends (``inf`` when idle): call ``advance`` then."""
        return self._end

    def load(self) -> EngineLoad:
        pred = self.config.predicted_output_tokens
        running = len(self.running)
        decode_left = max(running * pred - self._generated_running, running)
        predicted = self._waiting_tokens + len(self.waiting) * pred + self._prefill_left + decode_left
        return EngineLoad(
            queued=len(self.waiting),
            running=running,
            predicted_tokens=predicted,
            kv_free_frac=self.free_blocks / self.config.kv_blocks,
            prefill_tokens=self._waiting_tokens + self._prefill_left,
        )

    def yields_to(self, slo: SloClass) -> bool:
        """Whether a request of class ``slo`` submitted now would get in ahead of work already here: something less
        urgent runs and nothing as urgent waits (with priority on; the engine then preempts for it)."""
        if not self.config.priority or any(s.req.slo <= slo for s in self.waiting):
            return False
        return any(s.req.slo > slo for s in self.running)

    def in_flight(self) -> int:
        return len(self.running) + len(self.waiting)

    # -------------------------------------------------------------------------------------------------- inputs
    def submit(self, request: InferenceRequest, now_s: float) -> list[Completion]:
        """Queue ``request`` at ``now_s``; returns what completed up to then (and the request itself, refused,
        when it can never fit in the cache)."""
        done = self.advance(now_s)
        if request.prompt_tokens + request.output_tokens > self.config.max_tokens:
            need = request.prompt_tokens + request.output_tokens
            reason = f"needs {need} tokens; the KV cache holds {self.config.max_tokens}"
            done.append(Completion(request, math.nan, now_s, refused=reason))
            return done
        key = request.priority_key() if self.config.priority else (request.arrival_s, request.id)
        self._push_waiting(Seq(request, key))
        if self._end == _IDLE:
            self._plan(now_s)
        else:
            self._cut(now_s)
        return done

    def cancel(self, request_id: int, now_s: float) -> list[Completion]:
        """Drop request ``request_id`` at ``now_s`` wherever it is (its client went away): its blocks are free at
        once and it never completes. Returns what completed up to then; an unknown id changes nothing."""
        done = self.advance(now_s)
        for s in self.waiting:
            if s.req.id == request_id:
                self.waiting.remove(s)
                heapq.heapify(self.waiting)
                self._waiting_tokens -= s.target
                return done
        for s in self.running:
            if s.req.id == request_id:
                self._cut(now_s)  # the planned segment ends at the next boundary, then is planned without it
                self.running.remove(s)
                self._decoders = [d for d in self._decoders if d is not s]
                self._chunks = [c for c in self._chunks if c[0] is not s]
                self.free_blocks += s.blocks
                self._prefill_left -= s.target - s.kv
                self._generated_running -= s.generated
                s.blocks = 0
                break
        return done

    def set_slowdown(self, slowdown: float, now_s: float) -> list[Completion]:
        """Stretch iterations from the next boundary on by ``slowdown`` (>= 1)."""
        if slowdown < 1.0:
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        done = self.advance(now_s)
        if slowdown != self.slowdown:
            self.slowdown = slowdown
            self._cut(now_s)
        return done

    def advance(self, now_s: float) -> list[Completion]:
        """Run every iteration that ends by ``now_s``; returns the requests that finished."""
        done: list[Completion] = []
        while self._end <= now_s:
            end = self._end
            self._finish_segment(done)
            self._plan(end)
        return done

    # ---------------------------------------------------------------------------------------------- planning
    def _plan(self, t: float) -> None:
        """Plan the segment that starts at ``t``: one iteration with prefill work, or a run of decode-only ones."""
        self._start = t
        if self.idle:
            self._end = _IDLE
            self._k = 0
            return
        cfg = self.config
        self._preempt_for_priority()
        decoders = self._decoders_with_slots()
        if cfg.prefill_first:
            chunks = self._prefill_chunks(cfg.max_batch_tokens)
            room = cfg.max_batch_tokens - sum(c for _, c in chunks)
            if chunks and room < len(decoders):  # the later ones skip this iteration (each keeps its slot)
                decoders = sorted(decoders, key=_key)[: max(room, 0)]
        else:
            chunks = self._prefill_chunks(cfg.max_batch_tokens - len(decoders))
        self._sigma = self.slowdown
        self._decoders = decoders
        self._chunks = chunks
        if chunks:
            self._decode_only = False
            self._k = 1
            prefill = sum(c for _, c in chunks)
            kv = sum(s.kv for s in decoders)
            self._end = t + self._sigma * self.times.iteration_s(prefill, len(decoders), kv)
            return
        if not decoders:  # only sequences mid-prefill that the cache cannot extend: make room
            self._preempt(max(self.running, key=_key))
            self._plan(t)
            return
        self._decode_only = True
        batch = len(decoders)
        intercept, slope = self.times.decode_affine(batch)
        self._c0 = intercept + slope * sum(s.kv for s in decoders)
        self._d = slope * batch
        k = min(s.req.output_tokens - s.generated for s in decoders) if cfg.fast_forward else 1
        self._k = self._blocks_allow(decoders, k)
        self._end = t + self._sigma * self._decode_time(self._k)

    def _decode_time(self, k: int) -> float:
        return k * self._c0 + self._d * k * (k - 1) / 2

    def _preempt_for_priority(self) -> None:
        """A waiting sequence of a more urgent class that cannot be admitted preempts less urgent running ones."""
        if not self.config.priority:
            return
        while self.waiting and self.running:
            head = self.waiting[0]
            lowest = max(self.running, key=_key)
            if lowest.req.slo <= head.req.slo:
                return
            # Admission (below) needs the head's whole prompt beside the blocks the decoders take for their
            # next token, and the watermark: judge the room the same way, or the head waits a whole segment.
            bt = self.config.block_tokens
            slots = sum(1 for s in self.running if not s.prefilling and s.blocks * bt <= s.kv)
            need = self.config.blocks_for(head.target) + slots
            room = self.free_blocks - need >= self.config.watermark
            if room and len(self.running) < self.config.max_running:
                return
            self._preempt(lowest)

    def _decoders_with_slots(self) -> list[Seq]:
        """The decoding sequences, each holding a block for the token it writes next (preempting when short)."""
        bt = self.config.block_tokens
        while True:
            decoders = [s for s in self.running if not s.prefilling]
            need = sum(1 for s in decoders if s.blocks * bt <= s.kv)
            if need <= self.free_blocks:
                break
            self._preempt(max(self.running, key=_key))
        for s in decoders:
            self._allocate(s, s.kv + 1)
        return decoders

    def _prefill_chunks(self, budget: int) -> list[tuple[Seq, int]]:
        """Prompt chunks for this iteration: sequences mid-prefill first, then waiting ones in priority order."""
        cfg = self.config
        chunks: list[tuple[Seq, int]] = []
        for s in self.running:
            if budget <= 0:
                break
            if not s.prefilling:
                continue
            left = s.target - s.kv
            chunk = left if not cfg.chunked_prefill and not chunks else min(left, budget)
            chunk = min(chunk, (s.blocks + self.free_blocks) * cfg.block_tokens - s.kv)
            if chunk <= 0:
                continue
            self._allocate(s, s.kv + chunk)
            chunks.append((s, chunk))
            budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running:
            head = self.waiting[0]
            if not self.running:  # an empty engine takes what its whole cache allows, watermark or not
                chunk = head.target if not cfg.chunked_prefill else min(head.target, budget)
                chunk = min(chunk, self.free_blocks * cfg.block_tokens)
            elif cfg.chunked_prefill:
                chunk = min(head.target, budget)
            elif head.target <= budget or not chunks:
                chunk = head.target
            else:
                break
            if self.running and self.free_blocks - cfg.blocks_for(head.target) < cfg.watermark:
                break  # a prefill is started only when the cache holds all of it (no prefill that cannot finish)
            heapq.heappop(self.waiting)
            head.admitted_s = (*head.admitted_s, self._start)
            self._waiting_tokens -= head.target
            self.running.append(head)
            self._prefill_left += head.target
            self._generated_running += head.generated
            self._allocate(head, head.target)
            chunks.append((head, chunk))
            budget -= chunk
        return chunks

    def _blocks_allow(self, decoders: list[Seq], k: int) -> int:
        """The most decode iterations, up to ``k``, that the free blocks allow (each holds >= 1)."""
        bt = self.config.block_tokens
        free = self.free_blocks

        def extra(n: int) -> int:  # blocks needed beyond those held after n more tokens
            return sum(max(0, -(-(s.kv + n) // bt) - s.blocks) for s in decoders)

        if len(decoders) * (k // bt + 1) <= free or extra(k) <= free:
            return k
        lo, hi = 1, k  # extra(lo) <= free < extra(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _cut(self, now_s: float) -> None:
        """End the planned decode segment at the first iteration boundary after ``now_s``."""
        if not self._decode_only or self._k <= 1 or self._end == _IDLE:
            return
        elapsed = (now_s - self._start) / self._sigma
        c0, d = self._c0, self._d
        if d > 0:
            b = c0 - d / 2
            k_done = int((-b + math.sqrt(b * b + 2 * d * max(elapsed, 0.0))) / d)
        else:
            k_done = int(max(elapsed, 0.0) / c0) if c0 > 0 else self._k
        k_done = min(max(k_done, 0), self._k)
        while k_done < self._k and self._decode_time(k_done + 1) <= elapsed:
            k_done += 1
        while k_done > 0 and self._decode_time(k_done) > elapsed:
            k_done -= 1
        cut = min(k_done + 1, self._k)
        if cut < self._k:
            self._k = cut
            self._end = self._start + self._sigma * self._decode_time(cut)

    # ------------------------------------------------------------------------------------------------ applying
    def _finish_segment(self, done: list[Completion]) -> None:
        end, k = self._end, self._k
        self.iterations += k
        finished = False
        for s in self._decoders:
            s.kv += k
            s.generated += k
            self._allocate(s, s.kv)
            finished |= s.generated >= s.req.output_tokens
        self._generated_running += k * len(self._decoders)
        for s, chunk in self._chunks:
            s.kv += chunk
            self._prefill_left -= chunk
            if not s.prefilling:
                s.generated += 1
                self._generated_running += 1
                if math.isnan(s.first_token_s):
                    s.first_token_s = end
                finished |= s.generated >= s.req.output_tokens
        self._decoders = []
        self._chunks = []
        if finished:
            keep: list[Seq] = []
            for s in self.running:
                if s.generated >= s.req.output_tokens:
                    self.free_blocks += s.blocks
                    self._generated_running -= s.generated
                    done.append(Completion(s.req, s.first_token_s, end, s.preemptions, admitted_s=s.admitted_s))
                else:
                    keep.append(s)
            self.running = keep

    def _allocate(self, s: Seq, tokens: int) -> None:
        """Grow ``s`` to hold ``tokens`` tokens of context (never shrinks)."""
        new = self.config.blocks_for(tokens) - s.blocks
        if new > 0:
            if new > self.free_blocks:
                raise AssertionError(f"KV cache over-allocated: {new} blocks wanted, {self.free_blocks} free")
            s.blocks += new
            self.free_blocks -= new

    def _preempt(self, s: Seq) -> None:
        """Drop ``s``'s cache and send it back to wait; it will recompute its prompt and what it generated."""
        self.running.remove(s)
        self.free_blocks += s.blocks
        self._prefill_left -= s.target - s.kv
        self._generated_running -= s.generated
        s.blocks = 0
        s.kv = 0
        s.target = s.req.prompt_tokens + s.generated
        s.preemptions += 1
        self.preemptions += 1
        self._push_waiting(s)

    def _push_waiting(self, s: Seq) -> None:
        heapq.heappush(self.waiting, s)
        self._waiting_tokens += s.target


def _key(s: Seq) -> tuple[float, ...]:
    return s.key
