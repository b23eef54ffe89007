"""Skipping the ``ray`` tests, loudly: a developer without ``unshare --net`` (not root) or without the ``ray`` extra
gets skips that say why, but where ``CI`` is set to true (CI runs as root, where they can run) a skip would hide
that they did not run, so it fails instead. Standard library and pytest only (no Ray import)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

CI_VALUES = ("true", "1")


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment says CI (``CI=true``, as CI services set it, or ``CI=1``)."""
    return (os.environ if environ is None else environ).get("CI", "").strip().lower() in CI_VALUES


def skip_ray_tests(reason: str, *, module: bool = False, environ: Mapping[str, str] | None = None) -> NoReturn:
    """``pytest.skip(reason)``; under CI ``pytest.fail`` (a test error, or a collection error when ``module``)."""
    if in_ci(environ):
        pytest.fail(f"{reason}; CI is set, so the ray tests must run here, not skip", pytrace=False)
    pytest.skip(reason, allow_module_level=module)
