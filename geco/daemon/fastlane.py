"""gecod's fast lane: later tasks of a job it contains, served in C threads off the GIL.

A parallel job's ``qrsh -inherit`` tasks each send JOB_STARTED on root's socket
as their shepherd starts. For a job whose cgroups gecod already holds, the work
is the kernel's: a socket round trip, a MAC, a few ``/proc`` and spool reads and
one ``cgroup.procs`` write per hierarchy, tens of microseconds. Python spent
about half a millisecond of the loop's core on each (the profile: logging, the
frame's objects, the loop's turns), so 64 tasks at once waited tens of
milliseconds. The lane (``lane/``, C) accepts root's socket in
threads of its own and serves exactly that case there; everything else comes
back to :class:`geco.daemon.server.Server` as a :class:`Handoff`, with the bytes
read so far, and is decided as without the lane.

What the lane may serve is published from here, by gecod's Python side:

* a job is published once a process of it went into its cgroups through
  :func:`geco.daemon.quarantine.quarantine` (the job's identity and limits known);
* it is withdrawn whenever gecod's job lock is taken for anything but a move
  (teardown, epilog, reaper): :meth:`FastLane.withdraw` returns once no lane
  thread is moving a process into it;
* a job whose trace admits info records is not published (its records go to
  its trace file, which only Python writes). The lane journals its successes
  itself (the fields Python's records have) and, when gecod's stderr takes info
  lines (``--log-level info``), writes the same line there: a job's first
  ``SUCCESS_BURST`` of a window one by one, as Python does
  (:mod:`geco.daemon.ratelimit`); the rest it counts, and :meth:`FastLane.held`
  hands the counts to Python's summary when the window ends.

The lane's replay cache is the one the server's decoding uses for every frame
MAC'd with the secret key, so a nonce is accepted once whichever side saw it. It
holds ``REPLAY_CAPACITY`` nonces, Python's own cache 524,288: full of live ones, it
refuses (fails closed), so its size is the request rate a node can sustain over a
window (``2 * max_skew``).
Without the compiled module (``geco._lane_cffi``) gecod serves everything in
Python, as before, and says so once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections import Counter
from typing import Any, NamedTuple

from geco import log
from geco.cgroup import Backend, Limits
from geco.config import Config
from geco.daemon.ratelimit import SUCCESS_BURST
from geco.jobkey import JobKey
from geco.wire.replay import ReplayCache

__all__ = ["REPLAY_CAPACITY", "FastLane", "Handoff", "open_lane"]

_log = log.get("daemon.fastlane")

# Lane threads: each accepts and serves on its own (the kernel's cgroup lock serializes
# the moves themselves; two keep both cores of a small node busy, more only contend).
_THREADS = max(1, min(4, len(os.sched_getaffinity(0))))
# Nonces the lane's replay cache holds: 17,476 requests a second sustained over the default
# 60 s window (max_skew 30 s), the quarantine goal's 10,000 with room; Python's 524,288 would
# refuse everything after 52 s at that rate. 28 bytes a nonce, in zero pages that become
# memory only as they are used, and go back once the ring has moved past them: the
# window's nonces (rate x 60 s, 28 MiB at most) and 1 MiB of hash, never every nonce
# gecod ever saw (a ring that kept its pages held all 29 MiB after a million requests).
REPLAY_CAPACITY = 1 << 20
# Published jobs remembered on the Python side (withdrawn ones leave; the rest of a
# node's ended jobs are forgotten in a batch past this).
_PUBLISHED_KEPT = 4096
# Jobs whose held-back successes one call of geco_lane_window returns at most.
_WINDOW_BATCH = 256


class Handoff(NamedTuple):
    """A connection the lane leaves to the Python server.

    Attributes
    ----------
    sock: the accepted socket (non-blocking).
    pid, uid, gid: SO_PEERCRED.
    pidfd: the peer's pidfd taken at accept, or -1.
    accepted: ``time.monotonic()`` at accept.
    data: the bytes read so far (at most one frame).
    recorded: the frame's nonce is in the replay cache already (the lane began serving
        it, then a cgroup write failed): decode it without the replay check.
    died: the lane moved the pid, then found the process gone: the pid may have been
        reused by the process now in the job.
    """

    sock: socket.socket
    pid: int
    uid: int
    gid: int
    pidfd: int
    accepted: float
    data: bytes
    recorded: bool
    died: bool


class _Replay:  # a geco.wire.replay.Replay
    """The lane's replay cache, as :class:`geco.wire.replay.ReplayCache` is used by decode."""

    def __init__(self, lane: FastLane, window: float) -> None:
        self._lane = lane
        self.window = window

    def check(self, nonce: bytes, now_ns: int) -> None:
        verdict = self._lane.lib.geco_lane_replay_check(self._lane.handle, nonce, now_ns)
        if verdict == 1:
            raise ReplayCache.replayed(nonce, self.window)
        if verdict == 2:
            raise ReplayCache.full(REPLAY_CAPACITY, self.window)

    def __len__(self) -> int:
        return int(self._lane.lib.geco_lane_replay_size(self._lane.handle))


class FastLane:
    """The C lane on root's listening socket (see the module docstring)."""

    def __init__(self, ffi: Any, lib: Any, listener: socket.socket, cfg: Config,
                 secret: bytes, *, spool_root: str, journal: str | None,
                 stderr_level: int) -> None:
        self.ffi, self.lib = ffi, lib
        self.notify_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        listener.setblocking(False)
        window = 2 * cfg.gecod_max_skew
        self.handle = lib.geco_lane_new(listener.fileno(), self.notify_fd,
                                        round(window * 1e9), REPLAY_CAPACITY)
        if self.handle == ffi.NULL:
            os.close(self.notify_fd)
            raise OSError(ffi.errno, f"cannot start gecod's fast lane: "
                                     f"{os.strerror(ffi.errno)}")
        self.replay = _Replay(self, window)
        self._published: dict[JobKey, int] = {}
        self._withdrawn_held: Counter[JobKey] = Counter()  # withdrawn in this window
        self._held_lock = threading.Lock()  # withdraw runs in workers, held in the loop
        self._threads: list[threading.Thread] = []
        self.configure(cfg, secret, spool_root=spool_root, journal=journal,
                       stderr_level=stderr_level)

    def configure(self, cfg: Config, secret: bytes, *, spool_root: str, journal: str | None,
                  stderr_level: int) -> None:
        """Take (new) settings: the key, clock skew, spool, execd uids, where entries go,
        and gecod's stderr level (at info or below, successes are lines there too)."""
        self.cfg = cfg
        uids = list(cfg.gecod_execd_uids)
        if self.lib.geco_lane_configure(
                self.handle, secret, round(cfg.gecod_max_skew * 1e9), spool_root.encode(),
                self.ffi.new("uint32_t[]", uids or [0]), len(uids),
                (journal or "").encode(), int(stderr_level <= logging.INFO),
                SUCCESS_BURST) != 0:
            raise OSError(self.ffi.errno, f"cannot configure gecod's fast lane: "
                                          f"{os.strerror(self.ffi.errno)}")

    def start(self) -> None:
        for n in range(_THREADS):
            thread = threading.Thread(target=self.lib.geco_lane_run, args=(self.handle,),
                                      name=f"gecod-lane-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    # -- what the lane may serve ----------------------------------------------

    def publish(self, key: JobKey, identity: int, limits: Limits, backend: Backend) -> None:
        """Let the lane serve later tasks of ``key`` (called under the job's lock, after a
        process went into its cgroups ``identity``)."""
        if self._published.get(key) == identity or not self._threads:
            return
        targets = backend.move_targets(key)
        resources = f"{self.cfg.resources_dir}/{key}"
        try:
            st = os.stat(resources)
            stamp = (st.st_mtime_ns, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0)
        except OSError:
            return
        if stamp != (0, 0) and _traced(self.cfg, key):
            return
        fields = "".join(f"{name}={value}\n" for name, value in limits.journal_fields().items())
        if len(self._published) >= _PUBLISHED_KEPT:
            self._published.clear()
        if self.lib.geco_lane_publish(
                self.handle, key.job, key.task,
                b"".join(t.encode() + b"\0" for t in targets) + b"\0",
                resources.encode(), stamp[0], stamp[1], fields.encode()) == 0:
            self._published[key] = identity
        else:  # a cgroup gone already: Python serves the job's tasks
            _log.debug("job %s not given to the fast lane: %s", key,
                       os.strerror(self.ffi.errno))

    def withdraw(self, key: JobKey) -> None:
        """Serve ``key`` no more; returns once no lane thread moves a process into it."""
        self._published.pop(key, None)
        held = int(self.lib.geco_lane_withdraw(self.handle, key.job, key.task))
        if held:
            with self._held_lock:
                self._withdrawn_held[key] += held

    def held(self) -> Counter[JobKey]:
        """End the journal window: the successes served here that were not journaled one
        by one since the last call, by job."""
        with self._held_lock:
            held, self._withdrawn_held = self._withdrawn_held, Counter()
        if self.handle == self.ffi.NULL:
            return held
        jobs, tasks, counts = (self.ffi.new("uint64_t[]", _WINDOW_BATCH) for _ in range(3))
        while True:
            n = int(self.lib.geco_lane_window(self.handle, jobs, tasks, counts, _WINDOW_BATCH))
            for i in range(n):
                held[JobKey(int(jobs[i]), int(tasks[i]))] += int(counts[i])
            if n < _WINDOW_BATCH:
                return held

    # -- what comes back --------------------------------------------------------

    def take(self) -> list[Handoff]:
        """The connections waiting for the Python server (after the notify fd woke us)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.notify_fd)
        out = []
        h = self.ffi.new("geco_handoff_t *")
        while self.lib.geco_lane_take(self.handle, h):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=h.fd)
            out.append(Handoff(sock, h.pid, h.uid, h.gid, h.pidfd, h.accepted,
                               bytes(self.ffi.buffer(h.buf, h.len)), bool(h.recorded),
                               bool(h.died)))
        return out

    def changed(self) -> bool:
        """True when a request served here changed the node's jobs since the last call."""
        return bool(self.lib.geco_lane_changed(self.handle))

    @property
    def served(self) -> int:
        return int(self.lib.geco_lane_served(self.handle))

    @property
    def journal_drops(self) -> int:
        return int(self.lib.geco_lane_journal_drops(self.handle))

    def stop(self) -> None:
        """Stop accepting and wait for the lane's threads (handoffs stay to be taken)."""
        self.lib.geco_lane_stop(self.handle)
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def close(self) -> None:
        """Free the lane (gecod's end, once nothing can publish or withdraw any more)."""
        self.stop()
        if self.handle != self.ffi.NULL:
            self.lib.geco_lane_free(self.handle)
            self.handle = self.ffi.NULL
        os.close(self.notify_fd)


def _traced(cfg: Config, key: JobKey) -> bool:
    """True when the job's trace takes info records (or its resource file is unreadable:
    then Python, whose trace router decides per record, serves it)."""
    from geco.job.trace import logging_level
    from geco.sge import resourcefile

    try:
        rs = resourcefile.read(cfg.resources_dir, key)
    except Exception:  # the router reads garbage as "not traced"; Python decides then
        return True
    level = logging_level(rs.trace_level) if rs is not None else None
    return level is not None and level <= logging.INFO


def open_lane(listener: socket.socket, cfg: Config, secret: bytes, *, spool_root: str,
              stderr_level: int) -> FastLane | None:
    """The lane on root's socket (:meth:`FastLane.start` starts it); None (said once) where
    it cannot run here."""
    if listener.family != socket.AF_UNIX:
        return None
    try:
        from geco._lane_cffi import ffi, lib
    except ImportError as exc:
        _log.warning("gecod's fast lane is not built (%s): every request is served in "
                     "Python; run 'python -m geco._lane_build' or reinstall geco", exc,
                     extra=log.job_fields(None, None, "fast-lane-missing"))
        return None
    try:
        lane = FastLane(ffi, lib, listener, cfg, secret, spool_root=spool_root,
                        journal=log.journal_socket(), stderr_level=stderr_level)
    except OSError as exc:
        _log.warning("%s; every request is served in Python", exc,
                     extra=log.job_fields(None, None, "fast-lane-missing"))
        return None
    _log.debug("fast lane: %d thread(s)", _THREADS)
    return lane
