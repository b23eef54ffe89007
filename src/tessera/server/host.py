"""``tessera up`` on its host: who workloads run as (``--run-as``) and the server's files kept private.

- **Run-as modes.** ``tenant-users`` (the default for a root server): each tenant's workloads run as its own
  unprivileged OS user (``backends.accounts.TenantAccounts``: mapped by ``--tenant-user TENANT=USER``, else
  ``tessera-<tenant>``, created on first use), so a workload cannot read the store, the logs, the reference files or
  the server's environment and command line, nor another tenant's processes. ``server``: workloads run as the
  server's user (the only mode for a server that is not root); then tenants are kept apart by the API alone, and
  on the host a workload can read whatever the server can. Every mode gives workloads a clean environment.
- **Private files.** The data directory is 0700 (0711 when the tenants' homes are inside it: others may pass
  through to their home but list nothing), the run and log directories 0700, the SQLite files and logs 0600, and the
  server runs with umask 077 so that whatever it creates later is private too.
- **Open files.** ``raise_open_files_limit`` lifts the soft limit of open files (towards 65,536, within the hard
  limit) at start.
"""

from __future__ import annotations

import logging
import os
import resource
import stat
from collections.abc import Mapping
from pathlib import Path

from tessera.backends.accounts import TenantAccounts, server_account
from tessera.errors import InvalidRequestError

log = logging.getLogger(__name__)

RUN_AS_MODES = ("auto", "tenant-users", "server")
SERVER_UMASK = 0o077


def run_as_mode(asked: str) -> str:
    """``auto`` resolved: tenant users for a root server, else the server's user."""
    if asked not in RUN_AS_MODES:
        raise InvalidRequestError("--run-as", f"must be one of {', '.join(RUN_AS_MODES)}, got {asked!r}")
    if asked == "auto":
        return "tenant-users" if os.geteuid() == 0 else "server"
    return asked


def tenant_accounts(mode: str, homes_dir: Path, mapping: Mapping[str, str]) -> TenantAccounts | None:
    """The tenants' accounts for ``tenant-users`` (checked: ``InvalidRequestError`` naming the option when they
    cannot work), None for ``server``."""
    if mode != "tenant-users":
        if mapping:
            raise InvalidRequestError("--tenant-user", "needs --run-as tenant-users")
        return None
    accounts = TenantAccounts(homes_dir, mapping)
    accounts.check()
    return accounts


def isolation_notice(mode: str, homes_dir: Path) -> tuple[int, str]:
    """The start-up log line (level, text) that says what a tenant's workload can reach on this host."""
    if mode == "tenant-users":
        return logging.INFO, (
            f"workloads run as their tenant's own OS user (tessera-<tenant> or --tenant-user; homes in {homes_dir}) "
            "with a clean environment: they cannot read the store, the logs or the server's environment"
        )
    user = server_account().name
    if os.geteuid() == 0:
        return logging.WARNING, (
            "--run-as server: workloads run as root, the server's user: on this host a workload can read the store, "
            "every log and the admin token; tenants are kept apart by the API and a clean environment only"
        )
    return logging.WARNING, (
        f"not running as root: workloads run as {user}, the server's user, so on this host a workload can read what "
        "the server can (the store, every log, the server's environment); tenants are kept apart by the API and "
        "workloads get a clean environment, nothing more (run tessera up as root for per-tenant OS users)"
    )


def make_private(data_dir: Path, homes_inside: bool) -> None:
    """Sets the umask and the modes of what already exists (a data directory made by an older server)."""
    os.umask(SERVER_UMASK)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o711 if homes_inside else 0o700)
    for name in ("runs", "logs"):
        directory = data_dir / name
        if directory.is_dir():
            directory.chmod(0o700)
            for entry in os.scandir(directory):
                if entry.is_file(follow_symlinks=False):
                    os.chmod(entry.path, 0o600)
    for entry in os.scandir(data_dir):
        if entry.name.startswith("tessera.db") and entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, stat.S_IRUSR | stat.S_IWUSR)


OPEN_FILES_WANTED = 65_536


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise this process's soft limit of open files towards ``wanted`` (never past the hard limit); the limit now.
    The server holds a descriptor per client connection, per kept-alive replica connection and, while it measures
    a model's weights, per weight file: the common soft default of 1,024 is too few for that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft
