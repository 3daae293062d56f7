"""A job's usage counters as the backends list them (geco.cgroup._counters): read once, or
from files held open as gecod's sampler reads them; cgroup v2's pressure and I/O files."""

from __future__ import annotations

from pathlib import Path

import pytest

from geco.cgroup._counters import Held, io_bytes, keyed, pressure, read_once, whole
from geco.errors import CgroupError


def test_psi_and_io_stat_are_read_where_the_kernel_has_them(tmp_path: Path) -> None:
    (tmp_path / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=654\n")
    (tmp_path / "io.stat").write_text(
        "8:0 rbytes=1000 wbytes=2000 rios=1 wios=2 dbytes=0 dios=0\n"
        "8:16 rbytes=5 wbytes=7 rios=1 wios=1 dbytes=0 dios=0\n")
    counters = [pressure(tmp_path / "memory.pressure", "memory_pressure_usec"),
                io_bytes(tmp_path / "io.stat")]
    assert read_once(counters) == {"memory_pressure_usec": 123456,
                                   "io_read_bytes": 1005, "io_write_bytes": 2007}


def test_a_pressure_file_the_kernel_lists_but_does_not_serve_gives_nothing(
        tmp_path: Path) -> None:
    (tmp_path / "memory.pressure").write_text("garbage\n")
    counters = [pressure(tmp_path / "memory.pressure", "memory_pressure_usec"),
                io_bytes(tmp_path / "io.stat")]  # no io controller: no file
    assert read_once(counters) == {}


def test_held_files_read_what_they_hold_now_and_a_figure_of_two_files_is_their_sum(
        tmp_path: Path) -> None:
    """v1's failed charges are counted by memory.failcnt or memory.memsw.failcnt; cpuacct's
    nanoseconds become microseconds, cpuacct.stat's ticks too."""
    files = {"memory.failcnt": "2\n", "memory.memsw.failcnt": "3\n",
             "cpuacct.usage_user": "7000000\n", "cpuacct.stat": "user 5\nsystem 1\n",
             "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    counters = [whole(tmp_path / "memory.failcnt", "memory_max_events"),
                whole(tmp_path / "memory.memsw.failcnt", "memory_max_events"),
                whole(tmp_path / "cpuacct.usage_user", "cpu_user_usec", 1000),
                keyed(tmp_path / "cpuacct.stat", {"ticks_user": "user", "ticks_system": "system"},
                      (1_000_000, 100)),
                keyed(tmp_path / "memory.oom_control", {"oom_kill": "oom_kill"})]
    want = {"memory_max_events": 5, "cpu_user_usec": 7000, "ticks_user": 50_000,
            "ticks_system": 10_000, "oom_kill": 4}
    assert read_once(counters) == want
    held = Held(counters)
    try:
        assert held.fds == 5
        assert held.read() == want
        (tmp_path / "memory.failcnt").write_text("12\n")  # the same file, rewritten
        assert held.read()["memory_max_events"] == 15
    finally:
        held.close()
    assert held.fds == 0


def test_a_counter_holding_no_number_is_one_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "memory.current").write_text("max\n")
    with pytest.raises(CgroupError, match=r"memory\.current does not hold what the kernel"):
        read_once([whole(tmp_path / "memory.current", "memory_current")])
    with pytest.raises(CgroupError, match=r"cannot open memory\.peak"):
        Held([whole(tmp_path / "memory.current", "memory_current"),
              whole(tmp_path / "memory.peak", "memory_peak")])
