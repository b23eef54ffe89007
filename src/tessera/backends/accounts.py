"""Who a workload runs as on this host, and the environment it starts with.

As Slurm does, a server that runs as root runs each tenant's workloads as that tenant's own unprivileged OS user
(``TenantAccounts``): the user the configuration maps the tenant to, or one Tessera creates on first use,
``tessera-<tenant>`` (``useradd --system --no-create-home``, no login shell, its own group, the comment
``tessera tenant <tenant>``, the home directory ``<homes>/<user>``, 0700, its own). A user of that
name that Tessera did not create for that tenant (another comment) is never used: the launch fails instead. A tenant
name that is not a safe user name (upper case, dots, too long) gets ``tessera-h<hash>`` instead.

Every workload starts from a clean environment (``workload_env``): a minimal base (``PATH``, ``HOME``, ``USER``,
``LOGNAME``, ``LANG``) of the account it runs as, then what the workload asked for (its ``env`` and Tessera's
isolation variables), and nothing of the server's own environment (its admin token, database URL or anything else).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.core.errors import InvalidRequestError, TesseraError

logger = logging.getLogger(__name__)

USER_PREFIX = "tessera-"
COMMENT_PREFIX = "tessera tenant "  # the GECOS field of the users Tessera creates
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
LANG = "C.UTF-8"
MAX_USER_NAME = 32  # useradd's limit
_SAFE_TENANT = re.compile(r"[a-z0-9_][a-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups
    home: Path


def server_account() -> Account:
    """The account the server runs as (where a workload runs when no tenant account is used)."""
    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        name, home = entry.pw_name, Path(entry.pw_dir)
    except KeyError:  # a uid without a passwd entry (containers)
        name, home = str(uid), Path("/")
    return Account(name, uid, os.getegid(), tuple(os.getgroups()), home)


def workload_env(account: Account, asked: Mapping[str, str]) -> dict[str, str]:
    """A workload's whole environment: the account's minimal base, then what the workload asked for."""
    base = {"PATH": DEFAULT_PATH, "HOME": str(account.home), "USER": account.name, "LOGNAME": account.name}
    return {**base, "LANG": LANG, **asked}


def user_name(tenant: str) -> str:
    """The OS user Tessera creates for ``tenant``: ``tessera-<tenant>`` when that is a safe user name."""
    if _SAFE_TENANT.fullmatch(tenant) and len(USER_PREFIX) + len(tenant) <= MAX_USER_NAME:
        return USER_PREFIX + tenant
    return USER_PREFIX + "h" + hashlib.sha256(tenant.encode()).hexdigest()[:20]


class TenantAccounts:
    """Maps each tenant to its OS account (root's server only); thread-safe, each account resolved once."""

    def __init__(self, homes_dir: Path, mapping: Mapping[str, str] | None = None) -> None:
        self.homes_dir = homes_dir
        self.mapping = dict(mapping or {})
        self._lock = threading.Lock()
        self._known: dict[str, Account] = {}

    def check(self) -> None:
        """Fails early (``InvalidRequestError``) when tenants' accounts cannot work: not root, mapped users that do
        not exist or are root, no ``useradd``, or a homes directory that other users cannot reach."""
        if os.geteuid() != 0:
            raise InvalidRequestError("--run-as", "tenant-users needs the server to run as root")
        for tenant, name in self.mapping.items():
            try:
                if pwd.getpwnam(name).pw_uid == 0:
                    raise InvalidRequestError("--tenant-user", f"{tenant}={name}: a tenant may not run as root")
            except KeyError:
                raise InvalidRequestError("--tenant-user", f"{tenant}={name}: no such user") from None
        if shutil.which("useradd") is None:
            logger.warning("no useradd on PATH: only tenants mapped with --tenant-user can run workloads")
        self.homes_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.homes_dir.chmod(0o711)
        for directory in (self.homes_dir, *self.homes_dir.resolve().parents):
            if not directory.stat().st_mode & 0o001:
                raise InvalidRequestError(
                    "--homes-dir", f"tenants' users cannot reach {self.homes_dir}: {directory} is not searchable"
                )

    def account(self, tenant: str) -> Account:
        """The account ``tenant``'s workloads run as, created on first use; ``TesseraError`` when there is none."""
        with self._lock:
            known = self._known.get(tenant)
            if known is None:
                known = self._resolve(tenant)
                self._known[tenant] = known
            return known

    def _resolve(self, tenant: str) -> Account:
        mapped = self.mapping.get(tenant)
        if mapped is not None:
            entry = pwd.getpwnam(mapped)
            return _account_of(entry)
        name, comment = user_name(tenant), COMMENT_PREFIX + tenant
        home = self.homes_dir / name  # a safe name (never "..")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            entry = _create_user(name, comment, home)
        if entry.pw_gecos != comment or entry.pw_uid == 0:
            raise TesseraError(f"the OS user {name} exists but was not made by Tessera for tenant {tenant!r}")
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        home.chmod(0o700)
        return _account_of(entry, home)


def _account_of(entry: pwd.struct_passwd, home: Path | None = None) -> Account:
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid) if g != entry.pw_gid)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, home or Path(entry.pw_dir))


def _create_user(name: str, comment: str, home: Path) -> pwd.struct_passwd:
    command = ["useradd", "--system", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin"]
    command += ["--user-group", "--comment", comment, name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TesseraError(f"cannot create the OS user {name}: {error}") from None
    if done.returncode != 0 and "already exists" not in done.stderr:  # made meanwhile by another server
        raise TesseraError(f"cannot create the OS user {name}: {done.stderr.strip() or done.returncode}")
    logger.info("created the OS user %s for tenant %r", name, comment.removeprefix(COMMENT_PREFIX))
    return pwd.getpwnam(name)
