"""Who listens at a TCP address (what a replica's actor checks on its node before the server hands the gateway the
replica's address): this process's own listening sockets, read back through /proc, and /proc's tables decoded."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from tessera.backends.listeners import decode_address, listening_inodes, listens_only, socket_inodes


def test_proc_net_addresses_decode_ipv4_ipv6_and_ipv4_mapped() -> None:
    assert decode_address("0100007F:1F90") == (ipaddress.ip_address("127.0.0.1"), 8080)
    assert decode_address("00000000:0050") == (ipaddress.ip_address("0.0.0.0"), 80)
    assert decode_address("00000000000000000000000001000000:01BB") == (ipaddress.ip_address("::1"), 443)
    mapped = "0000000000000000FFFF00000100007F:1F90"  # ::ffff:127.0.0.1 as /proc/net/tcp6 writes it
    assert decode_address(mapped) == (ipaddress.ip_address("127.0.0.1"), 8080)


def test_a_port_listened_on_by_these_processes_only_is_theirs_and_no_one_elses() -> None:
    with socket.socket() as listener, socket.socket() as connected_only:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        inodes = listening_inodes("127.0.0.1", port)
        assert len(inodes) == 1 and inodes <= socket_inodes(os.getpid())
        assert listens_only("127.0.0.1", port, [os.getpid()])
        assert not listens_only("127.0.0.1", port, [])  # held by a process that is not the workload's
        assert not listens_only("127.0.0.1", port, [os.getppid()])
        connected_only.bind(("127.0.0.1", 0))  # bound, not listening: nothing answers there
        assert not listens_only("127.0.0.1", connected_only.getsockname()[1], [os.getpid()])


def test_a_wildcard_listener_counts_as_listening_where_the_replica_should(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    rows = [
        "   0: 00000000:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n",
        "   1: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1\n",
        "   2: 0100007F:9C41 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 333 1\n",
        "   3: 0200007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1\n",
    ]
    (tmp_path / "net" / "tcp").write_text(header + "".join(rows))
    # 0.0.0.0:40001 and 127.0.0.1:40001 listen; an established connection and 127.0.0.2's listener do not count
    assert listening_inodes("127.0.0.1", 40001, tmp_path) == {111, 222}
    assert listening_inodes("127.0.0.1", 40002, tmp_path) == set()
