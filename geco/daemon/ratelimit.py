"""How many of a kind of record gecod journals one by one: a budget per peer, or per job.

journald takes so many records of a service per interval and drops the rest
(``RateLimitBurst=``, 10,000 per 30 s scaled up with free disk space), whatever they
are: a flood of routine records would push gecod's real events (a job's OOM kill, its
accounting) past that limit. So two kinds of record have a budget:

* **refusals**: anyone on the node can connect to gecod's public socket and send
  garbage. Each peer (a uid; every TCP client counts as one peer, since the kernel
  cannot name it) gets ``burst`` records per ``window`` seconds (root has no budget:
  its refusals are few, and each one matters)::

      uid 65534: 9,977 more refusals in 10 s (closed 9,000, timeout 977)

* **successes**: a job whose tasks start faster than journald can take one record
  each (the quarantine goal is 10,000 a second) gets ``burst`` ``quarantined`` records
  per window, one per process, and one summary for the rest::

      job 42.1: 9,800 more processes quarantined in 10 s

The rest are counted by reason and summed up in one record per peer or job when the
window ends. The server owns the clock: it calls :meth:`JournalBudget.end_window` from
a runloop timer every ``window`` seconds, and the window's table goes with it. Within a
window it keeps at most ``MAX_KEYS`` peers or jobs: past that (a flood from thousands
of TCP addresses) the rest share one entry, ``OTHERS``, so no sender can grow gecod's
memory by the number of addresses it has::

      other peers: 52,113 more refusals in 10 s (not-allowed 52,113)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["MAX_KEYS", "OTHERS", "REFUSAL_BURST", "SUCCESS_BURST", "WINDOW", "Held",
           "JournalBudget", "describe_refusals"]

K = TypeVar("K", bound=Hashable)

# seconds between summaries, for both kinds
WINDOW = 10.0
# a peer's refusals journaled one by one per window
REFUSAL_BURST = 10
# a job's successes journaled one by one per window, by Python and by the fast lane each:
# every task of a job as wide as a big node, then 20 a second
SUCCESS_BURST = 200
# peers or jobs one window keeps apart at most: a node's uids, its cluster's hosts and the
# jobs starting in 10 s, with room (a few hundred bytes each: 1 MiB at most)
MAX_KEYS = 4096
# the one key the rest of a full window share (the summary's "other peers")
OTHERS = "*"


@dataclass(frozen=True, slots=True)
class Held(Generic[K]):
    """The records of one peer or job not journaled one by one in a window, by reason."""

    key: K
    reasons: dict[str, int]

    @property
    def count(self) -> int:
        return sum(self.reasons.values())


def describe_refusals(held: Held[int | str | None], window: float) -> str:
    """The summary's text for a peer's refusals (key: its uid, or its address over TCP)."""
    who = ("other peers" if held.key == OTHERS else f"host {held.key}"
           if isinstance(held.key, str) else "TCP clients" if held.key is None
           else f"uid {held.key}")
    parts = ", ".join(f"{reason} {n:,}" for reason, n in
                      sorted(held.reasons.items(), key=lambda item: -item[1]))
    return f"{who}: {held.count:,} more refusals in {window:g} s ({parts})"


@dataclass(slots=True)
class _Window:
    logged: int = 0
    held_back: Counter[str] = field(default_factory=Counter)


class JournalBudget(Generic[K]):
    """Per-key budgets of journal records (see the module docstring); ``exempt`` keys
    have none. With ``others`` (keys anyone can make: peers), a window keeps ``max_keys``
    keys apart at most, and the records of any other key count under ``others`` (its
    budget is theirs together); without it (keys only root makes: verified jobs), every
    key is kept apart."""

    def __init__(self, burst: int, window: float = WINDOW, exempt: Iterable[K] = (), *,
                 others: K | None = None, max_keys: int = MAX_KEYS) -> None:
        self.burst = burst
        self.window = window
        self.exempt = frozenset(exempt)
        self.others = others
        self.max_keys = max_keys
        self._keys: dict[K, _Window] = {}

    def __len__(self) -> int:
        """Keys this window holds apart (``others`` included)."""
        return len(self._keys)

    def _state(self, key: K) -> _Window:
        state = self._keys.get(key)
        if state is None:
            if self.others is not None and len(self._keys) >= self.max_keys - 1:
                key = self.others  # the last place is the others'
            state = self._keys.setdefault(key, _Window())
        return state

    def allow(self, key: K, reason: str) -> bool:
        """Count one record; True when it may be journaled on its own."""
        if key in self.exempt:
            return True
        state = self._state(key)
        if state.logged < self.burst:
            state.logged += 1
            return True
        state.held_back[reason] += 1
        return False

    def hold(self, key: K, reason: str, count: int) -> None:
        """Add ``count`` records held back elsewhere (the fast lane's) to this window's."""
        if count > 0:
            self._state(key).held_back[reason] += count

    def end_window(self) -> list[Held[K]]:
        """Start a new window; return what each key had held back in the old one."""
        held = [Held(key, dict(state.held_back))
                for key, state in self._keys.items() if state.held_back]
        self._keys.clear()
        return held
