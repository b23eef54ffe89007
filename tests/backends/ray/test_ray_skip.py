"""The ``ray`` tests skip where they cannot run (no ``unshare --net``, no ``ray`` extra), but fail instead under
``CI=true``, so CI cannot pass without them. Not marked ``ray``: runs with the main suite, without Ray."""

from __future__ import annotations

import pytest
from ray_skip import in_ci, skip_ray_tests


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"CI": ""}, False),
        ({"CI": "false"}, False),
        ({"CI": "true"}, True),
        ({"CI": "TRUE"}, True),
        ({"CI": "1"}, True),
    ],
)
def test_ci_is_read_from_the_environment(environ: dict[str, str], expected: bool) -> None:
    assert in_ci(environ) is expected


def test_a_skip_stays_a_skip_outside_ci() -> None:
    with pytest.raises(pytest.skip.Exception, match="no unshare"):
        skip_ray_tests("no unshare", environ={})


def test_under_ci_a_skip_of_the_ray_tests_fails_instead() -> None:
    with pytest.raises(pytest.fail.Exception, match="no unshare; CI is set, so the ray tests must run here"):
        skip_ray_tests("no unshare", environ={"CI": "true"})
    with pytest.raises(pytest.fail.Exception):
        skip_ray_tests("no ray extra", module=True, environ={"CI": "true"})
