"""`NodeProbe` on plain sockets: a listening raylet port is up, a closed one is gone at once, a node the GCS no
longer lists is gone, timeouts count only in a row; the background thread finds a port that closes."""

from __future__ import annotations

import socket
import time

import pytest

from exgrpo.runtime import elastic
from exgrpo.runtime.elastic import NodeProbe


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: a connection is refused
    return port


def test_a_listening_raylet_is_up_and_a_refusing_one_is_gone_at_once(listener) -> None:
    up, down = ("127.0.0.1", listener.getsockname()[1]), ("127.0.0.1", _closed_port())
    probe = NodeProbe(every_s=60, addresses=lambda: {"a": up, "b": down})
    assert probe({"a", "b"}) == set()  # nothing probed yet; a call never blocks
    probe.probe_once()
    assert probe({"a", "b"}) == {"b"}
    assert probe({"a"}) == set()  # only the nodes asked about


def test_a_node_the_gcs_no_longer_lists_alive_is_gone(listener) -> None:
    probe = NodeProbe(every_s=60, addresses=lambda: {"a": ("127.0.0.1", listener.getsockname()[1])})
    probe({"a", "vanished"})
    probe.probe_once()
    assert probe({"a", "vanished"}) == {"vanished"}


def test_timeouts_make_a_node_gone_only_in_a_row(monkeypatch, listener) -> None:
    probe = NodeProbe(every_s=60, misses=2, addresses=lambda: {"a": ("127.0.0.1", listener.getsockname()[1])})
    real = socket.create_connection
    answers = iter(["timeout", "up", "timeout", "timeout"])

    def connect(address, timeout=None):
        if next(answers) == "timeout":
            raise TimeoutError("timed out")
        return real(address, timeout=timeout)

    monkeypatch.setattr(elastic.socket, "create_connection", connect)
    probe({"a"})
    for gone in (set(), set(), set(), {"a"}):  # timeout, up (resets), timeout, timeout
        probe.probe_once()
        assert probe({"a"}) == gone


def test_the_callers_own_node_is_never_watched() -> None:
    probe = NodeProbe(every_s=60, addresses=lambda: {}, own_node="me")
    probe({"me"})
    probe.probe_once()
    assert probe({"me"}) == set()


def test_the_thread_finds_a_port_that_closes_within_a_few_rounds() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    address = ("127.0.0.1", sock.getsockname()[1])
    probe = NodeProbe(every_s=0.05, addresses=lambda: {"a": address})
    try:
        assert probe({"a"}) == set()  # starts the thread
        time.sleep(0.3)
        assert probe({"a"}) == set()
        sock.close()
        t = time.monotonic()
        while not probe({"a"}) and time.monotonic() - t < 5:
            time.sleep(0.01)
        assert probe({"a"}) == {"a"}
        assert time.monotonic() - t < 1.0
    finally:
        probe.close()
        sock.close()
