"""Starting workloads off the scheduler loop's thread: ``Backend.launch`` can take long (the local backend forks and
execs a Python supervisor per workload: tens of milliseconds each on a loaded host, so seconds for a wave of binds),
and a scheduling step that waited for it could neither collect ends nor apply cancels meanwhile.

The loop hands each launch to ``LaunchWorker.submit`` (after its decision is stored: nothing acts before it is
durable) and takes the outcomes back with ``results`` at its next step, when it stores the handles in one batch.
A launch still queued can be taken back (``withdraw``): a workload cancelled or preempted before its launch began is
never started. One worker thread serves the queue in order; it runs only while there is work (it ends once the
queue is empty and the next ``submit`` starts another), so an idle loop holds no thread.

A host out of threads (``RuntimeError: can't start new thread``) must not wedge it (issue 25): ``submit`` either
queues the launch with a live thread to make it, or raises with nothing queued (the loop hands it over again at its
next step); a worker thread that died is replaced by the next ``submit`` or ``revive``, and a launch it was making
comes back rather than never: with the handle the backend finds for it (``Backend.find``) when its process started,
else failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from tessera.backends.base import Backend, Handle, LaunchSpec
from tessera.errors import TesseraError
from tessera.faults import fail_point

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Launched:
    """The outcome of one launch: the backend's handle, or why it could not start."""

    workload_id: int
    handle: Handle | None
    error: str | None = None


class LaunchWorker:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a launch finishes or the queue empties
        self._queue: OrderedDict[int, LaunchSpec] = OrderedDict()
        self._in_flight: int | None = None  # the workload whose launch the worker is making now
        self._done: list[Launched] = []
        self._thread: threading.Thread | None = None

    def submit(self, workload_id: int, spec: LaunchSpec) -> None:
        """Queue the launch of ``workload_id``; the worker makes it as soon as the launches before it are made.
        Raises, with nothing queued, when no worker thread can be started (``RuntimeError``)."""
        with self._lock:
            queued = workload_id in self._queue
            self._queue[workload_id] = spec
            try:
                self._start_worker()
            except BaseException:
                if not queued:
                    del self._queue[workload_id]
                raise

    def revive(self) -> None:
        """Start a worker for launches left queued by one that died; raises when no thread can be started."""
        with self._lock:
            if self._queue:
                self._start_worker()

    def _start_worker(self) -> None:
        """Under the lock: a live worker thread serves the queue (one is started unless one runs)."""
        if self._thread is not None and self._thread.is_alive():
            return
        thread = threading.Thread(target=self._work, name="tessera-launcher", daemon=True)
        fail_point("launch-submit", "can't start new thread")  # fault injection: a host out of threads
        thread.start()
        self._thread = thread

    def withdraw(self, workload_id: int) -> bool:
        """Take a queued launch back: True when it had not begun (it never will), False when it is being made or
        was made (its outcome comes through ``results``)."""
        with self._lock:
            return self._queue.pop(workload_id, None) is not None

    def withdraw_all(self) -> list[int]:
        """Take back every launch that has not begun (shutting down); returns their workload ids."""
        with self._lock:
            ids = list(self._queue)
            self._queue.clear()
            return ids

    def results(self) -> list[Launched]:
        """The launches made since the last call, in the order they were made."""
        with self._lock:
            done, self._done = self._done, []
            return done

    def wait(self, timeout_s: float) -> bool:
        """Until no launch is queued or being made, at most ``timeout_s``; True when none is."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._queue or self._in_flight is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def pending(self) -> int:
        """Launches queued or being made."""
        with self._lock:
            return len(self._queue) + (self._in_flight is not None)

    def _work(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._thread = None  # the next submit starts a new worker
                        self._changed.notify_all()
                        return
                    workload_id, spec = self._queue.popitem(last=False)
                    self._in_flight = workload_id
                outcome = self._launch(workload_id, spec)
                with self._lock:
                    self._in_flight = None
                    self._done.append(outcome)
                    self._changed.notify_all()
        except BaseException as exc:  # never expected (``_launch`` catches): the next worker takes the queue over
            log.exception("the launch worker died; the next step starts another")
            in_flight = self._in_flight  # set and cleared by this thread alone
            lost = None if in_flight is None else self._lost_launch(in_flight, exc)
            with self._lock:
                if lost is not None:
                    self._done.append(lost)
                self._in_flight = None
                self._thread = None
                self._changed.notify_all()

    def _lost_launch(self, workload_id: int, exc: BaseException) -> Launched:
        """The outcome of the launch this thread was making when it died: the process may have started (the backend
        knows it: ``Backend.find``), else the launch failed. Never failed while it runs: its GPU would go to another
        workload."""
        try:
            handle = self.backend.find(str(workload_id))
        except Exception:
            log.exception("workload %s: the backend could not say whether its launch started", workload_id)
            handle = None
        if handle is not None:
            log.warning("workload %s: its launch started before the launcher died; it runs", workload_id)
            return Launched(workload_id, handle)
        return Launched(workload_id, None, f"could not start: the launcher died: {exc!r}")

    def _launch(self, workload_id: int, spec: LaunchSpec) -> Launched:
        try:
            return Launched(workload_id, self.backend.launch(spec))
        except (OSError, TesseraError) as exc:
            return Launched(workload_id, None, start_error(exc))
        except Exception as exc:  # a backend's bug must not end the worker with the queue still full
            log.exception("launching workload %s failed", workload_id)
            return Launched(workload_id, None, start_error(exc))


def start_error(exc: Exception) -> str:
    """The reason stored for a launch that failed with ``exc``: an ``OSError`` (e.g. its working directory does not
    exist) said without its errno number, with the file it names; a ``TesseraError`` as it is; another with its
    type."""
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"could not start: {exc.strerror or exc}{where}"
    if isinstance(exc, TesseraError):
        return f"could not start: {exc}"
    return f"could not start: {type(exc).__name__}: {exc}"
