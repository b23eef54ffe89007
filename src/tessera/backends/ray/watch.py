"""What the Ray backend's ``poll`` follows of a workload: its actors (one, or one per part of a gang across nodes),
each with one outstanding call, the logs it ships to the server, and the workload's end.

- ``ActorWatch``: one actor. Its outstanding call is a ``progress`` long poll (``progress_ranks`` when it ships more
  than one log: a gang's ranks that log apart, or a part); each answer appends the new bytes of each of its logs
  (keys as the actor names them: 0 its main log, r rank r's) to that log's file here, under the cap, with one writer
  per file from the first bytes to the end. Once the actor says it ended, it has no call until the workload's
  cleanup; an actor that is gone (``RayActorError``...) ended with exit code None (unknown).
- ``WorkloadWatch``: the workload. The first actor that ends with a failure (a nonzero code, or None) gives the
  workload's exit code, and the others are stopped then (SIGTERM now, SIGKILL after ``GANG_STOP_GRACE_S``, as a
  gang's ranks on one node are), unless a stop was asked already. Once every actor has ended, each is asked to
  clean up (remove its files and exit); once all have, the end is reported (0 when every actor ended with 0).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from tessera.backends import capped_log
from tessera.backends.base import ExitStatus, Handle
from tessera.backends.gang_ranks import GANG_STOP_GRACE_S

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ActorWatch:
    """One actor of a workload (see the module's doc). ``actor`` None: gone before any server watched it."""

    workload_id: str
    actor: Any  # ray.actor.ActorHandle
    name: str  # the actor's name, for messages
    log_max_bytes: int  # the cap of the files here (capped_log): this server writes them, as the actor sends them
    destinations: dict[int, Path]  # the actor's logs -> their files here (empty: the workload's log is discarded)
    offsets: dict[int, int]  # the actor's logs -> bytes received so far
    call: Any = None  # the outstanding call (ray.ObjectRef): progress, else cleanup; None: waits for the others
    ended: bool = False
    exit_code: int | None = None
    cleaning: bool = False  # ``call`` is its cleanup
    cleaned: bool = False
    logs: dict[int, capped_log.CappedLog] = field(default_factory=dict)  # the open writers of ``destinations``

    def append_log(self, chunk: bytes, key: int = 0) -> None:
        """Appends what the actor sent of its log ``key`` to that log's file here under its cap (a character split
        between two answers is held until its end comes, as the supervisor's pipe does)."""
        self.offsets[key] = self.offsets.get(key, 0) + len(chunk)
        path = self.destinations.get(key)
        if path is None:
            return
        try:
            log = self.logs.get(key)
            if log is None:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                log = self.logs[key] = capped_log.CappedLog(path, self.log_max_bytes)
            log.write(chunk)
        except OSError as error:
            logger.warning("%s: cannot write its log %s: %s", self.workload_id, path, error)

    def close_log(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs.clear()

    def ask_progress(self, wait_s: float) -> None:
        """Submits the next progress call (``progress_ranks`` for an actor with more than its main log)."""
        if set(self.offsets) == {0}:
            self.call = self.actor.progress.remote(self.offsets[0], wait_s)
        else:
            self.call = self.actor.progress_ranks.remote(dict(self.offsets), wait_s)

    def gone(self) -> None:
        """Ended with an unknown exit code: its actor died (or was never there), nothing of it to clean up."""
        self.actor, self.call, self.ended, self.exit_code, self.cleaned = None, None, True, None, True

    def advance(self, wait_s: float) -> None:
        """Takes the answer of the outstanding call (ready): log bytes appended; the end noted, or the next call."""
        if self.cleaning:  # its actor has removed its files and exited
            self.call, self.cleaned = None, True
            return
        try:
            answer, code, ended = ray.get(self.call, timeout=0)
        except ActorUnavailableError:  # not known dead yet (a node that may come back): ask again
            self.ask_progress(wait_s)
            return
        except (RayActorError, GetTimeoutError, RayError) as error:
            logger.warning("%s: its actor %s is gone (%s)", self.workload_id, self.name, type(error).__name__)
            self.gone()
            return
        chunks: Mapping[int, bytes] = answer if isinstance(answer, dict) else {0: answer}
        for key, chunk in chunks.items():
            if chunk and key in self.offsets:
                self.append_log(chunk, key)
        if ended:
            self.call, self.ended, self.exit_code = None, True, code
        else:
            self.ask_progress(wait_s)

    def clean_up(self) -> None:
        if self.actor is None or self.cleaned:
            self.cleaned = True
            return
        self.call, self.cleaning = self.actor.cleanup.remote(), True


@dataclass(slots=True)
class WorkloadWatch:
    """A workload's actors (the first: the workload's own, with rank 0) and its end (see the module's doc)."""

    handle: Handle
    actors: list[ActorWatch]
    failure: ActorWatch | None = None  # the first actor seen ending with a failure
    stopping: bool = False  # a stop was asked: by ``stop``, or after a part failed
    cleaning: bool = False
    listen: tuple[str, int] | None = None  # where the workload listens, as its actor said (``listen_address``)
    asking: Any = None  # the outstanding ``listening`` call that asks it

    def calls(self) -> list[Any]:
        return [actor.call for actor in self.actors if actor.call is not None]

    def stop(self, grace_s: float) -> None:
        """SIGTERM to every actor's workload that has not ended, SIGKILL after ``grace_s`` (the guards keep it)."""
        self.stopping = True
        for watch in self.actors:
            actor = watch.actor  # read once: ``poll`` may find it gone meanwhile (API threads stop)
            if not watch.ended and actor is not None:
                actor.stop.remote(max(grace_s, 0.0))

    def settle(self) -> ExitStatus | None:
        """After the answers of a poll: the first failure stops the rest; every actor ended: their cleanup; every
        cleanup done: the workload's end (the first failure's code, 0 when every actor exited 0)."""
        if self.failure is None:
            self.failure = next((w for w in self.actors if w.ended and w.exit_code != 0), None)
            if self.failure is not None and len(self.actors) > 1 and not self.stopping:
                running = [w.name for w in self.actors if not w.ended]
                logger.warning(
                    "%s: %s ended with exit code %s%s",
                    self.handle.workload_id,
                    self.failure.name,
                    self.failure.exit_code,
                    f": stopping {', '.join(running)}" if running else "",
                )
                self.stop(GANG_STOP_GRACE_S)
        if not all(watch.ended for watch in self.actors):
            return None
        if not self.cleaning:
            self.cleaning = True
            for watch in self.actors:
                watch.clean_up()
        if not all(watch.cleaned for watch in self.actors):
            return None
        return ExitStatus(self.handle.workload_id, 0 if self.failure is None else self.failure.exit_code)

    def listen_address(self) -> tuple[str, int] | None:
        """Where the workload's own actor says it listens, once only the workload's processes listen there (its
        ``listening``: asked again at each call until it says so, read when it has answered, never waited for);
        None until then, once it ended, or when it listens on no port of its node."""
        first = self.actors[0]
        if self.listen is not None or first.actor is None or first.ended:
            return None if first.ended else self.listen
        if self.asking is None:
            self.asking = first.actor.listening.remote()
            return None
        ready, _ = ray.wait([self.asking], timeout=0)
        if not ready:
            return None
        try:
            answer: tuple[str, int] | None = ray.get(self.asking, timeout=0)
        except RayError as error:  # asked again next time (the actor's end comes through ``poll``)
            logger.warning("%s: its actor does not say where it listens (%s)", self.handle.workload_id, error)
            answer = None
        self.asking = None
        if answer is not None:
            self.listen = (str(answer[0]), int(answer[1]))
        return self.listen

    def close_logs(self) -> None:
        for watch in self.actors:
            watch.close_log()
