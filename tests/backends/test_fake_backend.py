"""The in-memory FakeBackend that server-loop unit tests use: launch, finish, stop, adopt, each end reported once."""

from __future__ import annotations

import pytest

from tessera.backends.base import ExitStatus, Handle, LaunchSpec
from tessera.backends.fake import FakeBackend, fake_pid
from tessera.core.errors import InvalidRequestError


def test_launch_finish_and_stop_are_reported_once_each() -> None:
    backend = FakeBackend()
    ref_a = backend.launch(LaunchSpec("a", ("train",), env={"CUDA_VISIBLE_DEVICES": "GPU-0"}))
    ref_b = backend.launch(LaunchSpec("b", ("serve",)))
    assert ref_a.workload_id == "a" and ref_a.backend == "fake" and fake_pid(ref_a) != fake_pid(ref_b)
    assert backend.pids(ref_a) == [fake_pid(ref_a)]
    assert [spec.workload_id for spec in backend.launched] == ["a", "b"]
    assert backend.tracked() == {"a", "b"}
    assert backend.poll() == []
    with pytest.raises(InvalidRequestError):
        backend.launch(LaunchSpec("a", ("again",)))

    assert backend.find("a") == ref_a and backend.find("zzz") is None
    backend.finish("a", 3)
    backend.stop("b", grace_s=10)
    assert backend.stops == [("b", 10)]
    assert backend.poll() == [ExitStatus("a", 3), ExitStatus("b", -15)]
    assert backend.poll() == []
    assert backend.pids(ref_a) == []
    assert backend.find("a") == ref_a  # reported, but found until the server stored the end and forgot it
    backend.forget("a")
    backend.forget("never-launched")
    assert backend.find("a") is None
    assert backend.tracked() == set()
    backend.stop("b", grace_s=1)  # ended already: recorded, nothing reported
    assert backend.poll() == []
    with pytest.raises(KeyError):
        backend.finish("a", 0)


def test_adopted_workloads_are_tracked_and_close_forgets_them() -> None:
    backend = FakeBackend()
    ref = Handle("w", "fake", {"pid": 42})
    backend.adopt(ref)
    assert backend.adopted == [ref] and backend.tracked() == {"w"}
    backend.finish("w", None)
    assert backend.poll() == [ExitStatus("w", None)]
    backend.adopt(ref)
    backend.close()
    assert backend.closed and backend.tracked() == set() and backend.poll() == []


def test_find_serves_a_restarted_server_that_never_stored_the_ref() -> None:
    backend = FakeBackend()
    ref = backend.launch(LaunchSpec("w", ("train",)))
    backend.close()  # the server died before it stored ref
    assert backend.find("w") == ref
    backend.adopt(ref)
    backend.finish("w", 0)
    assert backend.poll() == [ExitStatus("w", 0)]


def test_a_workload_that_ends_while_no_server_watches_is_reported_after_its_adoption() -> None:
    backend = FakeBackend()
    ref = backend.launch(LaunchSpec("a", ("train",)))
    backend.close()  # the server died
    backend.finish("a", 0)
    assert backend.poll() == [] and backend.find("a") == ref  # not reported before a server adopts it
    backend.adopt(ref)
    assert backend.poll() == [ExitStatus("a", 0)]
    assert backend.poll() == []
    backend.forget("a")
    assert backend.find("a") is None
    with pytest.raises(KeyError):
        backend.finish("never-launched", 0)


def test_handles_are_json_and_only_fake_ones_are_adopted() -> None:
    backend = FakeBackend()
    ref = backend.launch(LaunchSpec("w", ("train",)))
    assert Handle.from_json(ref.to_json()) == ref and [n.name for n in backend.nodes()] == ["local"]
    with pytest.raises(InvalidRequestError):
        backend.adopt(Handle("v", "local", {"pid": 1}))
    with pytest.raises(ValueError):
        Handle.from_json({"workload_id": "w", "backend": "fake"})
    with pytest.raises(ValueError):
        Handle("w", "fake", {"pids": [1, 2]})  # type: ignore[dict-item]


def test_an_end_reported_to_a_server_that_died_before_storing_it_is_found_and_reported_again() -> None:
    backend = FakeBackend()
    ref = backend.launch(LaunchSpec("a", ("train",)))
    backend.forget("a")  # a running workload is not forgotten
    assert backend.find("a") == ref
    backend.finish("a", 4)
    assert backend.poll() == [ExitStatus("a", 4)]
    backend.close()  # the server died before it stored the end
    assert backend.find("a") == ref
    backend.adopt(ref)
    assert backend.poll() == [ExitStatus("a", 4)]
    backend.forget("a")
    assert backend.find("a") is None
    again = backend.launch(LaunchSpec("a", ("train",)))  # a new launch of the same workload
    backend.adopt(again)
    assert backend.poll() == []
