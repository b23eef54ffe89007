"""What the local backend starts for a workload and how it keeps the workload contained (``LocalExec``).

- **The supervisor** runs with an environment of its own (``python -s -P``, ``PATH``, ``LANG`` and the
  ``PYTHONPATH`` of this Tessera), never the tenant's, in ``/``: no ``PYTHONPATH``, ``PYTHONHOME`` or ``LD_PRELOAD``
  of a tenant's, nor a module in the workload's directory, reaches it.
- **The command** gets a clean environment (``accounts.workload_env``: a minimal base and the spec's ``env``, nothing
  of the server's), umask 022, and with ``accounts`` (a root server) its tenant's OS user, in that user's home unless
  the spec names a directory. All of it goes in ``<id>.spec.json`` (0600; the supervisor deletes it once read).
- **A private runtime directory** per workload (``runtime_dirs``: ``TESSERA_RUNTIME_DIR``, 0700, its own user's),
  and for a workload that asks (a model replica) a network namespace of its own (``netns``) where the server is
  root: what it listens on there, only the server reaches.
- **The log** is opened by the server (0600, in a 0700 directory) and handed to the supervisor as stdout; the
  command writes to a pipe that the supervisor copies to the log under its cap (``log_pipe.py``): a tenant's user
  can read no log at all, nor write its own past the cap. A gang's ranks (``LaunchSpec.gang``) run under the same
  supervisor, each rank but 0 logging to ``rank_log_path`` (created here alike; ``gang_ranks.py``).
- **Containment**: a cgroup per workload where one is usable (``cgroups.py``), which the supervisor joins before it
  starts the command, and which the backend kills and removes when the workload ends, also when the supervisor was
  SIGKILLed. The supervisor is a child subreaper too (``reaper.py``), the fallback without cgroups.
- **Limits** (``cgroup_limits.py``): the workload's processes, memory and CPU, set on its cgroups before the
  supervisor joins them; what this host cannot enforce is said in the server's log and in the handle's note (the
  workload's ``started`` event).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import tessera
from tessera.backends import cgroup_limits, cgroups, netns
from tessera.backends.accounts import DEFAULT_PATH, LANG, Account, TenantAccounts, server_account, workload_env
from tessera.backends.base import LaunchSpec, rank_log_path
from tessera.backends.runtime_dirs import RUNTIME_DIR_ENV, RuntimeDirError, RuntimeDirs, runtime_base
from tessera.backends.supervisor import RELAYED_SIGNALS, CommandSpec

logger = logging.getLogger(__name__)

SUPERVISOR_MODULE = "tessera.backends.supervisor"
# -s: no user site-packages; -P: the working directory is not on sys.path. (Not -E: PYTHONPATH names this Tessera.)
SUPERVISOR_FLAGS = ("-s", "-P")
WORKLOAD_UMASK = 0o022  # the server itself runs with 077


class LocalExec:
    def __init__(self, python: str, containment: str, run_dir: Path, accounts: TenantAccounts | None) -> None:
        self.python = python
        self.cgroups = cgroups.detect(containment, run_dir)
        self.limit_places = cgroup_limits.detect(self.cgroups, run_dir)
        self.accounts = accounts
        self.server_account = server_account()
        self.supervisor_env = {"PATH": DEFAULT_PATH, "LANG": LANG, "PYTHONPATH": package_root()}
        how = f"a {self.cgroups.kind} cgroup each" if self.cgroups else "their supervisor as subreaper (no cgroup)"
        logger.info("workloads are contained by %s", how)
        log = logger.warning if self.limit_places.missing else logger.info
        log("%s", self.limit_places.describe())
        self.runtime = _runtime_dirs(run_dir)
        self._private_network: bool | None = None  # found out at the first launch that asks

    @property
    def private_network(self) -> bool | None:
        """Whether a supervisor can give its command a network namespace of its own: found out once; None while a
        probe could not even run (a host out of processes), tried again at the next launch that asks."""
        if self._private_network is None:
            self._private_network = netns.private_network_usable(self.python, self.supervisor_env)
            if self._private_network is False:
                logger.warning("no private network namespaces here (not root, or forbidden): replicas share the "
                               "host's loopback")  # fmt: skip
        return self._private_network

    def _network_of(self, spec: LaunchSpec) -> bool:
        """Whether ``spec``'s command gets a network of its own; ``OSError`` when it asks and the host cannot say
        yet (the launch fails, the workload is retried: it never runs with less isolation than it could have)."""
        if not spec.private_network:
            return False
        usable = self.private_network
        if usable is None:
            raise OSError(errno.EAGAIN, "cannot tell whether the workload can have a network of its own; try again")
        return usable

    def command(self, exit_file: Path, spec_file: Path, argv: Sequence[str]) -> list[str]:
        """The supervisor's command line (``--exit-file PATH`` right after the module: recovery looks for it)."""
        head = [self.python, *SUPERVISOR_FLAGS, "-m", SUPERVISOR_MODULE, "--exit-file", str(exit_file)]
        return [*head, "--spec", str(spec_file), "--", *argv]

    def account(self, spec: LaunchSpec) -> Account | None:
        """The tenant's account the command runs as; None: the server's. ``TesseraError`` when it has none."""
        return self.accounts.account(spec.tenant) if self.accounts and spec.tenant is not None else None

    def prepare(self, spec: LaunchSpec, stem: str, spec_file: Path, account: Account | None) -> tuple[Path | None, str]:
        """Makes the workload's cgroups with its limits and writes the spec file for the supervisor; returns its
        containment cgroup (None without) and its limits in words."""
        private_network = self._network_of(spec)  # before anything is made: a refusal leaves nothing behind
        cgroup = self.cgroups.create(stem) if self.cgroups else None
        runs_as = account or self.server_account
        env = dict(spec.env)
        try:
            note = self._limit(spec, stem, cgroup)
            if self.runtime is not None:
                env[RUNTIME_DIR_ENV] = str(self.runtime.make(stem, runs_as.uid, runs_as.gid))
        except BaseException:
            self.undo(spec_file, stem, cgroup)
            raise
        command_spec = CommandSpec(
            env=workload_env(runs_as, env),
            cwd=str(spec.workdir or _home_or_root(account)),
            uid=None if account is None else account.uid,
            gid=None if account is None else account.gid,
            groups=None if account is None else account.groups,
            umask=WORKLOAD_UMASK,
            cgroup=None if cgroup is None else str(cgroup),
            cgroup_kind=None if self.cgroups is None else self.cgroups.kind,
            private_network=private_network,
            limit_cgroups=tuple(str(p) for p in self.limit_places.v1_dirs(stem, cgroup)) if cgroup else (),
            log=None if spec.log_path is None else str(spec.log_path.absolute()),
            log_max_bytes=spec.log_max_bytes,
            gang=spec.gang,
        )
        try:
            make_rank_logs(spec)
            write_private(spec_file, json.dumps(command_spec.to_json()))
        except BaseException:
            self.undo(spec_file, stem, cgroup)
            raise
        return cgroup, note

    def _limit(self, spec: LaunchSpec, stem: str, cgroup: Path | None) -> str:
        """Sets the workload's limits on its cgroups; what it is held to, in words (and what it is not)."""
        limits = cgroup_limits.Limits(spec.pids_max, spec.mem_max_mib, spec.cpu_milli)
        failed = set()
        if cgroup is not None and self.cgroups is not None:
            failed = set(cgroup_limits.apply(self.limit_places, self.cgroups, cgroup, stem, limits))
        words = limits.describe()
        held = [words[c] for c in cgroup_limits.CONTROLLERS if c not in self.limit_places.missing and c not in failed]
        loose = [c for c in cgroup_limits.CONTROLLERS if c in self.limit_places.missing or c in failed]
        text = "limits: " + (", ".join(held) or "none")
        return text + (f"; NOT enforced here: {', '.join(loose)} limits" if loose else "")

    def undo(self, spec_file: Path, stem: str, cgroup: Path | None) -> None:
        """What ``prepare`` made, removed (the supervisor did not start)."""
        spec_file.unlink(missing_ok=True)
        if cgroup is not None and self.cgroups is not None:
            cgroup_limits.remove(self.limit_places, stem, cgroup)
            self.cgroups.remove(cgroup)
        if self.runtime is not None:
            self.runtime.remove(stem)

    def cgroup(self, stem: str) -> Path | None:
        """The workload's cgroup (None without cgroups; it may not exist)."""
        return self.cgroups.path(stem) if self.cgroups else None

    def members(self, stem: str) -> list[int]:
        cgroup = self.cgroup(stem)
        return [] if cgroup is None else cgroups.members(cgroup)

    def kill(self, stem: str) -> list[int]:
        """One round of SIGKILL to the workload's cgroup (without waiting); the processes still in it."""
        cgroup = self.cgroup(stem)
        if cgroup is None or self.cgroups is None:
            return []
        try:
            return cgroups.kill(self.cgroups.kind, cgroup, timeout_s=0)
        except OSError as error:
            logger.warning("cannot kill cgroup %s: %s", cgroup, error)
            return cgroups.members(cgroup)

    def signal(self, stem: str, signum: int, spare_group: int | None = None) -> None:
        """Signals the workload's cgroup members outside process group ``spare_group`` (signalled on its own)."""
        cgroup = self.cgroup(stem)
        if cgroup is not None:
            cgroups.signal_members(cgroup, signum, spare_group=spare_group)

    def runtime_dir(self, stem: str) -> Path | None:
        return None if self.runtime is None else self.runtime.path(stem)

    def remove(self, stem: str) -> None:
        """Removes the ended workload's runtime directory and its empty cgroups."""
        if self.runtime is not None:
            self.runtime.remove(stem)
        cgroup = self.cgroup(stem)
        if cgroup is None or self.cgroups is None:
            return
        cgroup_limits.remove(self.limit_places, stem, cgroup)
        if not self.cgroups.remove(cgroup):
            logger.warning("cannot remove cgroup %s yet: processes are still in it", cgroup)

    def close(self) -> None:
        """Removes this server's cgroup tree and runtime base where no workload is left in them."""
        if self.cgroups is not None:
            cgroup_limits.close(self.limit_places)
            self.cgroups.close()
        if self.runtime is not None:
            self.runtime.close()


def _runtime_dirs(run_dir: Path) -> RuntimeDirs | None:
    try:
        return RuntimeDirs(runtime_base(run_dir))
    except RuntimeDirError as exc:
        logger.warning("%s: workloads get no TESSERA_RUNTIME_DIR, replicas listen on TCP ports", exc)
        return None


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """Blocks SIGTERM and SIGINT in the calling thread meanwhile: a supervisor started then inherits the mask and
    unblocks them once its relay is installed, so a stop sent while it starts is never lost (nor kills it early)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _home_or_root(account: Account | None) -> Path:
    """Where a command without a ``workdir`` starts: its account's home (``/`` if that does not exist, as for
    ``nobody``), or the server's directory when it runs as the server's user."""
    if account is None:
        return Path.cwd()
    return account.home if account.home.is_dir() else Path("/")


def open_log(log_path: Path | None) -> IO[bytes]:
    """The workload's log, opened here (0600, the server's): the workload writes it through its stdout only."""
    if log_path is None:
        return open(os.devnull, "wb")
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def make_rank_logs(spec: LaunchSpec) -> None:
    """Creates the logs of a gang's ranks but rank 0's (``open_log``'s owner and mode), so that they can be read
    from the launch on; the supervisor appends to them."""
    if spec.gang is None or spec.log_path is None:
        return
    for rank in spec.gang.ranks:
        if rank != 0:
            open_log(rank_log_path(spec.log_path, rank)).close()


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to a new file only the server's user can read (it may hold the tenant's secrets)."""
    path.unlink(missing_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(text)


def package_root() -> str:
    """The directory this Tessera is imported from: the supervisor's only ``PYTHONPATH`` entry."""
    return str(Path(tessera.__file__).resolve().parent.parent)
