"""drift.client.latency.StepTimeouts: a reply's wait follows the peer's measured pace and
the work this client already has in flight on that peer."""

from __future__ import annotations

import pytest

from drift.client.latency import StepTimeouts


def timeouts() -> StepTimeouts:
    return StepTimeouts(factor=10, min_s=2, max_s=60)


def test_unmeasured_calls_wait_the_maximum():
    t = timeouts()
    assert t.timeout("a", "step", 1) == 60
    t.observe("a", "step", 1, 0.05)
    assert t.timeout("a", "step", 1) == pytest.approx(2)  # 10 x 0.05 s, raised to min_s
    assert t.timeout("a", "step", 500) == 60  # a prompt's pace is not known from decode steps
    assert t.timeout("b", "step", 1) == 60  # nor another peer's
    t.observe("a", "step", 100, 1.0)  # 10 ms per token
    assert t.timeout("a", "step", 500) == pytest.approx(50)


def test_calls_in_flight_on_the_peer_add_their_expected_time():
    t = timeouts()
    t.observe("a", "step", 1, 0.05)
    t.observe("a", "step", 100, 1.0)
    with t.waiting("a", "step", 200) as first:  # 2 s expected
        assert first == pytest.approx(20)
        with t.waiting("a", "step", 200) as second:
            assert second == pytest.approx(40)
            assert t.in_flight("a") == 2
            # a decode step behind two prompts: 10 x (2 + 2 + 0.05) s, not 10 x 0.05 s
            assert t.timeout("a", "step", 1) == pytest.approx(40.5)
            assert t.timeout("b", "step", 1) == 60  # other peers are not slowed by them
        assert t.timeout("a", "step", 1) == pytest.approx(20.5)
    assert t.in_flight("a") == 0
    assert t.timeout("a", "step", 1) == pytest.approx(2)


def test_an_unmeasured_call_in_flight_makes_the_wait_the_maximum():
    t = timeouts()
    t.observe("a", "step", 1, 0.05)
    with t.waiting("a", "forward", 300):  # a forward's pace was never measured
        assert t.timeout("a", "step", 1) == 60
    assert t.timeout("a", "step", 1) == pytest.approx(2)


def test_a_failed_call_leaves_the_in_flight_count():
    t = timeouts()
    with pytest.raises(RuntimeError), t.waiting("a", "step", 1):
        raise RuntimeError("the peer hung up")
    assert t.in_flight("a") == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="factor >= 1"):
        StepTimeouts(factor=0.5, min_s=2, max_s=60)
    with pytest.raises(ValueError, match="min_s <= max_s"):
        StepTimeouts(factor=10, min_s=70, max_s=60)


def test_past_its_timeout_a_call_waits_on_only_while_the_server_holds_it_and_advances():
    from drift.wire.progress import ComputeStatus

    t = timeouts()

    def status(running_s: float, unit_s: float | None = 0.1, pending: bool = True):
        return ComputeStatus(running_s, 3, unit_s, pending)

    assert t.more_wait(status(0.5), waited_s=2.0, window_s=2.0) == 2.0  # busy: another window
    assert t.more_wait(status(0.5), waited_s=59.0, window_s=2.0) == pytest.approx(1.0)  # max_s
    assert t.more_wait(status(0.5), waited_s=61.0, window_s=2.0) == 0.0
    assert t.more_wait(None, waited_s=2.0, window_s=2.0) == 0.0  # no answer: left
    assert t.more_wait(status(0.5, pending=False), 2.0, 2.0) == 0.0  # the step is not there
    assert t.more_wait(status(2.5), 2.0, 2.0) == 0.0  # a unit running past min_s: stuck
    # a span whose units take 1.5 s at its measured pace: one may run 4x that
    assert t.more_wait(status(5.0, unit_s=1.5), 2.0, 2.0) == 2.0
    assert t.more_wait(status(6.5, unit_s=1.5), 2.0, 2.0) == 0.0
    assert t.more_wait(status(1.0, unit_s=None), 2.0, 2.0) == 2.0  # pace unknown: min_s
