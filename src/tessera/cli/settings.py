"""Where the CLI finds the server and its token: flags, then ``TESSERA_URL`` / ``TESSERA_TOKEN``, then the config
file (``$TESSERA_CONFIG``, default ``~/.config/tessera/config.yaml`` with keys ``url`` and ``token``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import InputFileError
from tessera.textfiles import read_text_file

DEFAULT_PORT = 8470  # tessera up's default port
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


@dataclass(frozen=True, slots=True)
class ClientSettings:
    url: str
    token: str | None


def config_path(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("TESSERA_CONFIG")
    if explicit:
        return Path(explicit)
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "tessera" / "config.yaml"


def resolve_settings(url: str | None, token: str | None, environ: Mapping[str, str] | None = None) -> ClientSettings:
    env = os.environ if environ is None else environ
    path = config_path(env)
    stored = _read_config(path) if path.exists() else {}
    return ClientSettings(
        url=url or env.get("TESSERA_URL") or stored.get("url") or DEFAULT_URL,
        token=token or env.get("TESSERA_TOKEN") or stored.get("token"),
    )


def _read_config(path: Path) -> dict[str, str]:
    import yaml  # only when there is a config file to read: every command starts faster without it

    try:
        loaded = yaml.safe_load(read_text_file(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputFileError(str(path), None if mark is None else mark.line + 1, None, "not valid YAML") from None
    except OSError as exc:
        raise InputFileError(str(path), None, None, exc.strerror or "cannot be read") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise InputFileError(str(path), 1, None, "expected a mapping with keys url and token")
    out: dict[str, str] = {}
    for key in ("url", "token"):
        value = loaded.get(key)
        if value is not None and not isinstance(value, str):
            raise InputFileError(str(path), None, key, "must be a string")
        if value:
            out[key] = value
    return out
