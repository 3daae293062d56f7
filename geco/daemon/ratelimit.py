"""How many of a peer's refusals gecod journals one by one.

Anyone on the node can connect to gecod's public socket and send garbage:
one journal record per refusal would let a single process write thousands of
records a second, push gecod's real events (a job's OOM kill) past journald's
rate limit and make the journal useless. So each peer (a uid; every TCP client
counts as one peer, since the kernel cannot name it) gets ``burst`` records per
``window`` seconds; the rest are counted by reason and summed up in one record
per peer when the window ends (root has no budget: its refusals are few, and
each one matters)::

    uid 65534: 9,977 more refusals in 10 s (closed 9,000, timeout 977)

The server owns the clock: it calls :meth:`RefusalBudget.end_window` from a
runloop timer every ``window`` seconds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["RefusalBudget", "Summary"]


@dataclass(frozen=True, slots=True)
class Summary:
    """The refusals of one peer not journaled one by one in a window."""

    peer: int | None  # uid; None = TCP clients
    reasons: dict[str, int]

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def describe(self, window: float) -> str:
        who = "TCP clients" if self.peer is None else f"uid {self.peer}"
        parts = ", ".join(f"{reason} {n:,}" for reason, n in
                          sorted(self.reasons.items(), key=lambda item: -item[1]))
        return f"{who}: {self.count:,} more refusals in {window:g} s ({parts})"


@dataclass(slots=True)
class _Peer:
    logged: int = 0
    held_back: Counter[str] = field(default_factory=Counter)


class RefusalBudget:
    """Per-peer budgets of journal records for refusals (see the module docstring)."""

    def __init__(self, burst: int = 10, window: float = 10.0) -> None:
        self.burst = burst
        self.window = window
        self._peers: dict[int | None, _Peer] = {}

    def allow(self, peer: int | None, reason: str) -> bool:
        """Count one refusal; True when it may be journaled on its own."""
        if peer == 0:
            return True
        state = self._peers.setdefault(peer, _Peer())
        if state.logged < self.burst:
            state.logged += 1
            return True
        state.held_back[reason] += 1
        return False

    def end_window(self) -> list[Summary]:
        """Start a new window; return what each peer had held back in the old one."""
        summaries = [Summary(peer, dict(state.held_back))
                     for peer, state in self._peers.items() if state.held_back]
        self._peers.clear()
        return summaries
