"""The server's side of a Ray workload's log (``ActorWatch.append_log``), without a cluster: what the actor sends is
written under the cap by one writer per workload, opened at the first bytes (0600, its directory made) and closed at
the end. The old code opened the log for each answer and wrote out the start of a character split between two
answers, so a rotation could cut it in two files (and each answer cost a dozen system calls more)."""

from __future__ import annotations

from pathlib import Path

from ray_skip import skip_ray_tests

from tessera.backends.base import rank_log_path
from tessera.backends.capped_log import logical_size, rotated_path

try:
    from tessera.backends.ray.watch import ActorWatch
except ImportError:
    skip_ray_tests("the ray extra is not installed (pip install 'tessera[ray]')", module=True)


def _watch(path: Path, max_bytes: int, ranks: tuple[int, ...] = ()) -> ActorWatch:
    destinations = {0: path, **{rank: rank_log_path(path, rank) for rank in ranks}}
    offsets = dict.fromkeys(destinations, 0)
    return ActorWatch(
        "7", actor=None, name="tessera-7", log_max_bytes=max_bytes, destinations=destinations, offsets=offsets
    )


def test_a_character_split_between_two_answers_stays_whole_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "7.log"
    watch = _watch(path, max_bytes=8)
    euro = "€".encode()  # 3 bytes
    watch.append_log(b"abcdef" + euro[:1])  # an answer ends inside a character ...
    watch.append_log(euro[1:] + b"gh")  # ... the next brings its end, past the cap: a rotation
    watch.close_log()
    assert rotated_path(path).read_bytes() == b"abcdef" and path.read_bytes() == euro + b"gh"
    assert watch.offsets[0] == logical_size(path) == 11 and watch.logs == {}


def test_the_log_is_made_private_and_capped(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "7.log"
    watch = _watch(path, max_bytes=100)
    for _ in range(5):
        watch.append_log(b"y" * 40)
    assert list(watch.logs) == [0]  # one writer for the whole run
    watch.close_log()
    assert path.stat().st_size <= 100 and logical_size(path) == 200
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_a_gangs_rank_logs_are_written_apart_each_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "7.log"
    watch = _watch(path, max_bytes=100, ranks=(1, 3))
    watch.append_log(b"main\n")
    watch.append_log(b"rank one\n", 1)
    watch.append_log(b"rank three\n", 3)
    watch.close_log()
    assert path.read_bytes() == b"main\n" and rank_log_path(path, 1).read_bytes() == b"rank one\n"
    assert rank_log_path(path, 3).read_bytes() == b"rank three\n"
    assert watch.offsets == {0: 5, 1: 9, 3: 11} and watch.logs == {}
    assert oct(rank_log_path(path, 3).stat().st_mode & 0o777) == "0o600"
