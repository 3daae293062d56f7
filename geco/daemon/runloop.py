"""gecod's runloop: one thread, one epoll, callbacks for sockets, timers and signals.

The original's GECORunloop, without its flaw (slow work done inside the loop):
everything slow runs in worker threads that hand their result back with
:meth:`RunLoop.call_soon_threadsafe`. Use::

    loop = RunLoop(granularity=60.0)
    loop.add_source(listener, selectors.EVENT_READ, on_accept)
    loop.add_timer(30.0, send_watchdog, repeat=30.0)
    loop.add_signal(signal.SIGTERM, lambda signum: loop.stop())
    loop.add_observer(State.BEFORE_POLL | State.AFTER_POLL, trace)
    loop.run()          # until stop()
    loop.close()

One iteration, with the observer states of the seed in the order they fire::

    ENTRY (once)
    BEFORE_POLL -> epoll_wait(timeout) -> AFTER_POLL
    BEFORE_SOURCES -> ready fds, due timers, posted callbacks -> AFTER_SOURCES
    ...
    EXIT (once)

The timeout is the time to the next timer, capped by the granularity
(default 60 s, as the original), so an idle daemon wakes once a minute.

Choices borrowed from ``selectors`` and trio, each preventing a known failure:

* A registration's data *is* its handler: no fd -> object table to go stale.
* Deadlines are absolute ``time.monotonic()`` values in a heap: a clock step
  (NTP, an admin's ``date``) neither fires timers early nor delays them.
  ``selectors`` rounds the poll timeout *up* to whole milliseconds, so a
  timer is never polled for 0.4 ms and then found not yet due (a busy spin).
* epoll_wait interrupted by a signal (EINTR) means "no events" (PEP 475
  retries it); hang-up and error conditions are reported as readable, so the
  handler's ``recv`` sees the EOF or the error and closes the fd instead of
  the loop spinning on it.
* Signals are delivered through ``signal.set_wakeup_fd``: the C-level handler
  writes the signal number into a non-blocking socketpair that the loop
  polls, so a signal arriving just before ``epoll_wait`` cannot be lost, and
  the Python handler itself does nothing.
* Threads wake the loop through a second socketpair, drained completely;
  a full buffer only means a wake-up is already pending.
* A callback that raises is logged with its traceback and its source
  removed (a repeating timer cancelled): one broken handler must not take
  the daemon, and every job waiting on it, down.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import heapq
import itertools
import math
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

from geco import log

__all__ = ["FileLike", "RunLoop", "SourceCallback", "State", "Timer"]

_log = log.get("daemon.runloop")


class FileLike(Protocol):
    """Anything epoll can watch: a socket, a pipe end, an eventfd wrapper."""

    def fileno(self) -> int: ...


SourceCallback = Callable[[Any, int], None]
"""``callback(fileobj, events)``; events is a mask of ``selectors.EVENT_READ|EVENT_WRITE``."""


class State(enum.Flag):
    """The runloop's state changes an observer can ask to be told about (the seed's six)."""

    ENTRY = enum.auto()
    BEFORE_POLL = enum.auto()
    AFTER_POLL = enum.auto()
    BEFORE_SOURCES = enum.auto()
    AFTER_SOURCES = enum.auto()
    EXIT = enum.auto()
    ALL = ENTRY | BEFORE_POLL | AFTER_POLL | BEFORE_SOURCES | AFTER_SOURCES | EXIT


@dataclass(eq=False, slots=True)
class Timer:
    """A scheduled callback; returned by :meth:`RunLoop.add_timer`.

    Attributes
    ----------
    deadline: when it fires next, in ``time.monotonic()`` seconds.
    callback: called with no arguments.
    repeat: seconds between firings, or None for once.
    """

    deadline: float
    callback: Callable[[], None]
    repeat: float | None = None
    cancelled: bool = field(default=False, init=False)

    def cancel(self) -> None:
        """Stop the timer; cancelling twice or after it fired is harmless."""
        # lazy deletion: the heap entry stays and is skipped when it comes up
        self.cancelled = True


@dataclass(frozen=True, slots=True)
class _Observer:
    states: State
    callback: Callable[[State], None]


def _describe(callback: object) -> str:
    return getattr(callback, "__qualname__", None) or repr(callback)


class RunLoop:
    """A single-threaded epoll loop (see the module docstring).

    Parameters
    ----------
    granularity: the longest time one ``epoll_wait`` may block, in seconds
        (> 0); the loop wakes at least this often even with nothing to do.

    Raises
    ------
    ValueError
        when the granularity is not a positive number.

    All methods except :meth:`call_soon_threadsafe` and :meth:`stop` must be
    called from the thread that runs the loop; :meth:`add_signal` only from
    the main thread (the only one Python delivers signals to).
    """

    def __init__(self, granularity: float = 60.0) -> None:
        if isinstance(granularity, bool) or not isinstance(granularity, int | float) \
                or not granularity > 0 or math.isinf(granularity):
            raise ValueError(f"the runloop granularity must be a positive number of seconds, "
                             f"got {granularity!r}")
        self.granularity = float(granularity)
        self._selector = selectors.EpollSelector()
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._observers: list[_Observer] = []
        self._posted: collections.deque[Callable[[], None]] = collections.deque()
        self._signal_handlers: dict[int, Callable[[int], None]] = {}
        self._saved_handlers: dict[int, Any] = {}
        self._saved_wakeup_fd: int | None = None
        self._stopping = False
        self._running = False
        self._closed = False
        self.iterations = 0
        # threads -> loop; its read end is an ordinary source
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wakeups)
        self._sig_r: socket.socket | None = None
        self._sig_w: socket.socket | None = None

    # -- sources --------------------------------------------------------------

    def add_source(self, fileobj: FileLike | int, events: int,
                   callback: SourceCallback) -> None:
        """Watch ``fileobj`` for ``events`` and call ``callback(fileobj, events)`` when ready.

        Parameters
        ----------
        fileobj: a socket, file or fd.
        events: ``selectors.EVENT_READ``, ``EVENT_WRITE`` or both.
        callback: runs in the loop; must not block.

        Raises
        ------
        KeyError
            when ``fileobj`` is already registered.
        ValueError
            when ``events`` is empty or invalid, or the fd is closed.
        OSError
            when the kernel refuses the fd (a regular file, say); nothing stays registered.
        """
        self._selector.register(fileobj, events, callback)

    def modify_source(self, fileobj: FileLike | int, events: int,
                      callback: SourceCallback | None = None) -> None:
        """Change what a registered ``fileobj`` is watched for (and optionally its callback).

        Raises
        ------
        KeyError
            when ``fileobj`` is not registered.
        """
        key = self._selector.get_key(fileobj)
        self._selector.modify(fileobj, events, callback if callback is not None else key.data)

    def remove_source(self, fileobj: FileLike | int) -> bool:
        """Stop watching ``fileobj``; return False when it was not registered.

        Call it *before* closing the fd: epoll forgets a closed fd by itself only
        when no duplicate of it is left open.
        """
        try:
            self._selector.unregister(fileobj)
        except (KeyError, ValueError):
            return False
        return True

    def has_source(self, fileobj: FileLike | int) -> bool:
        """True when ``fileobj`` is registered."""
        try:
            self._selector.get_key(fileobj)
        except (KeyError, ValueError):
            return False
        return True

    # -- timers ---------------------------------------------------------------

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> Timer:
        """Call ``callback()`` in ``delay`` seconds, then every ``repeat`` seconds if given.

        Timers due at the same moment fire in the order they were added.

        Returns
        -------
        Timer
            whose :meth:`~Timer.cancel` stops it.

        Raises
        ------
        ValueError
            when ``delay`` is negative or ``repeat`` is not positive.
        """
        if not delay >= 0:
            raise ValueError(f"a timer delay must be >= 0 seconds, got {delay!r}")
        if repeat is not None and not repeat > 0:
            raise ValueError(f"a timer repeat must be > 0 seconds, got {repeat!r}")
        timer = Timer(time.monotonic() + delay, callback, repeat)
        self._schedule(timer)
        return timer

    def _schedule(self, timer: Timer) -> None:
        heapq.heappush(self._timers, (timer.deadline, next(self._seq), timer))

    def _next_deadline(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _run_timers(self) -> None:
        now = time.monotonic()
        # only timers due *now*: a 0-delay timer added by a callback runs next iteration,
        # so a timer that keeps re-arming itself cannot starve the sockets
        due: list[Timer] = []
        while self._timers and self._timers[0][0] <= now:
            timer = heapq.heappop(self._timers)[2]
            if not timer.cancelled:
                due.append(timer)
        for timer in due:
            if timer.cancelled:  # an earlier callback of this batch cancelled it
                continue
            if timer.repeat is not None:
                # keep the rhythm, but a loop that was late does not fire a burst to catch up
                timer.deadline = max(timer.deadline + timer.repeat, now)
                self._schedule(timer)
            try:
                timer.callback()
            except Exception:
                _log.error("timer callback %s raised; timer cancelled",
                           _describe(timer.callback), exc_info=True)
                timer.cancel()

    # -- observers ------------------------------------------------------------

    def add_observer(self, states: State, callback: Callable[[State], None]) -> None:
        """Call ``callback(state)`` whenever the loop enters one of ``states``.

        Parameters
        ----------
        states: one or several :class:`State` flags (``State.ALL`` for every change).
        callback: runs in the loop; an exception is logged and the observer removed.
        """
        self._observers.append(_Observer(states, callback))

    def remove_observer(self, callback: Callable[[State], None]) -> bool:
        """Remove every registration of ``callback``; return False when there was none."""
        before = len(self._observers)
        self._observers = [o for o in self._observers if o.callback != callback]
        return len(self._observers) != before

    def _notify(self, state: State) -> None:
        for observer in list(self._observers):
            if state & observer.states:
                try:
                    observer.callback(state)
                except Exception:
                    _log.error("observer %s raised at %s; observer removed",
                               _describe(observer.callback), state.name, exc_info=True)
                    with contextlib.suppress(ValueError):
                        self._observers.remove(observer)

    # -- threads and signals --------------------------------------------------

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` in the loop's thread at its next iteration (any thread may call).

        This is how worker threads hand back results: the loop is woken at
        once even when it sleeps for the whole granularity.
        """
        self._posted.append(callback)  # deque.append is atomic
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the buffer is full: a wake-up is pending anyway
        except OSError:
            if not self._closed:
                raise

    def _drain_wakeups(self, sock: socket.socket, events: int) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while sock.recv(4096):
                pass

    def _run_posted(self) -> None:
        # only what was posted before we started: a callback posting another runs next time
        for _ in range(len(self._posted)):
            callback = self._posted.popleft()
            try:
                callback()
            except Exception:
                _log.error("posted callback %s raised", _describe(callback), exc_info=True)

    def add_signal(self, signum: int, callback: Callable[[int], None]) -> None:
        """Call ``callback(signum)`` in the loop when the process receives ``signum``.

        The first call routes Python's wake-up fd to the loop; :meth:`close`
        restores the previous handlers and wake-up fd.

        Raises
        ------
        ValueError
            when called outside the main thread, or for a signal that cannot be caught.
        """
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("signals can only be handled by a runloop in the main thread")
        if self._sig_r is None:
            self._sig_r, self._sig_w = socket.socketpair()
            for s in (self._sig_r, self._sig_w):
                s.setblocking(False)
            self._selector.register(self._sig_r, selectors.EVENT_READ, self._read_signals)
            # warn_on_full_buffer=False: a full buffer already holds a byte per pending signal
            self._saved_wakeup_fd = signal.set_wakeup_fd(self._sig_w.fileno(),
                                                         warn_on_full_buffer=False)
        if signum not in self._saved_handlers:
            self._saved_handlers[signum] = signal.signal(signum, _ignore_in_python)
        self._signal_handlers[signum] = callback

    def _read_signals(self, sock: socket.socket, events: int) -> None:
        data = b""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while chunk := sock.recv(4096):
                data += chunk
        for signum in data:
            handler = self._signal_handlers.get(signum)
            if handler is None:
                continue
            try:
                handler(signum)
            except Exception:
                _log.error("handler for signal %d raised", signum, exc_info=True)

    # -- running --------------------------------------------------------------

    def stop(self) -> None:
        """Make :meth:`run` return after the current iteration (any thread may call)."""
        self._stopping = True
        self._wake()

    @property
    def running(self) -> bool:
        """True while :meth:`run` is executing."""
        return self._running

    def _timeout(self) -> float:
        if self._posted or self._stopping:
            return 0.0
        deadline = self._next_deadline()
        if deadline is None:
            return self.granularity
        return min(max(deadline - time.monotonic(), 0.0), self.granularity)

    def run_once(self) -> None:
        """Poll once (up to the next timer or the granularity) and dispatch what is ready."""
        self._notify(State.BEFORE_POLL)
        ready = self._selector.select(self._timeout())
        self._notify(State.AFTER_POLL)
        self._notify(State.BEFORE_SOURCES)
        for key, events in ready:
            # an earlier callback of this batch may have removed (and closed) this one
            if not self.has_source(key.fileobj) or \
                    self._selector.get_key(key.fileobj).data is not key.data:
                continue
            try:
                key.data(key.fileobj, events)
            except Exception:
                _log.error("source callback %s for fd %d raised; source removed",
                           _describe(key.data), key.fd, exc_info=True)
                self.remove_source(key.fileobj)
        self._run_timers()
        self._run_posted()
        self._notify(State.AFTER_SOURCES)
        self.iterations += 1

    def run(self) -> None:
        """Run until :meth:`stop` is called.

        Raises
        ------
        RuntimeError
            when the loop is closed or already running.
        """
        if self._closed:
            raise RuntimeError("the runloop is closed")
        if self._running:
            raise RuntimeError("the runloop is already running")
        self._running = True
        self._stopping = False
        try:
            self._notify(State.ENTRY)
            while not self._stopping:
                self.run_once()
        finally:
            self._running = False
            self._notify(State.EXIT)

    def close(self, signals_to: signal.Handlers | None = None) -> None:
        """Restore signal handling, close the loop's own fds and the selector.

        ``signals_to`` (``SIG_IGN``) replaces the handled signals' previous handlers
        instead: a process on its way out that must not die of a second signal
        between the restore and its own ``signal()`` call.
        Registered sources are forgotten, not closed: their owners close them.
        """
        if self._closed:
            return
        self._closed = True
        for signum, previous in self._saved_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if signals_to is None else signals_to)
        if self._sig_w is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._saved_wakeup_fd if self._saved_wakeup_fd is not None
                                     else -1)
        self._selector.close()
        for s in (self._wake_r, self._wake_w, self._sig_r, self._sig_w):
            if s is not None:
                s.close()

    def __enter__(self) -> RunLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ignore_in_python(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: nothing, the wake-up fd already told the loop."""
