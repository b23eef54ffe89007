"""MIG (Multi-Instance GPU) profiles: which hardware slices a serving replica can ask for instead of a whole GPU.

A MIG-capable GPU splits into 7 compute slices and 8 memory slices; a profile ``Ng.Mgb`` takes N compute slices and
a fixed share of the memory, and the GPU holds at most ``max_instances`` of one profile. The tables follow NVIDIA's
MIG user guide ("Supported MIG Profiles") and what ``nvidia-smi mig -lgip`` reports on each GPU; ``memory_gib`` is
the usable memory nvidia-smi lists (a little under the nominal size in the name; it varies by a few hundred MiB with
the driver). Media-extension variants (``+me``) are left out: they hold the same compute and memory.

Replica placement asks ``smallest_profile`` for the smallest slice that holds a replica's weights and KV reserve,
and ``compute_share`` turns the slice into the fraction of the GPU's compute the performance model scales by.
Pure data and functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.catalog import resolve_model

GIB = 1024**3
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    gpu: str  # the core catalog's canonical GPU name
    name: str  # e.g. "3g.40gb"
    compute_sevenths: int  # compute slices, of 7
    memory_eighths: int  # memory slices, of 8
    memory_gib: float  # usable memory, as nvidia-smi reports it
    max_instances: int  # how many of this profile one GPU holds

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


def _table(gpu: str, rows: tuple[tuple[str, int, int, float, int], ...]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(gpu, name, c, m, gib, n) for name, c, m, gib, n in rows)


# (name, compute sevenths, memory eighths, usable GiB, max instances); smallest first.
MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _table(
        "A100-40GB",
        (
            ("1g.5gb", 1, 1, 4.75, 7),
            ("1g.10gb", 1, 2, 9.75, 4),
            ("2g.10gb", 2, 2, 9.75, 3),
            ("3g.20gb", 3, 4, 19.62, 2),
            ("4g.20gb", 4, 4, 19.62, 1),
            ("7g.40gb", 7, 8, 39.5, 1),
        ),
    ),
    "A100-80GB": _table(
        "A100-80GB",
        (
            ("1g.10gb", 1, 1, 9.5, 7),
            ("1g.20gb", 1, 2, 19.5, 4),
            ("2g.20gb", 2, 2, 19.5, 3),
            ("3g.40gb", 3, 4, 39.25, 2),
            ("4g.40gb", 4, 4, 39.25, 1),
            ("7g.80gb", 7, 8, 79.0, 1),
        ),
    ),
    "H100-80GB": _table(
        "H100-80GB",
        (
            ("1g.10gb", 1, 1, 9.75, 7),
            ("1g.20gb", 1, 2, 19.62, 4),
            ("2g.20gb", 2, 2, 19.62, 3),
            ("3g.40gb", 3, 4, 39.5, 2),
            ("4g.40gb", 4, 4, 39.5, 1),
            ("7g.80gb", 7, 8, 79.25, 1),
        ),
    ),
    "H200": _table(
        "H200",
        (
            ("1g.18gb", 1, 1, 16.0, 7),
            ("1g.35gb", 1, 2, 32.25, 4),
            ("2g.35gb", 2, 2, 32.25, 3),
            ("3g.71gb", 3, 4, 69.5, 2),
            ("4g.71gb", 4, 4, 69.5, 1),
            ("7g.141gb", 7, 8, 139.75, 1),
        ),
    ),
}


def mig_profiles(gpu: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of ``gpu`` (any name the core catalog resolves), smallest first; () if it has no MIG."""
    return MIG_PROFILES.get(resolve_model(gpu).name, ())


def mig_profile(gpu: str, name: str) -> MigProfile:
    """The profile called ``name`` (e.g. ``"3g.40gb"``, with or without a leading ``"MIG "``) on ``gpu``."""
    wanted = name.strip().lower().removeprefix("mig").strip()
    for profile in mig_profiles(gpu):
        if profile.name == wanted:
            return profile
    known = ", ".join(p.name for p in mig_profiles(gpu)) or "none: no MIG on this GPU"
    raise ValueError(f"unknown MIG profile {name!r} on {gpu} (known: {known})")


def smallest_profile(gpu: str, mem_bytes: int, compute_sevenths: int = 1) -> MigProfile | None:
    """The smallest profile of ``gpu`` with at least ``mem_bytes`` of usable memory and ``compute_sevenths`` compute
    slices, or None when none does (or the GPU has no MIG).

    "Smallest" is the fewest memory slices, then the fewest compute slices: memory is what a replica's weights and
    KV reserve need, and a profile with spare compute (``2g.20gb`` rather than ``1g.20gb``) would leave a slice
    idle that another replica could take."""
    if mem_bytes < 0:
        raise ValueError(f"mem_bytes must be >= 0, got {mem_bytes}")
    if not 1 <= compute_sevenths <= COMPUTE_SLICES:
        raise ValueError(f"compute_sevenths must be in 1..{COMPUTE_SLICES}, got {compute_sevenths}")
    fitting = [p for p in mig_profiles(gpu) if p.memory_bytes >= mem_bytes and p.compute_sevenths >= compute_sevenths]
    return min(fitting, key=lambda p: (p.memory_eighths, p.compute_sevenths), default=None)


def compute_share(profile: MigProfile) -> float:
    """The fraction of the whole GPU's compute the profile holds (its compute slices over 7)."""
    return profile.compute_sevenths / COMPUTE_SLICES
