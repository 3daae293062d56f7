"""The replay cache: the nonces a receiver accepted recently, so a repeat is refused.

:func:`geco.wire.frame.decode` asks a :class:`Replay` after every other check
(``docs/wire-format.md``, "Replay").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

from geco.errors import ProtocolError

__all__ = ["Replay", "ReplayCache"]


class Replay(Protocol):
    """What :func:`decode` asks of a replay cache: record a nonce, or refuse it."""

    def check(self, nonce: bytes, now_ns: int) -> None:
        """Record ``nonce``; raise ProtocolError (reason ``nonce``) to refuse the frame."""


class ReplayCache:
    """The nonces a receiver accepted recently; a repeat within the window is refused.

    Why the window must be at least ``2 * max_skew``: a frame is accepted while
    ``|timestamp - now| <= max_skew``, so a frame first seen at time *t* (with
    ``timestamp <= t + max_skew``) could pass the clock check again until
    ``t + 2 * max_skew``; after that :func:`decode` refuses it as ``stale``
    before the cache is asked. Ages are measured on the same realtime clock as
    the timestamps: a clock that jumps forward makes old frames stale at the
    same moment it makes their nonces forgettable; one that jumps back only
    keeps nonces longer.

    Only frames with a good MAC reach the cache, so its size is bounded by the
    legitimate request rate; ``capacity`` still bounds memory. When it is full
    of nonces still inside the window, new frames are refused (fail closed)
    rather than forgetting a nonce that could then be replayed.

    ``forget_when_full`` is for PEERCRED frames, whose MAC anyone can make: any
    local user can fill a cache with them, so failing closed would let one user
    block everyone's STATUS and starter fallback for a window. Such a frame's
    nonce guards nothing (the kernel names the sender; a fresh frame is as easy
    to make as a replay), so that cache forgets its oldest nonce instead.

    Thread-safe (one lock around each check).
    """

    CAPACITY = 65536  # nonces kept at most, by default

    def __init__(self, window: float, *, capacity: int = CAPACITY,
                 forget_when_full: bool = False) -> None:
        if window <= 0 or capacity <= 0:
            raise ValueError(f"window and capacity must be > 0, got {window}, {capacity}")
        self.window = window
        self.capacity = capacity
        self.forget_when_full = forget_when_full
        self._window_ns = round(window * 1e9)
        self._seen: OrderedDict[bytes, int] = OrderedDict()  # nonce -> first seen (ns)
        self._lock = threading.Lock()

    @classmethod
    def for_skew(cls, max_skew: float, *, capacity: int = CAPACITY,
                 forget_when_full: bool = False) -> ReplayCache:
        """Return a cache whose window (``2 * max_skew``) matches :func:`decode`'s clock check."""
        return cls(2 * max_skew, capacity=capacity, forget_when_full=forget_when_full)

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, nonce: bytes, now_ns: int) -> None:
        """Record ``nonce`` as seen at ``now_ns``; refuse it if it was seen within the window.

        Raises
        ------
        ProtocolError
            reason ``nonce``: a replay, or the cache is full of live nonces (unless
            ``forget_when_full``).
        """
        with self._lock:
            # insertion order is arrival order, so expired entries are at the front
            while self._seen:
                oldest, seen_ns = next(iter(self._seen.items()))
                if now_ns - seen_ns <= self._window_ns:
                    break
                del self._seen[oldest]
            if nonce in self._seen:
                raise self.replayed(nonce, self.window)
            if len(self._seen) >= self.capacity and self.forget_when_full:
                self._seen.popitem(last=False)
            elif len(self._seen) >= self.capacity:
                raise self.full(self.capacity, self.window)
            self._seen[nonce] = now_ns

    @staticmethod
    def replayed(nonce: bytes, window: float) -> ProtocolError:
        """The refusal of a nonce seen within the window (any cache with these rules)."""
        return ProtocolError(f"nonce {nonce.hex()} was already used within the last "
                             f"{window:g} s: a replayed frame", reason="nonce")

    @staticmethod
    def full(capacity: int, window: float) -> ProtocolError:
        """The refusal when ``capacity`` nonces younger than the window are kept."""
        return ProtocolError(f"the replay cache holds {capacity} nonces younger than "
                             f"{window:g} s; refusing the frame rather than forgetting one",
                             reason="nonce")
