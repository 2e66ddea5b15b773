"""`actors.engine_gate.EngineGate` on plain threads: turns, deadlines, abandoned sessions, failed writes."""

from __future__ import annotations

import threading
import time

import pytest

from actors.engine_gate import EngineGate, LateWeightUpdate, WeightsFailed


def _gate() -> tuple[EngineGate, list[str]]:
    ended: list[str] = []
    return EngineGate("s", end_session=lambda: ended.append("end")), ended


def test_a_control_call_goes_before_queued_engine_calls_and_waits_for_the_one_in_flight() -> None:
    gate, _ = _gate()
    order: list[str] = []
    first_in = threading.Event()

    def engine_call(name: str, hold_s: float) -> None:
        with gate.engine():
            order.append(name)
            first_in.set()
            time.sleep(hold_s)

    first = threading.Thread(target=engine_call, args=("generate-1", 0.3))
    first.start()
    first_in.wait(5)
    queued = threading.Thread(target=engine_call, args=("generate-2", 0.0))
    queued.start()
    time.sleep(0.05)  # generate-2 waits behind generate-1
    with gate.control("start", deadline=time.time() + 5):
        order.append("control")
    first.join(5)
    queued.join(5)
    assert order == ["generate-1", "control", "generate-2"]


def test_a_late_or_abandoned_control_call_is_refused_and_not_run() -> None:
    gate, _ = _gate()
    ran: list[str] = []
    with pytest.raises(LateWeightUpdate, match="after its deadline"), gate.control("start", time.time() - 1):
        ran.append("start")
    with pytest.raises(LateWeightUpdate, match="abandoned"), gate.control("finish", None, session=True):
        ran.append("finish")
    assert ran == [] and gate.refused == 2
    with gate.control("start", None):  # the gate is free again
        ran.append("start")
    assert ran == ["start"]


def test_an_open_session_holds_engine_calls_until_its_deadline_then_is_ended() -> None:
    gate, ended = _gate()
    gate.open_session(time.time() + 0.3)
    t0 = time.perf_counter()
    with gate.engine():  # waits for the session's deadline, then ends it (nothing was loaded: whole weights)
        pass
    assert 0.25 < time.perf_counter() - t0 < 5
    assert ended == ["end"] and gate.aborted == 1 and not gate.session_open and gate.weights_failed is None


def test_weights_that_may_be_a_mix_refuse_serving_calls_until_a_write_succeeds() -> None:
    gate, _ = _gate()
    gate.open_session(None)
    gate.session_loading()  # an update arrived, then the session was abandoned
    with gate.engine(wait_session=False, serving=False):  # the fallback load's turn ends it
        pass
    assert "abandoned after some weights" in (gate.weights_failed or "")
    with pytest.raises(WeightsFailed, match="mix of versions"), gate.engine():
        pass
    with pytest.raises(RuntimeError, match="boom"), gate.engine(serving=False), gate.at_stake("load_weights"):
        raise RuntimeError("boom")
    assert (gate.weights_failed or "").startswith("load_weights failed: RuntimeError: boom")
    with gate.engine(serving=False), gate.at_stake("load_weights"):
        pass  # a full load that succeeds
    assert gate.weights_failed is None
    with gate.engine():
        pass


def test_a_reservation_holds_engine_calls_until_the_update_starts_not_control_calls() -> None:
    """`join_world` reserves the engine for a world being opened: generate calls wait, the world's init (a
    control call) runs, and the update's start turns the reservation into the session."""
    gate, _ = _gate()
    order: list[str] = []
    gate.reserve(time.time() + 30)

    def generate() -> None:
        with gate.engine():
            order.append("generate")

    waiting = threading.Thread(target=generate)
    waiting.start()
    time.sleep(0.2)
    assert order == []  # held by the reservation
    with gate.control("init", deadline=time.time() + 5):
        order.append("init")
    time.sleep(0.1)
    assert order == ["init"]  # still held: the world is open, its update not started
    with gate.control("start", deadline=time.time() + 5):
        gate.open_session(time.time() + 0.3)  # the session replaces the reservation
    waiting.join(5)
    assert order == ["init", "generate"] and gate.reserved_until == 0.0


def test_a_reservation_ends_at_its_deadline_or_when_released() -> None:
    gate, _ = _gate()
    gate.reserve(time.time() + 0.3)
    t0 = time.perf_counter()
    with gate.engine():
        pass
    assert 0.25 < time.perf_counter() - t0 < 3
    gate.reserve(None)  # until released (a failed init releases it)
    threading.Timer(0.2, gate.unreserve).start()
    t0 = time.perf_counter()
    with gate.engine():
        pass
    assert 0.15 < time.perf_counter() - t0 < 3
    gate.reserve(None)  # the fallback load does not wait for a reservation, and ends it
    with gate.engine(wait_session=False, serving=False):
        pass
    assert gate.reserved_until == 0.0


def test_overdue_names_the_running_control_call_while_it_runs() -> None:
    gate, _ = _gate()
    assert gate.overdue() is None
    with gate.control("update_weights", deadline=time.time() - 0.0 + 0.05):
        time.sleep(0.2)
        what, late = gate.overdue() or ("", 0.0)
        assert what == "update_weights" and late > 0.1
    assert gate.overdue() is None
