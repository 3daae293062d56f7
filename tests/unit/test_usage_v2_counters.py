"""cgroup v2's memory pressure and I/O counters as the usage samples take them."""

from __future__ import annotations

from pathlib import Path

from geco.cgroup._v2 import _pressure_and_io


def test_psi_and_io_stat_are_read_where_the_kernel_has_them(tmp_path: Path) -> None:
    (tmp_path / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=654\n")
    (tmp_path / "io.stat").write_text(
        "8:0 rbytes=1000 wbytes=2000 rios=1 wios=2 dbytes=0 dios=0\n"
        "8:16 rbytes=5 wbytes=7 rios=1 wios=1 dbytes=0 dios=0\n")
    assert _pressure_and_io(tmp_path) == {"memory_pressure_usec": 123456,
                                          "io_read_bytes": 1005, "io_write_bytes": 2007}


def test_a_kernel_without_psi_or_the_io_controller_gives_neither(tmp_path: Path) -> None:
    assert _pressure_and_io(tmp_path) == {}
    (tmp_path / "memory.pressure").write_text("garbage\n")
    assert _pressure_and_io(tmp_path) == {}
