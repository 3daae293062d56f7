"""The figures a test run measured, printed as one table at its end (tests/conftest.py).

Tests append lines through the ``figures`` fixture; kits that are not tests
(``tests/fuzz/fuzzkit.py``) call :func:`add`.

The run's critical path is told the same way: what ran side by side (the tests on
this host, each VM boot behind them, ``tests/system/vmrun.py``) as :class:`Span`\\ s
on the session's clock, and which of them ended last, the one the run waited for.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass

FIGURES: list[str] = []


def add(line: str) -> None:
    """Keep ``line`` for the table at the end of the run."""
    FIGURES.append(line)


@dataclass(frozen=True, slots=True)
class Span:
    """One part of the run that ran beside the others, on ``time.monotonic()``'s clock."""

    what: str
    start: float
    end: float
    detail: str = ""


SPANS: list[Span] = []
_session_start = [time.monotonic()]
_host_tests: list[float] = []  # the first test's start, the latest one's end, how many ran
# seconds of the host's tests, by test file
_host_files: defaultdict[str, float] = defaultdict(float)
_cpu_start: list[tuple[int, int]] = []  # the machine's busy and all jiffies at session start
LONGEST_FILES = 8


def _cpu() -> tuple[int, int]:
    """The machine's CPU time so far, busy and all (/proc/stat's cpu line, jiffies)."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def session_started() -> None:
    """Start the session's clock (conftest's pytest_sessionstart)."""
    _session_start[0] = time.monotonic()
    _cpu_start[:] = [_cpu()]


def span(what: str, start: float, end: float, detail: str = "") -> None:
    """Keep a part that ran beside the others (a VM boot, the image build before it)."""
    SPANS.append(Span(what, start, end, detail))


def host_test_ran(start: float, end: float, where: str = "") -> None:
    """Widen the span of the tests run on this host by one test's run (of file ``where``)."""
    _host_files[where] += end - start
    if _host_tests:
        _host_tests[1:] = [end, _host_tests[2] + 1]
    else:
        _host_tests.extend((start, end, 1))


def critical_path() -> list[str]:
    """The run's parts in the order they ended, on the session's clock, and the last of
    them: what the run waited for. Empty when nothing ran beside the host's tests."""
    if not SPANS:
        return []
    parts = list(SPANS)
    if _host_tests:
        start, end, count = _host_tests
        parts.append(Span("tests on this host", start, end, f"{count:,.0f} tests"))
    t0 = _session_start[0]
    parts.sort(key=lambda part: part.end)
    lines = [f"{part.what}: {part.start - t0:.0f} s -> {part.end - t0:.0f} s "
             f"({part.end - part.start:.0f} s{'; ' + part.detail if part.detail else ''})"
             for part in parts]
    last = parts[-1]
    line = f"critical path: {last.what}, done at {last.end - t0:.0f} s"
    if len(parts) > 1:
        line += f" ({last.end - parts[-2].end:.0f} s after {parts[-2].what})"
    return [*lines, line, *_where_the_time_went()]


def _where_the_time_went() -> list[str]:
    """How busy the machine was over the run (CPU-bound, or waiting), and the host's
    longest test files: where a shorter run has to come from."""
    lines = []
    if _cpu_start:
        (busy0, all0), (busy1, all1) = _cpu_start[0], _cpu()
        if all1 > all0:
            busy = (busy1 - busy0) / os.sysconf("SC_CLK_TCK")
            qemu = sum(int(found[1]) for part in SPANS
                       if (found := re.search(r"qemu_cpu=(\d+)s", part.detail)))
            lines.append(f"CPUs busy {100 * (busy1 - busy0) / (all1 - all0):.0f}% of the run "
                         f"({os.cpu_count()} CPUs): {busy:,.0f} CPU-seconds, {qemu:,} of them "
                         "the VM boots' qemu (niced: they take what the host's tests leave)")
    longest = ", ".join(f"{where} {seconds:.0f} s"
                        for where, seconds in sorted(_host_files.items(), key=lambda kv: -kv[1])
                        [:LONGEST_FILES])
    if longest:
        lines.append(f"the host's longest test files: {longest}")
    by_dir: defaultdict[str, float] = defaultdict(float)
    for where, seconds in _host_files.items():
        by_dir[os.path.dirname(where)] += seconds
    if by_dir:
        lines.append("the host's tests by directory: " + ", ".join(
            f"{where} {seconds:.0f} s" for where, seconds in
            sorted(by_dir.items(), key=lambda kv: -kv[1])))
    return lines
