"""How the supervisor runs a workload's command (``CommandSpec``), as the local backend and the Ray workload actor
write it to the spec file (JSON, 0600) and the supervisor reads it back once (``read_spec``, which deletes it).

Imports only the standard library and ``base`` (which does too): the supervisor reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from tessera.backends.base import GangRanks


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """How CMD runs, as the local backend writes it to the spec file (JSON, 0600, read once and deleted). Without
    one, CMD inherits the supervisor's environment, directory and user."""

    env: dict[str, str] | None = None  # CMD's whole environment
    cwd: str | None = None
    uid: int | None = None  # run CMD as this user (the supervisor must be root)
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    umask: int | None = None
    cgroup: str | None = None  # the workload's cgroup directory, which the supervisor joins
    cgroup_kind: str | None = None  # cgroups.KINDS
    limit_cgroups: tuple[str, ...] = ()  # its cgroups in v1 hierarchies of its limits (cgroup_limits), joined too
    log: str | None = None  # the log (the supervisor's stdout): CMD's output is written there under the cap
    log_max_bytes: int = 0  # the log's cap (0: none)
    private_network: bool = False  # enter a network namespace of its own first (``netns``; needs root)
    gang: GangRanks | None = None  # one CMD per rank (``gang_ranks``); None: CMD once

    def to_json(self) -> dict[str, object]:
        value = {f.name: getattr(self, f.name) for f in fields(self)}
        gang = self.gang
        if gang is not None:
            value["gang"] = {f.name: getattr(gang, f.name) for f in fields(gang)}
        return value

    @classmethod
    def from_json(cls, value: object) -> CommandSpec:
        """The spec ``to_json`` wrote; ``ValueError`` or ``TypeError`` for anything else."""
        if not isinstance(value, dict) or not set(value) <= {f.name for f in fields(cls)}:
            raise ValueError("not a command spec")
        groups = value.get("groups")
        limit_cgroups = tuple(value.get("limit_cgroups", ()))
        gang = value.get("gang")
        if gang is not None:
            if not isinstance(gang, dict) or not set(gang) <= {f.name for f in fields(GangRanks)}:
                raise ValueError("not a gang of ranks")
            gang = GangRanks(**{**gang, "ranks": tuple(gang.get("ranks", ()))})
        fixed = {"groups": None if groups is None else tuple(groups), "limit_cgroups": limit_cgroups, "gang": gang}
        return cls(**{**value, **fixed})


def read_spec(path: Path) -> CommandSpec:
    """The spec file's contents; the file is deleted (it may hold the tenant's secrets)."""
    try:
        return CommandSpec.from_json(json.loads(path.read_text()))
    finally:
        path.unlink(missing_ok=True)
