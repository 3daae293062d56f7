"""gecod's worker pools: each kind of work on threads of its own, bounded per key.

A user must never be able to hold up another user's job start or login
(README: "No user can stall a node"). So gecod has no shared workers: every kind of request
(job starts, job ends, a user's own requests, ssh logins, OOM reports, other
hosts' look-ups) runs on a :class:`Pool` of its own, and within a pool each
piece of work names its *keys* (the uid it is for, its job, the peer that
asked). Per key kind the pool has a :class:`Cap`:

``running``
    at most this many of the key's works on threads at once: the others of
    that key wait in the queue without holding a thread, so one user (or one
    job, one host) can never occupy more than its share of the pool's threads;
``waiting``
    at most this many of the key's works queued or running: more are refused
    at once (:class:`Busy`, which the caller answers BUSY).

The queue as a whole is bounded too. Threads take the oldest work whose keys
are all below their ``running`` caps, so a key at its cap never blocks the
keys behind it. What a work costs inside is the caller's to bound (a time
budget for anything whose size a user decides).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from geco import log

__all__ = ["Busy", "Cap", "Keys", "Pool", "Pools"]

_log = log.get("pools")

T = TypeVar("T")

Keys = Mapping[str, Hashable]
"""A work's keys by kind, e.g. ``{"uid": 1000, "job": JobKey(42, 1)}``."""


class Busy(Exception):
    """A pool refused a work at once: its queue, or one of the work's keys, is full.
    The message says which (for the journal)."""


@dataclass(frozen=True, slots=True)
class Cap:
    """What one key of a kind may hold of a pool (see the module docstring)."""

    running: int
    waiting: int


@dataclass(eq=False, slots=True)
class _Work:
    run: Callable[[], Any]
    keys: tuple[tuple[str, Hashable], ...]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


class Pool(concurrent.futures.Executor):
    """Threads of one kind of work, with per-key caps (see the module docstring).

    Parameters
    ----------
    name: the kind of work (thread names, messages).
    threads: how many run at once.
    queue: works queued or running, in all; more are refused.
    caps: per key kind, what one key may hold; a kind without a cap is not limited.
    """

    def __init__(self, name: str, threads: int, *, queue: int,
                 caps: Mapping[str, Cap] | None = None) -> None:
        self.name = name
        self.queue = queue
        self.caps = dict(caps or {})
        self._pending: deque[_Work] = deque()
        self._running: Counter[tuple[str, Hashable]] = Counter()
        self._held: Counter[tuple[str, Hashable]] = Counter()  # queued or running
        self._busy = 0  # works queued or running
        self._changed = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"gecod-{name}-{i}",
                                          daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    # -- submitting ---------------------------------------------------------------

    def submit(self, fn: Callable[..., T], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` with no keys (the pool's own work: it is bounded
        by the queue alone). Raises :class:`Busy` when the queue is full."""
        return self.submit_for({}, lambda: fn(*args, **kwargs))

    def submit_for(self, keys: Keys, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn`` as a work of ``keys``.

        Raises
        ------
        Busy
            naming the full queue or key; nothing was queued.
        RuntimeError
            after :meth:`shutdown` (as any executor).
        """
        work = _Work(fn, tuple(keys.items()))
        with self._changed:
            if self._closed:
                raise RuntimeError(f"the {self.name} pool is shut down")
            if self._busy >= self.queue:
                raise Busy(f"{self._busy} {self.name} requests are already waiting or running")
            for key in work.keys:
                cap = self.caps.get(key[0])
                if cap is not None and self._held[key] >= cap.waiting:
                    raise Busy(f"{cap.waiting} {self.name} requests of {key[0]} {key[1]} are "
                               f"already waiting or running")
            self._busy += 1
            for key in work.keys:
                self._held[key] += 1
            self._pending.append(work)
            self._changed.notify()
        return work.future

    @property
    def busy(self) -> int:
        """Works queued or running."""
        return self._busy

    # -- running --------------------------------------------------------------------

    def _runnable(self, work: _Work) -> bool:
        for key in work.keys:
            cap = self.caps.get(key[0])
            if cap is not None and self._running[key] >= cap.running:
                return False
        return True

    def _take(self) -> _Work | None:
        """The oldest work whose keys are below their caps (under the lock); None when the
        pool is shut down and nothing is left."""
        while True:
            for work in self._pending:
                if self._runnable(work):
                    self._pending.remove(work)
                    for key in work.keys:
                        self._running[key] += 1
                    return work
            if self._closed and not self._pending:
                return None
            self._changed.wait()

    def _serve(self) -> None:
        while True:
            with self._changed:
                work = self._take()
            if work is None:
                return
            if work.future.set_running_or_notify_cancel():
                try:
                    result = work.run()
                except BaseException as exc:
                    work.future.set_exception(exc)
                else:
                    work.future.set_result(result)
            with self._changed:
                self._busy -= 1
                for key in work.keys:
                    _uncount(self._running, key)
                    _uncount(self._held, key)
                # a key below its cap again may free works other threads passed over
                self._changed.notify_all()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; with ``cancel_futures`` drop what has not started; with
        ``wait`` return when the threads are done."""
        with self._changed:
            self._closed = True
            if cancel_futures:
                while self._pending:
                    work = self._pending.popleft()
                    work.future.cancel()
                    self._busy -= 1
                    for key in work.keys:
                        _uncount(self._held, key)
            self._changed.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()


def _uncount(counter: Counter[tuple[str, Hashable]], key: tuple[str, Hashable]) -> None:
    """One less of ``key``; the entry goes at 0, so many keys leave nothing behind."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


@dataclass(frozen=True)
class Pools:
    """gecod's pools, one per kind of work (:data:`_KINDS` says each one's threads and
    caps).

    Attributes
    ----------
    starts: job starts (JOB_STARTED of a job's first process, the prolog's HOOK, a master's
        PREPARE): one job's requests wait in the queue for its first, never on threads.
    ends: job ends (a shepherd's exit, the epilog's HOOK, RELEASE, ABORT) and the strays
        after them (per owner).
    users: what any user asks on the public socket (STATUS, QUARANTINE_SELF, STARTER).
    logins: ssh logins (ADOPT, every stage), per user.
    reports: OOM reports: the owner's file (per owner: a file system the user chose may
        hang), a slave's relay to its master and the master's write (per job, per host).
    lookups: other hosts' look-ups (CALLERID, NODE_STATUS), per host.
    """

    starts: Pool
    ends: Pool
    users: Pool
    logins: Pool
    reports: Pool
    lookups: Pool

    @classmethod
    def open(cls, workers: int) -> Pools:
        """The pools, with ``workers`` (``[gecod] workers``) threads for job starts."""
        return cls(**{f.name: cls.make(f.name, workers) for f in fields(cls)})

    @staticmethod
    def make(kind: str, workers: int) -> Pool:
        """A new pool of ``kind`` (one of the attributes' names)."""
        threads, queue, caps = _KINDS[kind]
        return Pool(kind, threads or workers, queue=queue or workers * 64, caps=caps)

    def __iter__(self) -> Iterator[Pool]:
        return (getattr(self, f.name) for f in fields(self))

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Shut every pool down (see :meth:`Pool.shutdown`)."""
        for pool in self:
            pool.shutdown(wait=False, cancel_futures=cancel_futures)
        if wait:
            for pool in self:
                pool.shutdown(wait=True)


# Each kind of pool: threads (0: [gecod] workers), the queue (0: 64 per thread), and the
# caps of its keys. The threads are what a node of any size needs: the work in each is
# milliseconds, or bounded by a budget.
_KINDS: dict[str, tuple[int, int, dict[str, Cap]]] = {
    "starts": (0, 0, {"job": Cap(running=1, waiting=256)}),
    "ends": (2, 4096, {"job": Cap(running=1, waiting=16), "owner": Cap(running=1, waiting=64)}),
    "users": (4, 256, {"uid": Cap(running=1, waiting=8)}),
    "logins": (4, 256, {"uid": Cap(running=1, waiting=16)}),
    "reports": (2, 1024, {"job": Cap(running=1, waiting=4), "owner": Cap(running=1, waiting=64),
                          "peer": Cap(running=1, waiting=64)}),
    "lookups": (2, 256, {"peer": Cap(running=1, waiting=16)}),
}
