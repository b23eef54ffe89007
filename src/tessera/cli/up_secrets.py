"""Where ``tessera up`` takes its secrets from: the admin token and the database URL (which may hold a password)
come from the environment (``TESSERA_ADMIN_TOKEN``, ``TESSERA_DB``) or a file (``--admin-token-file``), never from
the command line, which every user of the host can read (``ps``, ``/proc/PID/cmdline``). ``--admin-token`` is
refused with a one-line error naming the variable; ``--db`` is taken only without a password. Both variables are
removed from the server's environment once read, so nothing the server starts inherits them."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from tessera.errors import InvalidRequestError
from tessera.textfiles import read_text_file

ADMIN_TOKEN_ENV = "TESSERA_ADMIN_TOKEN"
DB_ENV = "TESSERA_DB"


def admin_token_of(flag: str | None, path: Path | None, environ: MutableMapping[str, str]) -> str | None:
    """The admin token given to ``tessera up``: from ``--admin-token-file``, else ``$TESSERA_ADMIN_TOKEN``; None:
    generate one."""
    from_env = environ.pop(ADMIN_TOKEN_ENV, None)
    if flag is not None:
        raise InvalidRequestError(
            "--admin-token",
            f"a token on the command line is visible to every user of the host; set {ADMIN_TOKEN_ENV} or use "
            "--admin-token-file",
        )
    if path is not None:
        try:
            token = read_text_file(path).strip()
        except OSError as error:
            raise InvalidRequestError("--admin-token-file", f"{path}: {error.strerror or error}") from None
        if not token:
            raise InvalidRequestError("--admin-token-file", f"{path} is empty")
        return token
    return from_env or None


def database_url(flag: str | None, environ: MutableMapping[str, str]) -> str | None:
    """``--db`` (without a password), else ``$TESSERA_DB``; None: SQLite in the data directory."""
    from_env = environ.pop(DB_ENV, None)
    if flag is not None:
        try:
            password = urlsplit(flag).password
        except ValueError:
            password = None  # not a URL the store can read either: it says so
        if password:
            raise InvalidRequestError(
                "--db", f"the URL holds a password, visible to every user of the host; set {DB_ENV} instead"
            )
        return flag
    return from_env or None


def tenant_users(pairs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``TENANT=USER`` options, checked."""
    out: dict[str, str] = {}
    for pair in pairs:
        tenant, sep, user = pair.partition("=")
        if not sep or not tenant or not user:
            raise InvalidRequestError("--tenant-user", f"expected TENANT=USER, got {pair!r}")
        if tenant in out:
            raise InvalidRequestError("--tenant-user", f"tenant {tenant!r} given twice")
        out[tenant] = user
    return tuple(out.items())
