"""The local backend: runs each workload as real processes on this host, for the control plane (``tessera up``).

Every workload runs under ``tessera.backends.supervisor`` (see there), started in a new session so that it leads the
workload's process group and keeps running if the server dies. The supervisor writes the command's exit code to
``<run_dir>/<id>.exit`` (the id percent-encoded) and then kills whatever is left of the workload.

- **Host isolation and containment** (``local_exec.py``): the supervisor runs with an environment of its own, the
  command with a clean one (never the server's), as its tenant's OS user when the server is root and ``accounts``
  are given; each workload has a cgroup of its own where one is usable (the supervisor a subreaper besides), which
  ``poll`` kills when the workload ends, also when the supervisor itself was SIGKILLed, and then removes.

- **Exit codes.** ``poll`` reports the code from the exit file. Without one (the supervisor itself was killed): -9
  if this backend sent SIGKILL, else minus the signal that killed the supervisor when it is this process's child,
  else None (unknown).
- **Stop.** ``stop`` sends SIGTERM at once (to the supervisor, which relays it to the whole group once; to the group
  directly if the supervisor is gone) and records a deadline; the ``poll`` after the deadline SIGKILLs the group.
  So ``poll`` must be called regularly (the server loop calls it about every 0.2 s); ``close`` drops pending kills.
- **Handles.** ``launch`` returns a ``Handle`` of kind ``"local"`` whose data are the supervisor's ``pid``, its
  process group ``pgid`` (the same number), ``started_marker`` (its start time from ``/proc``, which tells a reused
  PID apart) and ``exit_file``. Only this module reads them; ``pids(handle)`` lists the group's live processes.
- **Adoption.** A restarted server hands ``adopt`` the ``Handle`` it stored, or the one ``find`` reads back
  from ``<run_dir>/<id>.ref.json`` (written by ``launch``, removed by ``forget`` once the server stored the end);
  if the server died before that write, ``find`` finds the supervisor by the launch intent written before the fork
  (``launch_intent``), or, when it has ended, gives a handle without a process (pid 0) whose end the exit file
  tells. Both files outlive the end's report until ``forget``, so a server killed before it stored a reported end
  (even its handle) finds the workload again rather than launching it twice. Such a process is
  not our child: it counts as running while ``/proc/PID/stat`` exists, is not a zombie, and shows the recorded start
  time, so a reused PID reads as ended (and is never signalled). Exit files stay after the end is reported (a server
  that dies before recording the end reads them again); ``launch`` of the same id removes the old one.
- **Nothing left behind.** When a workload ends, ``poll`` SIGKILLs its group and its cgroup once more and reports the
  end only when no process of either is left running (or after ``DRAIN_TIMEOUT_S``, with a warning).

Linux only (``/proc``, process groups). Thread-safe: one lock guards the state, so API threads may call ``stop``
while the server loop calls ``poll``. ``launch`` does not hold it while the process starts (a fork and exec: tens of
milliseconds on a busy host), so ``poll`` and ``stop`` never wait for a launch made on another thread; ``stop`` of
a workload whose launch has not returned yet does nothing (the caller stops it once it has the handle).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tessera.backends import procfs
from tessera.backends.accounts import TenantAccounts
from tessera.backends.base import Backend, BackendNode, ExitStatus, Handle, LaunchSpec
from tessera.backends.launch_intent import NONCE_ENV, Intent, find_launched, write_intent
from tessera.backends.local_exec import SUPERVISOR_MODULE, LocalExec, open_log, stop_signals_held
from tessera.backends.local_files import (
    KIND,
    LocalProcess,
    file_stem,
    handle_of_file,
    process_of,
    read_exit_file,
    write_atomically,
)
from tessera.backends.local_watch import Watch, group_exists, reap_released_children, release_children
from tessera.core.errors import InvalidRequestError, TesseraError
from tessera.faults import crash_point

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 5.0  # how long an ended workload's SIGKILLed processes may take to vanish before we report anyway
__all__ = ["SUPERVISOR_MODULE", "LocalBackend"]
NODE_NAME = "local"  # as ``tessera.gpu.gpus.GpuDevice.node`` names this host


class LocalBackend:
    """``Backend`` that runs workloads as processes on this host; per-workload exit files live in ``run_dir``."""

    kind = KIND

    def __init__(
        self,
        run_dir: Path,
        python: str = sys.executable,
        *,
        containment: str = "auto",
        accounts: TenantAccounts | None = None,
    ) -> None:
        """``containment``: "auto" (the best usable cgroup, else the subreaper alone), "none" or one of
        ``cgroups.KINDS`` (``OSError`` when not usable). ``accounts``: run workloads as their tenants' OS users."""
        if not procfs.PROC_ROOT.joinpath("self", "stat").exists():
            raise TesseraError("the local backend needs Linux (/proc is not available)")
        self.run_dir = run_dir.absolute()  # the supervisor runs from /: every path it is given must be absolute
        self.python = python
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.exec = LocalExec(python, containment, run_dir, accounts)
        self._lock = threading.Lock()
        self._watches: dict[str, Watch] = {}
        self._starting: set[str] = set()  # ids whose launch is starting their process (not watched yet)

    def exit_path(self, workload_id: str) -> Path:
        """Where the supervisor of ``workload_id`` writes its exit code."""
        return self.run_dir / f"{file_stem(workload_id)}.exit"

    def ref_path(self, workload_id: str) -> Path:
        """Where ``launch`` records the handle of ``workload_id`` until its end is reported (for ``find``)."""
        return self.run_dir / f"{file_stem(workload_id)}.ref.json"

    def intent_path(self, workload_id: str) -> Path:
        """Where ``launch`` records, before the fork, that it starts ``workload_id`` (``launch_intent``)."""
        return self.run_dir / f"{file_stem(workload_id)}.intent.json"

    def nodes(self) -> list[BackendNode]:
        """This host, the only one."""
        return [BackendNode(NODE_NAME, socket.gethostname())]

    def runtime_dir(self, workload_id: str) -> Path | None:
        """The workload's ``TESSERA_RUNTIME_DIR`` (``runtime_dirs``); None where no safe one could be made."""
        return self.exec.runtime_dir(file_stem(workload_id))

    def private_network(self) -> bool:
        return bool(self.exec.private_network)

    def node_ports(self) -> bool:
        return False  # one host: a replica listens on its runtime directory's socket (or a loopback port)

    def listen_address(self, handle: Handle) -> tuple[str, int] | None:
        return None

    def spec_path(self, workload_id: str) -> Path:
        """Where ``launch`` leaves the command's spec for the supervisor (which deletes it once read)."""
        return self.run_dir / f"{file_stem(workload_id)}.spec.json"

    def pids(self, handle: Handle) -> list[int]:
        """The live processes of the workload: its process group's (none once its supervisor's PID names another)
        and its cgroup's (what left the group)."""
        ref = process_of(handle)
        if ref.pid == 0:  # found ended by its exit file: no process of its own to look for
            return []
        group = [] if procfs.is_pid_reused(ref.pid, ref.started_marker) else procfs.live_group_members(ref.pgid)
        return sorted(set(group) | set(self.exec.members(file_stem(ref.workload_id))))

    def launch(self, spec: LaunchSpec) -> Handle:
        """Starts the supervisor (which starts the command) and returns at once; a command that cannot be run is
        reported by ``poll`` with exit code 127 or 126. Raises ``OSError`` if the supervisor cannot be started
        (``NotADirectoryError`` for a missing ``workdir``), ``InvalidRequestError`` for an empty command or a
        workload that is already running, ``TesseraError`` when its tenant has no OS account."""
        if not spec.argv:
            raise InvalidRequestError("argv", "the command is empty")
        if spec.gang_parts:
            hosts = ", ".join(sorted({part.node for part in spec.gang_parts}))
            raise InvalidRequestError("gang_parts", f"the local backend runs on one host; ranks were placed on {hosts}")
        if spec.workdir is not None and not spec.workdir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "the workload's directory does not exist", str(spec.workdir))
        reap_released_children()
        account = self.exec.account(spec)
        exit_file, spec_file = self.exit_path(spec.workload_id), self.spec_path(spec.workload_id)
        command = self.exec.command(exit_file, spec_file, spec.argv)
        with self._lock:  # the id is reserved while the process starts, outside the lock (see the class's doc)
            if spec.workload_id in self._watches or spec.workload_id in self._starting:
                raise InvalidRequestError("workload_id", f"{spec.workload_id!r} is already running")
            self._starting.add(spec.workload_id)
        try:
            exit_file.unlink(missing_ok=True)  # left by an earlier run of the same workload: first, then the intent
            self.ref_path(spec.workload_id).unlink(missing_ok=True)  # an earlier run's, not forgotten: not this one
            intent = Intent.new(spec.workload_id, exit_file)
            write_intent(self.intent_path(spec.workload_id), intent)  # if the launch fails, find() finds nothing by it
            cgroup, note = self.exec.prepare(spec, file_stem(spec.workload_id), spec_file, account)
            try:
                with open_log(spec.log_path) as log, stop_signals_held():
                    popen = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        # its own environment (the tenant's reaches only CMD), with the nonce find() knows it by
                        env={**self.exec.supervisor_env, NONCE_ENV: intent.nonce},
                        cwd="/",
                        start_new_session=True,  # leads its own session and process group: pgid == pid
                    )
            except BaseException:
                self.exec.undo(spec_file, file_stem(spec.workload_id), cgroup)
                raise
            crash_point("after-launch")
            marker = procfs.read_start_marker(popen.pid)  # our unreaped child: its /proc entry is there
            assert marker is not None, "a child that was not waited for always has a /proc entry"
            ref = LocalProcess(spec.workload_id, popen.pid, popen.pid, marker, str(exit_file))
            with self._lock:
                self._watches[spec.workload_id] = Watch(ref=ref, popen=popen)
            try:
                write_atomically(self.ref_path(spec.workload_id), json.dumps(ref.handle().to_json()) + "\n")
            except OSError as error:  # the workload runs all the same; only find() will not know it
                logger.warning("%s: cannot record its process reference: %s", spec.workload_id, error)
        finally:
            with self._lock:
                self._starting.discard(spec.workload_id)
        one_line = " ".join(shlex.join(spec.argv).split())
        logger.info("launched %s as pid %d (%s): %s", spec.workload_id, popen.pid, note, one_line[:120])
        return dataclasses.replace(ref.handle(), note=note)

    def adopt(self, handle: Handle) -> None:
        """Tracks a workload started by an earlier server; if it has ended, the next ``poll`` reports it."""
        ref = process_of(handle)
        with self._lock:
            if ref.workload_id in self._watches:
                logger.debug("adopt: %s is already tracked", ref.workload_id)
                return
            self._watches[ref.workload_id] = Watch(ref=ref, popen=None)
        logger.info("adopted %s (pid %d)", ref.workload_id, ref.pid)

    def find(self, workload_id: str) -> Handle | None:
        """The handle of ``workload_id``, launched by this or an earlier server, not forgotten yet: the one
        ``launch`` recorded, or, if the launching server died before it could, the live supervisor of its launch
        intent or (it ran and ended) a handle without a process. None if it was never launched, if its launch never
        started the supervisor, or if it was forgotten since (``forget``). Hand it to ``adopt``."""
        with self._lock:
            watch = self._watches.get(workload_id)
        if watch is not None:
            return watch.ref.handle()
        path = self.ref_path(workload_id)
        try:
            handle = handle_of_file(json.loads(path.read_text()))
            process_of(handle)
            if handle.workload_id == workload_id:
                return handle
        except FileNotFoundError:
            pass
        except (ValueError, InvalidRequestError) as error:
            logger.warning("%s does not hold a process handle: %s", path, error)
        return self._find_by_intent(workload_id)

    def _find_by_intent(self, workload_id: str) -> Handle | None:
        found = find_launched(self.intent_path(workload_id), workload_id, SUPERVISOR_MODULE)
        return None if found is None else LocalProcess(workload_id, *found).handle()

    def stop(self, workload_id: str, grace_s: float) -> None:
        """SIGTERM now, SIGKILL at the first ``poll`` after ``grace_s``; a no-op for a workload not tracked (it
        may have ended meanwhile). A second call may bring the deadline forward but sends no second SIGTERM, unless
        the first could not be sent (it raised)."""
        with self._lock:
            watch = self._watches.get(workload_id)
            if watch is None or watch.ended:
                logger.debug("stop: %s is not running", workload_id)
                return
            deadline_s = time.monotonic() + max(grace_s, 0.0)
            if watch.kill_at_s is None or deadline_s < watch.kill_at_s:
                watch.kill_at_s = deadline_s
            if grace_s <= 0:
                self._kill_group(watch)
            elif not watch.term_sent:
                self._terminate(watch)
                watch.term_sent = True  # only once it went out: a stop that raised sends it again when called again

    def poll(self) -> list[ExitStatus]:
        """Workloads that ended since the last call, each once; SIGKILLs those whose stop grace has run out. An end
        that cannot be collected yet (an error) is left for the next call; the others are reported all the same."""
        reap_released_children()
        now_s = time.monotonic()
        ended: list[ExitStatus] = []
        with self._lock:
            gone = [watch for watch in self._watches.values() if self._advance(watch, now_s)]
            left = self._groups_left(gone)
            for watch in gone:
                try:
                    status = self._report(watch, left.get(watch.ref.pgid, []), now_s)
                except OSError as error:  # e.g. no file descriptor left: the next poll reports it
                    logger.warning("%s: its end could not be collected yet: %s", watch.ref.workload_id, error)
                    continue
                except Exception:  # nor does anything else lose the ends this poll already took out of _watches
                    logger.exception("%s: its end could not be collected; tried again", watch.ref.workload_id)
                    continue
                if status is not None:  # its files stay for find() until the server stored the end (forget)
                    del self._watches[status.workload_id]
                    ended.append(status)
        for status in ended:
            logger.info("%s ended with exit code %s", status.workload_id, status.exit_code)
        return ended

    def forget(self, workload_id: str) -> None:
        """Remove the reference file and launch intent of an ended workload (its end is stored); not while it runs."""
        with self._lock:
            if workload_id in self._watches or workload_id in self._starting:
                return
            self.ref_path(workload_id).unlink(missing_ok=True)
            self.intent_path(workload_id).unlink(missing_ok=True)

    def tracked(self) -> set[str]:
        with self._lock:
            return set(self._watches)

    def close(self) -> None:
        """Stops watching; the processes keep running (a later backend can ``adopt`` them). Pending kills are
        dropped. Our children are still reaped when they end, by any ``LocalBackend`` of this process."""
        with self._lock:
            children = [watch.popen for watch in self._watches.values() if watch.popen is not None]
            self._watches.clear()
        self.exec.close()
        release_children(children)

    # ------------------------------------------------------------------------------------------------ internals

    def _advance(self, watch: Watch, now_s: float) -> bool:
        """One poll step of one workload; True once its supervisor has ended (then ``_report`` says whether
        anything of its group is left)."""
        if not watch.ended:
            if watch.kill_at_s is not None and now_s >= watch.kill_at_s and not watch.kill_sent:
                logger.info("%s: stop grace over, sending SIGKILL", watch.ref.workload_id)
                self._kill_group(watch)
            if self._supervisor_running(watch):
                return False
            watch.ended = True
            watch.exit_code = self._exit_code(watch)
            watch.report_by_s = now_s + DRAIN_TIMEOUT_S
            self._signal_group(watch, signal.SIGKILL)  # whatever outlived the supervisor
        return True

    def _groups_left(self, watches: list[Watch]) -> dict[int, list[int]]:
        """The live processes left in the groups of ``watches`` (ended supervisors), by group: groups no longer ours
        count as empty, and one ``/proc`` scan serves all those that ``killpg(0)`` still finds (a zombie counts
        there, so only the scan can tell)."""
        groups = {w.ref.pgid for w in watches if self._group_is_ours(w) and group_exists(w.ref.pgid)}
        return procfs.live_members_of_groups(groups)

    def _report(self, watch: Watch, left: list[int], now_s: float) -> ExitStatus | None:
        """The ended workload's ``ExitStatus`` once nothing of its group is ``left`` (or its drain time is up)."""
        stem = file_stem(watch.ref.workload_id)
        left = left + self.exec.kill(stem)  # also what left the group or outlived a SIGKILLed supervisor
        if left and now_s < watch.report_by_s:
            return None
        if left:
            logger.warning("%s: processes %s still there after SIGKILL", watch.ref.workload_id, sorted(set(left)))
        self.exec.remove(stem)
        return ExitStatus(watch.ref.workload_id, watch.exit_code)

    def _supervisor_running(self, watch: Watch) -> bool:
        if watch.popen is not None:
            return watch.popen.poll() is None
        return watch.ref.pid != 0 and procfs.is_running(watch.ref.pid, watch.ref.started_marker)

    def _exit_code(self, watch: Watch) -> int | None:
        written = read_exit_file(Path(watch.ref.exit_file))
        if written is not None:
            return written
        if watch.kill_sent:
            return -signal.SIGKILL
        if watch.popen is not None and watch.popen.returncode is not None and watch.popen.returncode < 0:
            return watch.popen.returncode  # the supervisor was killed by a signal before it could write
        logger.warning("%s: the process is gone and left no exit code", watch.ref.workload_id)
        return None

    def _terminate(self, watch: Watch) -> None:
        """SIGTERM: through the supervisor (it relays to the group once), or to the group if it is gone."""
        if self._supervisor_running(watch):
            try:
                os.kill(watch.ref.pid, signal.SIGTERM)
                return
            except ProcessLookupError:
                pass  # it ended just now: signal what may be left of the group
        self._signal_group(watch, signal.SIGTERM)
        spare = watch.ref.pgid if self._group_is_ours(watch) else None
        self.exec.signal(file_stem(watch.ref.workload_id), signal.SIGTERM, spare_group=spare)

    def _kill_group(self, watch: Watch) -> None:
        """SIGKILL to the group and the cgroup; ``kill_sent`` if some process received it."""
        if self._signal_group(watch, signal.SIGKILL) | bool(self.exec.kill(file_stem(watch.ref.workload_id))):
            watch.kill_sent = True

    def _group_is_ours(self, watch: Watch) -> bool:
        """False once the supervisor's PID names another process: then a process group with that id is not ours.
        (While any process of our group lives, Linux keeps the PID from being reused.) Never for pid 0."""
        return watch.ref.pid != 0 and not procfs.is_pid_reused(watch.ref.pid, watch.ref.started_marker)

    def _signal_group(self, watch: Watch, signum: int) -> bool:
        """Signals the workload's process group if it is still ours; True if some process received the signal."""
        if not self._group_is_ours(watch):
            logger.info("%s: pid %d is not its process; not signalling it", watch.ref.workload_id, watch.ref.pid)
            return False
        try:
            os.killpg(watch.ref.pgid, signum)
        except ProcessLookupError:
            return False  # nothing left
        except PermissionError:
            logger.warning("%s: not allowed to signal process group %d", watch.ref.workload_id, watch.ref.pgid)
            return False
        return True


if TYPE_CHECKING:  # mypy checks that the class satisfies the seam

    def _as_backend(backend: LocalBackend) -> Backend:
        return backend
