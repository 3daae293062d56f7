"""The fast lane's replay cache (lane/replay.c) keeps geco.wire.replay.ReplayCache's rules.

gecod's decoding of every frame MAC'd with the secret key asks the lane's cache
when the lane runs, so the two must agree on every sequence: a nonce is taken
once within the window, forgotten after it, and a cache full of live nonces
refuses (fails closed) rather than forgetting one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geco import _lane_cffi as lane_cffi  # built by scripts/install.sh (python -m geco._lane_build)
from geco import config
from geco.daemon import fastlane, server
from geco.errors import ProtocolError
from geco.wire.frame import decode, encode
from geco.wire.messages import JobStarted, MsgType
from geco.wire.replay import ReplayCache

WINDOW_NS = 1_000_000_000
CAPACITY = 3


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        yield s


@pytest.fixture(scope="module")
def small(listener: socket.socket) -> Iterator[Any]:
    """A lane (never started) whose cache holds 3 nonces for 1 s."""
    notify = os.eventfd(0)
    lane = lane_cffi.lib.geco_lane_new(listener.fileno(), notify, WINDOW_NS, CAPACITY)
    assert lane != lane_cffi.ffi.NULL
    yield lane
    lane_cffi.lib.geco_lane_free(lane)
    os.close(notify)


def _python_verdict(cache: ReplayCache, nonce: bytes, now: int) -> int:
    try:
        cache.check(nonce, now)
    except ProtocolError as exc:
        return 1 if "already used" in str(exc) else 2
    return 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 700_000_000)), max_size=40))
def test_the_c_cache_answers_every_sequence_as_the_python_one(
        listener: socket.socket, steps: list[tuple[int, int]]) -> None:
    """Given the same nonces at the same (rising) times, both caches take, refuse as a
    replay, refuse as full, and forget after the window alike."""
    notify = os.eventfd(0)
    lane = lane_cffi.lib.geco_lane_new(listener.fileno(), notify, WINDOW_NS, CAPACITY)
    try:
        python = ReplayCache(WINDOW_NS / 1e9, capacity=CAPACITY)
        now = 10**18
        for which, gap in steps:
            now += gap
            nonce = bytes([which]) * 16
            c = lane_cffi.lib.geco_lane_replay_check(lane, nonce, now)
            assert c == _python_verdict(python, nonce, now)
            assert lane_cffi.lib.geco_lane_replay_size(lane) == len(python)
    finally:
        lane_cffi.lib.geco_lane_free(lane)
        os.close(notify)


def test_a_full_cache_refuses_until_its_oldest_nonce_is_older_than_the_window(small: Any) -> None:
    lib, now = lane_cffi.lib, 2 * 10**18
    for n in range(CAPACITY):
        assert lib.geco_lane_replay_check(small, bytes([n]) * 16, now + n) == 0
    assert lib.geco_lane_replay_check(small, b"\x09" * 16, now + 5) == 2
    assert lib.geco_lane_replay_check(small, b"\x00" * 16, now + 5) == 1
    # the first one leaves the window: room for one
    assert lib.geco_lane_replay_check(small, b"\x09" * 16, now + WINDOW_NS + 1) == 0
    assert lib.geco_lane_replay_check(small, b"\x0a" * 16, now + WINDOW_NS + 1) == 2


def test_gecods_decoding_through_the_lanes_cache_refuses_a_replay_in_pythons_words(
        listener: socket.socket) -> None:
    """The server decodes with the lane's cache: a frame seen once is refused the second
    time, with the sentence and reason Python's own cache gives."""
    key = os.urandom(32)
    lane = fastlane.FastLane(lane_cffi.ffi, lane_cffi.lib, listener, config.Config(), key,
                             spool_root="/var/spool/gridengine/execd", journal=None,
                             stderr_level=40)
    try:
        frame = encode(MsgType.JOB_STARTED, JobStarted(7, 1, 99), key)
        decode(frame, key, replay=lane.replay)
        with pytest.raises(ProtocolError) as got:
            decode(frame, key, replay=lane.replay)
        python = ReplayCache.for_skew(config.Config().gecod_max_skew)
        decode(frame, key, replay=python)
        with pytest.raises(ProtocolError) as want:
            decode(frame, key, replay=python)
        assert (got.value.reason, str(got.value)) == (want.value.reason, str(want.value))
        assert len(lane.replay) == 1
    finally:
        lane.close()


def test_gecods_lane_takes_the_quarantine_goals_rate_for_a_whole_window_without_refusing(
        listener: socket.socket) -> None:
    """Given the lane as gecod makes it (the default 60 s window), when 10,000 frames a
    second arrive for a whole window, each with its own nonce, then none is refused as
    full: the node sustains the goal's rate, not only its first seconds (a cache of
    Python's 65,536 would refuse after 6.5 s); a repeat is still refused."""
    lane = fastlane.FastLane(lane_cffi.ffi, lane_cffi.lib, listener, config.Config(),
                             os.urandom(32), spool_root="/var/spool/gridengine/execd",
                             journal=None, stderr_level=40)
    try:
        check, handle = lane_cffi.lib.geco_lane_replay_check, lane.handle
        count = round(10_000 * lane.replay.window)
        nonces = os.urandom(16 * count)
        start = 3 * 10**18
        refused = sum(check(handle, nonces[16 * n:16 * n + 16], start + n * 100_000) != 0
                      for n in range(count))
        assert refused == 0
        assert len(lane.replay) == count
        assert check(handle, nonces[:16], start + count * 50_000) == 1  # mid-window
    finally:
        lane.close()


def test_without_the_lane_gecods_cache_takes_pythons_own_ceiling_for_a_whole_window() -> None:
    """Given gecod's cache for a node without the fast lane (the default 60 s window), when
    5,000 frames a second arrive for a whole window (Python alone answers up to about
    that many), each with its own nonce, then none is refused as full (a cache of 65,536
    refused every request after 13 s at that rate); a repeat is still refused."""
    cache = server.python_replay(config.Config())
    count = round(5_000 * cache.window)
    nonces = os.urandom(16 * count)
    start = 3 * 10**18
    refused = sum(_python_verdict(cache, nonces[16 * n:16 * n + 16], start + n * 200_000) != 0
                  for n in range(count))
    assert refused == 0
    assert len(cache) == count
    assert _python_verdict(cache, nonces[:16], start + count * 100_000) == 1  # mid-window
