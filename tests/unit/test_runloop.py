"""gecod's runloop: timers, observers, sources, threads and signals, on a real epoll."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from geco.daemon.runloop import RunLoop, State


@pytest.fixture
def loop() -> Iterator[RunLoop]:
    rl = RunLoop(granularity=60.0)
    yield rl
    rl.close()


def run_for(loop: RunLoop, seconds: float) -> None:
    """Run the loop until ``seconds`` have passed (a timer stops it)."""
    loop.add_timer(seconds, loop.stop)
    loop.run()


def test_timers_fire_in_deadline_order_not_in_the_order_they_were_added(loop: RunLoop) -> None:
    """Given timers added as 0.06, 0.02, 0.04 s and two more with the same 0.03 s delay,
    when the loop runs, then they fire by deadline, the two same-delay ones in the order
    they were added."""
    fired: list[str] = []
    for delay, name in ((0.06, "c"), (0.02, "a"), (0.04, "b"), (0.03, "x1"), (0.03, "x2")):
        loop.add_timer(delay, lambda n=name: fired.append(n))  # type: ignore[misc]
    run_for(loop, 0.1)
    assert fired == ["a", "x1", "x2", "b", "c"]


def test_a_cancelled_timer_never_fires_and_a_timer_can_cancel_a_later_one(loop: RunLoop) -> None:
    fired: list[str] = []
    doomed = loop.add_timer(0.01, lambda: fired.append("doomed"))
    doomed.cancel()
    later = loop.add_timer(0.05, lambda: fired.append("later"))
    loop.add_timer(0.02, later.cancel)
    run_for(loop, 0.08)
    assert fired == []


def test_a_repeating_timer_fires_every_period_until_cancelled(loop: RunLoop) -> None:
    """Given a timer repeating every 20 ms that cancels itself on its 4th firing,
    then it fired exactly 4 times, the k-th never before k x 20 ms. (The period is kept
    from the first deadline, not from each late firing, so a firing delayed by a busy
    machine may be followed by a shorter gap: what never happens is an early one.)"""
    times: list[float] = []

    def tick() -> None:
        times.append(time.monotonic())
        if len(times) == 4:
            timer.cancel()
    started = time.monotonic()
    timer = loop.add_timer(0.02, tick, repeat=0.02)
    run_for(loop, 0.2)
    assert len(times) == 4
    early = [(k, t - started) for k, t in enumerate(times, 1) if t - started < 0.02 * k]
    assert early == [], times


def test_bad_timer_arguments_are_refused_with_what_was_expected(loop: RunLoop) -> None:
    with pytest.raises(ValueError) as info:
        loop.add_timer(-1, lambda: None)
    assert str(info.value) == "a timer delay must be >= 0 seconds, got -1"
    with pytest.raises(ValueError) as info:
        loop.add_timer(1, lambda: None, repeat=0)
    assert str(info.value) == "a timer repeat must be > 0 seconds, got 0"
    with pytest.raises(ValueError) as info:
        RunLoop(granularity=0)
    assert str(info.value) == ("the runloop granularity must be a positive number of "
                               "seconds, got 0")


def test_observers_see_the_six_states_in_the_seeds_order(loop: RunLoop) -> None:
    """Given an observer of every state and one of only ENTRY|EXIT, when the loop runs
    two iterations, then the first sees ENTRY, then per iteration BEFORE_POLL, AFTER_POLL,
    BEFORE_SOURCES, AFTER_SOURCES, then EXIT; the second sees only its two."""
    seen: list[State] = []
    edges: list[State] = []
    loop.add_observer(State.ALL, seen.append)
    loop.add_observer(State.ENTRY | State.EXIT, edges.append)
    iterations = 0

    def count(state: State) -> None:
        nonlocal iterations
        iterations += 1
        if iterations == 2:
            loop.stop()
    loop.add_observer(State.AFTER_SOURCES, count)
    loop.add_timer(0, lambda: None, repeat=0.001)  # something to do in each iteration
    loop.run()
    one = [State.BEFORE_POLL, State.AFTER_POLL, State.BEFORE_SOURCES, State.AFTER_SOURCES]
    assert seen == [State.ENTRY, *one, *one, State.EXIT]
    assert edges == [State.ENTRY, State.EXIT]


def test_a_source_callback_gets_its_file_and_the_ready_events(loop: RunLoop) -> None:
    a, b = socket.socketpair()
    got: list[tuple[socket.socket, int, bytes]] = []

    def on_read(sock: socket.socket, events: int) -> None:
        got.append((sock, events, sock.recv(100)))
        loop.stop()
    with a, b:
        loop.add_source(a, selectors.EVENT_READ, on_read)
        b.send(b"hello")
        loop.run()
    assert got == [(a, selectors.EVENT_READ, b"hello")]


def test_a_hung_up_peer_makes_the_source_readable_so_the_handler_sees_eof(
        loop: RunLoop) -> None:
    """Given a source watched for reading whose peer closes, then the callback runs and
    recv returns b'' (a hang-up counts as readable: the handler can close, no spin)."""
    a, b = socket.socketpair()
    got: list[bytes] = []

    def on_read(sock: socket.socket, events: int) -> None:
        got.append(sock.recv(100))
        loop.remove_source(sock)
        loop.stop()
    with a:
        loop.add_source(a, selectors.EVENT_READ, on_read)
        b.close()
        loop.run()
    assert got == [b""]


def test_a_raising_source_callback_is_logged_and_removed_and_the_loop_goes_on(
        loop: RunLoop, caplog: pytest.LogCaptureFixture) -> None:
    """Given two readable sources, one whose callback raises, then the error is logged,
    that source is removed, the other keeps being served and the loop keeps running."""
    bad_a, bad_b = socket.socketpair()
    good_a, good_b = socket.socketpair()
    served: list[bytes] = []

    def broken(sock: socket.socket, events: int) -> None:
        raise RuntimeError("handler bug")

    def good(sock: socket.socket, events: int) -> None:
        served.append(sock.recv(100))
        if len(served) == 2:
            loop.stop()
        else:
            good_b.send(b"two")
    with bad_a, bad_b, good_a, good_b, caplog.at_level(logging.ERROR, "geco.runloop"):
        loop.add_source(bad_a, selectors.EVENT_READ, broken)
        loop.add_source(good_a, selectors.EVENT_READ, good)
        bad_b.send(b"x")
        good_b.send(b"one")
        loop.run()
        assert not loop.has_source(bad_a) and loop.has_source(good_a)
    assert served == [b"one", b"two"]
    [record] = [r for r in caplog.records if "raised" in r.getMessage()]
    assert record.getMessage() == (f"source callback {broken.__qualname__} for fd "
                                   f"{record.args[1]} raised; source removed")  # type: ignore[index]
    assert record.exc_info is not None and str(record.exc_info[1]) == "handler bug"


def test_a_raising_timer_and_observer_are_logged_and_dropped(
        loop: RunLoop, caplog: pytest.LogCaptureFixture) -> None:
    ticks: list[int] = []

    def bad_tick() -> None:
        ticks.append(1)
        raise ValueError("tick bug")

    def bad_observer(state: State) -> None:
        raise ValueError("observer bug")
    loop.add_timer(0.005, bad_tick, repeat=0.005)
    loop.add_observer(State.AFTER_SOURCES, bad_observer)
    with caplog.at_level(logging.ERROR, "geco.runloop"):
        run_for(loop, 0.05)
    assert ticks == [1]
    # each is reported once: the timer does not fire again, the observer is not called again
    assert sorted(r.getMessage() for r in caplog.records) == [
        f"observer {bad_observer.__qualname__} raised at AFTER_SOURCES; observer removed",
        f"timer callback {bad_tick.__qualname__} raised; timer cancelled"]


def test_call_soon_threadsafe_wakes_a_loop_sleeping_for_its_whole_granularity() -> None:
    """Given a loop with granularity 60 s and nothing to do, when a thread posts a
    callback after 50 ms, then it runs in the loop's thread well before 60 s."""
    with RunLoop(granularity=60.0) as loop:
        ran_in: list[threading.Thread] = []

        def done() -> None:
            ran_in.append(threading.current_thread())
            loop.stop()
        worker = threading.Thread(target=lambda: (time.sleep(0.05),
                                                  loop.call_soon_threadsafe(done)))
        started = time.monotonic()
        worker.start()
        loop.run()
        elapsed = time.monotonic() - started
        worker.join()
    assert ran_in == [threading.main_thread()]
    assert elapsed < 5.0, f"the posted callback waited {elapsed:.1f} s"


def test_an_idle_loop_sleeps_for_the_granularity_without_spinning() -> None:
    """Given a loop with granularity 0.1 s and no sources or timers, when it runs 0.35 s,
    then it polled about 4 times (one per granularity), not thousands."""
    with RunLoop(granularity=0.1) as loop:
        loop.add_timer(0.35, loop.stop)
        loop.run()
    assert 3 <= loop.iterations <= 6


def test_sigterm_through_the_wakeup_fd_stops_a_sleeping_loop() -> None:
    """Given a loop sleeping with granularity 60 s that stops on SIGTERM, when the process
    gets SIGTERM from another thread, then run() returns promptly, the handler saw the
    signal number, and close() restores the previous handler."""
    before = signal.getsignal(signal.SIGTERM)
    got: list[int] = []
    with RunLoop(granularity=60.0) as loop:
        loop.add_signal(signal.SIGTERM, lambda signum: (got.append(signum), loop.stop()))
        killer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        started = time.monotonic()
        killer.start()
        loop.run()
        elapsed = time.monotonic() - started
        killer.join()
    assert got == [signal.SIGTERM]
    assert elapsed < 5.0
    assert signal.getsignal(signal.SIGTERM) == before


def test_close_can_leave_the_handled_signals_ignored() -> None:
    """Given a loop handling SIGUSR1, when it is closed with signals_to=SIG_IGN (a daemon
    on its way out), then SIGUSR1 is ignored at once: no moment with the default
    action back, which for SIGTERM would kill a draining daemon."""
    before = signal.getsignal(signal.SIGUSR1)
    try:
        loop = RunLoop()
        loop.add_signal(signal.SIGUSR1, lambda signum: None)
        loop.close(signals_to=signal.SIG_IGN)
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)  # the default action would end pytest
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_signals_can_only_be_routed_to_a_loop_in_the_main_thread() -> None:
    errors: list[str] = []

    def other() -> None:
        with RunLoop() as rl:
            try:
                rl.add_signal(signal.SIGHUP, lambda s: None)
            except ValueError as exc:
                errors.append(str(exc))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == ["signals can only be handled by a runloop in the main thread"]


def test_a_source_removed_by_an_earlier_callback_of_the_same_batch_is_not_called(
        loop: RunLoop) -> None:
    """Given two sources ready in the same poll, when the first one's callback removes
    the second, then the second's callback is not called with a stale registration."""
    a1, a2 = socket.socketpair()
    b1, b2 = socket.socketpair()
    calls: list[str] = []

    def first(sock: socket.socket, events: int) -> None:
        calls.append("first")
        sock.recv(10)
        loop.remove_source(b1 if sock is a1 else a1)
        loop.stop()

    with a1, a2, b1, b2:
        loop.add_source(a1, selectors.EVENT_READ, first)
        loop.add_source(b1, selectors.EVENT_READ, first)
        a2.send(b"x")
        b2.send(b"y")
        loop.run()
    assert calls == ["first"]


def test_modify_source_switches_from_reading_to_writing(loop: RunLoop) -> None:
    a, b = socket.socketpair()
    events_seen: list[int] = []

    def on_write(sock: socket.socket, events: int) -> None:
        events_seen.append(events)
        sock.send(b"reply")
        loop.remove_source(sock)
        loop.stop()

    def on_read(sock: socket.socket, events: int) -> None:
        sock.recv(10)
        loop.modify_source(sock, selectors.EVENT_WRITE, on_write)
    with a, b:
        loop.add_source(a, selectors.EVENT_READ, on_read)
        b.send(b"req")
        loop.run()
        assert b.recv(10) == b"reply"
    assert events_seen == [selectors.EVENT_WRITE]
