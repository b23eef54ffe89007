"""``tessera submit``'s Slurm-style flags turned into the API body's job options, checked before any call so that a
mistake is one line naming the flag (exit 2): ``--chdir`` (default: the directory the command runs in), ``--env``,
``--export`` (``PATH`` is sent by default), ``--time``, ``--array``, ``--dependency``, ``--hold``, ``--elastic``.
The parsers are the server's own (``tessera.api.job_options``, imported when a submission is made: other commands do
not pay for pydantic).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tessera.core.errors import InvalidRequestError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def job_options(
    *,
    chdir: str | None,
    env: list[str] | None,
    export: str | None,
    time_limit: str | None,
    array: str | None,
    dependency: str | None,
    hold: bool,
    environ: Mapping[str, str] = os.environ,
    here: Callable[[], str] = os.getcwd,
) -> dict[str, Any]:
    """The body's ``cwd``, ``env``, ``time_limit``, ``array``, ``dependency`` and ``hold`` given on the command line
    (absent when not given; ``cwd`` only when ``--chdir`` is). Raises ``InvalidRequestError`` naming the flag."""
    from tessera.api.job_options import parse_array, parse_dependency, parse_duration

    body: dict[str, Any] = {}
    if chdir is not None:
        body["cwd"] = absolute(chdir, here)
    variables = exported(export, environ) if export else {}
    variables.update(assignments(env or []))
    if variables:
        body["env"] = variables
    for flag, key, value, parse in (
        ("--time", "time_limit", time_limit, parse_duration),
        ("--array", "array", array, parse_array),
        ("--dependency", "dependency", dependency, parse_dependency),
    ):
        if value is None:
            continue
        try:
            parse(value)
        except ValueError as exc:
            raise InvalidRequestError(flag, str(exc)) from None
        body[key] = value
    if hold:
        body["hold"] = True
    return body


def elastic_range(text: str) -> tuple[int, int]:
    """``--elastic MIN-MAX`` (``1-4``) as (min, max); raises ``InvalidRequestError`` naming the flag."""
    low, dash, high = text.strip().partition("-")
    if not dash or not low.strip().isdecimal() or not high.strip().isdecimal():
        raise InvalidRequestError("--elastic", f"{text!r} is not MIN-MAX workers, e.g. 1-4")
    first, last = int(low), int(high)
    if first < 1:
        raise InvalidRequestError("--elastic", f"the minimum must be at least 1 worker, got {first}")
    if first > last:
        raise InvalidRequestError("--elastic", f"the minimum {first} is above the maximum {last}")
    return first, last


def with_defaults(
    body: dict[str, Any], environ: Mapping[str, str] = os.environ, here: Callable[[], str] = os.getcwd
) -> dict[str, Any]:
    """What a submission from the command line gets unless it says otherwise (flags or ``-f`` file): the directory
    it is made from, and the submitter's ``PATH``, so that ``python`` is the one of the virtualenv the user is in
    (the workload's clean environment has only the system's directories)."""
    body.setdefault("cwd", here())
    env = body.setdefault("env", {})
    if isinstance(env, dict) and "PATH" in environ:
        env.setdefault("PATH", environ["PATH"])
    return body


def absolute(directory: str, here: Callable[[], str] = os.getcwd) -> str:
    """``directory`` as an absolute path (a relative one is taken from ``here()``, the submitter's directory); its
    existence is the launch's business: the server may run it on another host."""
    if not directory.strip():
        raise InvalidRequestError("--chdir", "empty directory")
    path = Path(directory).expanduser()
    return os.path.normpath(path if path.is_absolute() else Path(here()) / path)


def assignments(pairs: list[str]) -> dict[str, str]:
    """``--env K=V`` (repeatable) as a mapping; the value may be empty or hold '='."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not _NAME.match(name):
            raise InvalidRequestError("--env", f"{pair!r}: expected NAME=value, NAME made of letters, digits and _")
        out[name] = value
    return out


def exported(names: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``--export VAR,VAR``: those variables copied from this environment; one that is not set is an error."""
    out: dict[str, str] = {}
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if not _NAME.match(name):
            raise InvalidRequestError("--export", f"{name!r} is not a variable name")
        if name not in environ:
            raise InvalidRequestError("--export", f"{name} is not set in this environment")
        out[name] = environ[name]
    return out
