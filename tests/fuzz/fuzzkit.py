"""Helpers of the fuzz tests: example counts, a hang/memory guard, and the figures.

Not a conftest (pytest loads those by name); the test modules import it as
``from tests.fuzz import fuzzkit``.

``GECO_FUZZ_EXAMPLES=<n>`` scales every fuzz test up for a long run (the
benchmark): each hypothesis test then tries ``n`` examples instead of its
default, and the socket fuzz sends ``n`` inputs per batch.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import select
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from tests import figurekit

__all__ = [
    "FIGURES",
    "Figure",
    "Outcome",
    "bounded",
    "examples",
    "fuzz_settings",
    "record",
    "write_figures",
]


def examples(default: int) -> int:
    """Examples (or inputs) for one fuzz test: ``default``, or ``$GECO_FUZZ_EXAMPLES``."""
    return int(os.environ.get("GECO_FUZZ_EXAMPLES") or default)


def fuzz_settings(default: int, **more: Any) -> settings:
    """hypothesis settings of a parser fuzz: no deadline (inputs of megabytes vary a lot
    in time; hangs are caught by :func:`bounded`), no database (a run must not depend on
    an earlier one's files), nothing printed but the failing example."""
    return settings(max_examples=examples(default), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example],
                    **more)


# -- a call that must neither hang nor grow without bound -------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a call in :func:`bounded` did.

    ``error`` is the exception's class name ("" when it returned), ``message`` its
    text (or the traceback of a foreign one), ``rss_growth`` the peak RSS the call
    added, in bytes, ``hung`` True when it was killed at its time limit.
    """

    error: str
    message: str
    rss_growth: int
    hung: bool = False


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def bounded(call: Callable[[Any], object], *, timeout: float = 60.0,
            setup: Callable[[], Any] = lambda: None) -> Outcome:
    """Run ``call(setup())`` in a forked child; kill it after ``timeout`` seconds.

    ``setup`` builds the input first (a 100 MB document, say), so its memory is not
    counted as the call's. A child that outlives ``timeout`` is a hang (``hung``):
    the limit is minutes above what a linear parser needs, so it is no speed test.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_fd)
        try:
            arg = setup()
            before = _maxrss()
            try:
                call(arg)
                result = Outcome("", "", _maxrss() - before)
            except BaseException as exc:
                result = Outcome(type(exc).__name__, f"{exc}\n{traceback.format_exc()}",
                                 _maxrss() - before)
            os.write(write_fd, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        deadline = time.monotonic() + timeout
        data = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome("", f"no result within {timeout:g} s", 0, hung=True)
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        os.waitpid(pid, 0)
    finally:
        os.close(read_fd)
    if not data:
        return Outcome("killed", "the child died without a result (out of memory?)", 0)
    outcome = pickle.loads(data)
    assert isinstance(outcome, Outcome)
    return outcome


# -- figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One measured figure, as the issue's table lists it."""

    name: str
    value: float | int
    unit: str = ""

    def line(self) -> str:
        value = f"{self.value:.3g}" if isinstance(self.value, float) else f"{self.value:,}"
        return f"fuzz: {self.name}: {value}{' ' + self.unit if self.unit else ''}"


FIGURES: list[Figure] = []


def record(name: str, value: float | int, unit: str = "") -> None:
    """Keep a figure for the end of the run (and print it: ``pytest -s`` shows it at once)."""
    figure = Figure(name, value, unit)
    FIGURES.append(figure)
    figurekit.add(figure.line())
    print(figure.line())


def write_figures() -> Path | None:
    """Write the figures as JSON to ``$GECO_FIGURES_DIR/fuzz.json`` when that is set."""
    where = os.environ.get("GECO_FIGURES_DIR")
    if not where or not FIGURES:
        return None
    path = Path(where) / "fuzz.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(f) for f in FIGURES], indent=1) + "\n")
    return path
