"""Issue 37, point 7: what gecod keeps per request and per peer stays bounded.

* the replay caches: a flood of distinct nonces leaves each at its capacity, and a nonce
  seen within the window is still refused (the PEERCRED cache forgets its oldest, the
  secret key's refuses new ones when full: fail closed);
* the fast lane's replay ring (``lane/replay.c``), which gives back the pages its head
  has left: over many laps of the ring at changing rates it answers exactly as
  :class:`geco.wire.replay.ReplayCache` does (no live nonce is lost with a page);
* the journal budget of refusals: a flood from thousands of peers keeps at most
  ``max_keys`` of them apart in a window, and every refusal is still counted once.

(gecod's RSS over a million requests: ``bench/bench_gecod_memory.py``.)
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco.daemon.ratelimit import OTHERS, JournalBudget, describe_refusals
from geco.errors import ProtocolError
from geco.wire.replay import ReplayCache

SECOND = 10**9
NOW = 1_700_000_000 * SECOND


def _verdict(cache: ReplayCache, nonce: bytes, now: int) -> str:
    try:
        cache.check(nonce, now)
    except ProtocolError as exc:
        return "replayed" if "already used" in exc.msg else "full"
    return "ok"


def test_peercred_cache_flooded_stays_at_capacity_and_refuses_replays() -> None:
    cache = ReplayCache.for_skew(30.0, capacity=1000, forget_when_full=True)
    nonces = [os.urandom(16) for _ in range(5000)]
    for i, nonce in enumerate(nonces):
        assert _verdict(cache, nonce, NOW + i) == "ok"
    assert len(cache) == 1000
    # the last thousand are remembered: each replay is refused
    assert {_verdict(cache, n, NOW + 5000) for n in nonces[-1000:]} == {"replayed"}


def test_secret_key_cache_flooded_fails_closed_then_forgets_the_window() -> None:
    cache = ReplayCache.for_skew(30.0, capacity=1000)
    nonces = [os.urandom(16) for _ in range(1000)]
    for i, nonce in enumerate(nonces):
        assert _verdict(cache, nonce, NOW + i) == "ok"
    assert _verdict(cache, os.urandom(16), NOW + 1000) == "full"
    assert {_verdict(cache, n, NOW + 1000) for n in nonces} == {"replayed"}
    assert len(cache) == 1000
    # once the window has passed, the next request lets all of them go
    assert _verdict(cache, os.urandom(16), NOW + 61 * SECOND) == "ok"
    assert len(cache) == 1


@pytest.fixture
def lane_replay(tmp_path: Path) -> Iterator[tuple[object, object, int]]:
    """A fast lane (not started: only its replay cache is used) with a 1 s window and room
    for 4,096 nonces."""
    cffi = pytest.importorskip("geco._lane_cffi")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "lane.sock"))
    listener.listen()
    notify = os.eventfd(0, os.EFD_CLOEXEC)
    handle = cffi.lib.geco_lane_new(listener.fileno(), notify, SECOND, 4096)
    assert handle != cffi.ffi.NULL
    try:
        yield cffi.lib, handle, 4096
    finally:
        cffi.lib.geco_lane_free(handle)
        os.close(notify)
        listener.close()


def test_lane_replay_ring_answers_as_the_python_cache_over_many_laps(
        lane_replay: tuple[object, object, int]) -> None:
    lib, handle, capacity = lane_replay
    python = ReplayCache(1.0, capacity=capacity)
    words = {0: "ok", 1: "replayed", 2: "full"}
    rnd = random.Random(37)
    now, seen, full = NOW, [], 0
    # 60 laps of the ring: bursts past its capacity (the tail wraps up to the head, whose
    # page must be kept), then trickles that let whole pages expire and be given back
    for i in range(250_000):
        gap = (1_000, 50_000, 400_000)[i // 20_000 % 3] * rnd.choice((1, 2, 3))
        now += gap
        if seen and rnd.random() < 0.2:
            nonce = rnd.choice(seen[-3000:])
        else:
            nonce = rnd.randbytes(16)
            seen.append(nonce)
        lane = words[lib.geco_lane_replay_check(handle, nonce, now)]  # type: ignore[attr-defined]
        assert lane == _verdict(python, nonce, now), (i, lane)
        full += lane == "full"
    assert full > 0  # the bursts did fill it
    assert lib.geco_lane_replay_size(handle) == len(python) <= capacity  # type: ignore[attr-defined]


def test_lane_replay_flooded_stays_at_capacity_and_refuses_replays(
        lane_replay: tuple[object, object, int]) -> None:
    lib, handle, capacity = lane_replay
    nonces = [os.urandom(16) for _ in range(capacity)]
    for i, nonce in enumerate(nonces):
        assert lib.geco_lane_replay_check(handle, nonce, NOW + i) == 0  # type: ignore[attr-defined]
    flood = [lib.geco_lane_replay_check(handle, os.urandom(16), NOW + capacity + i)  # type: ignore[attr-defined]
             for i in range(10_000)]
    assert set(flood) == {2}  # full of live nonces: refused, none forgotten
    assert lib.geco_lane_replay_size(handle) == capacity  # type: ignore[attr-defined]
    assert {lib.geco_lane_replay_check(handle, n, NOW + 2 * capacity)  # type: ignore[attr-defined]
            for n in nonces} == {1}


def test_refusal_budget_keeps_a_flood_of_peers_in_one_entry() -> None:
    budget = JournalBudget[int | str | None](burst=2, window=10, exempt=(0,), others=OTHERS,
                                            max_keys=16)
    peers = [f"2001:db8::{n:x}" for n in range(5000)]
    journaled = sum(budget.allow(peer, "not-allowed") for peer in peers for _ in range(3))
    assert len(budget) == 16
    held = budget.end_window()
    # every refusal counted once: journaled one by one, or in a peer's or the others' summary
    assert journaled + sum(h.count for h in held) == 3 * len(peers)
    others = next(h for h in held if h.key == OTHERS)
    assert describe_refusals(others, 10).startswith("other peers: ")
    assert len(budget) == 0  # a new window starts empty
