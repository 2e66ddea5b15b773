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
    gate.session_loaded = True  # an update arrived, then the session was abandoned
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
