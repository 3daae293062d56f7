"""The picture of a job's CPU and memory (geco usage --plot), checked from its data.

The SVG's data lines are found by their ids and their vertices mapped back to the job's
figures through the panel's own scale (two points of the line fix it), never by pixels.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from geco.errors import GecoError
from geco.usage import samples, usageplot
from geco.usage.samples import Header, Sample, Series

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[2]
G, M = 1 << 30, 1 << 20
STEP = 10.0  # seconds between two samples
# cores in use in each 10 s of the first 300 s (then none): a shape with more than two levels
BUSY = [0.5, 1.0, 1.5, 0.25] * 7 + [1.0, 0.5]
SVG = "{http://www.w3.org/2000/svg}"


def _job(task: int = 1, n: int = 61) -> Series:
    """2 cores and 1G asked; ``BUSY`` cores for the first 300 s, idle after; memory from
    100M up by 5M a sample but down every seventh, its peak the highest so far."""
    out, cpu, peak = [], 0, 0
    for i in range(n):
        if 0 < i <= len(BUSY):
            cpu += int(BUSY[i - 1] * STEP * 1e6)
        current = (100 + 5 * i - (50 if i % 7 == 6 else 0)) * M
        peak = max(peak, current)
        out.append(Sample(1000.0 + STEP * i, cpu_user_usec=cpu, cpu_system_usec=0,
                          memory_current=current, memory_peak=peak, tasks=1))
    return Series(Header(9, task, owner="alice", job_name="burn", host="node1", cores=2,
                         memory=G, started=1000.0), tuple(out))


def _expected_cpu(series: Series) -> list[tuple[float, float]]:
    """(seconds since the start, cores) the job used in each interval, from its design."""
    n = len(series.samples)
    return [(STEP * i, BUSY[i - 1] if i <= len(BUSY) else 0.0) for i in range(1, n)]


def _lines(svg: Path) -> dict[str, list[tuple[float, float]]]:
    """Each id'd group's path in the SVG: its vertices (x right, y down)."""
    out = {}
    for group in etree.parse(str(svg)).iter(f"{SVG}g"):
        path = group.find(f"{SVG}path")
        if group.get("id") in usageplot.GIDS and path is not None:
            words = path.get("d").replace("M", " ").replace("L", " ").split()
            numbers = [float(w) for w in words]
            out[group.get("id")] = list(zip(numbers[::2], numbers[1::2], strict=True))
    return out


def _scale(values: list[float], drawn: list[float]) -> tuple[float, float]:
    """(offset, factor) with drawn = offset + factor * value, from the lowest and the
    highest value."""
    lo, hi = values.index(min(values)), values.index(max(values))
    factor = (drawn[hi] - drawn[lo]) / (values[hi] - values[lo])
    return drawn[lo] - factor * values[lo], factor


def _assert_drawn(points: list[tuple[float, float]], data: list[tuple[float, float]]
                  ) -> tuple[float, float]:
    """``points`` (SVG) are ``data`` (seconds, value), each one, in order and proportion;
    return the y scale."""
    assert len(points) == len(data)
    for axis in (0, 1):
        offset, factor = _scale([d[axis] for d in data], [p[axis] for p in points])
        assert (factor > 0) == (axis == 0)  # time runs right, values up (SVG's y: down)
        for p, d in zip(points, data, strict=True):
            assert p[axis] == pytest.approx(offset + factor * d[axis], abs=0.01)
    return _scale([d[1] for d in data], [p[1] for p in points])


def test_the_svg_carries_the_jobs_points_and_its_requests_as_lines(tmp_path: Path) -> None:
    """Given a job's samples, then its SVG has a "cpu" line of one vertex per CPU point in
    the data's proportions, the "memory" and "memory-peak" lines of its samples, and the
    requests as horizontal lines at 2 cores and 1G on the same scales."""
    series = _job()
    drawn = usageplot.plot([series], tmp_path / "job.svg")
    assert [d.cpu for d in drawn] == [tuple(_expected_cpu(series))]
    lines = _lines(tmp_path / "job.svg")
    assert set(lines) == set(usageplot.GIDS)
    offset, factor = _assert_drawn(lines["cpu"], _expected_cpu(series))
    (x0, y0), (x1, y1) = lines["cpu-request"]
    assert y0 == y1 == pytest.approx(offset + factor * 2, abs=0.01) and x0 < x1
    memory = [(s.time - 1000.0, float(s.memory_current)) for s in series.samples]
    offset, factor = _assert_drawn(lines["memory"], memory)
    peak = [(s.time - 1000.0, float(s.memory_peak)) for s in series.samples]
    assert _assert_drawn(lines["memory-peak"], peak) == pytest.approx((offset, factor))
    (x0, y0), (x1, y1) = lines["memory-request"]
    assert y0 == y1 == pytest.approx(offset + factor * G, abs=0.01) and x0 < x1


def test_the_png_is_a_picture_of_the_same_points(tmp_path: Path) -> None:
    """Given the same job, then the PNG is a PNG of a row of panels (1000 x 340) drawn
    from the same points as the SVG; two tasks make two rows."""
    series = _job()
    drawn = usageplot.plot([series], tmp_path / "job.png")
    data = (tmp_path / "job.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1000, 340)
    assert drawn == usageplot.plot([series], tmp_path / "job.svg")
    d = drawn[0]
    assert d.cpu == tuple(_expected_cpu(series)) and (d.cores, d.limit) == (2, G)
    assert d.memory == tuple((s.time - 1000.0, s.memory_current) for s in series.samples)
    assert (d.name, d.title) == ("9.1@node1", "job 9.1 burn on node1 (alice)")
    both = usageplot.plot([series, _job(2)], tmp_path / "both.png")
    assert [b.name for b in both] == ["9.1@node1", "9.2@node1"]
    assert struct.unpack(">II", (tmp_path / "both.png").read_bytes()[16:24]) == (1000, 680)


def test_a_job_with_nothing_after_its_start_says_so_and_an_hour_reads_in_hours(
        tmp_path: Path) -> None:
    """Given a job task of no sample after its start, then it cannot be drawn (saying why)
    and is left out beside others; one sample at the end of a short job is its point (its
    counters ran from zero at the start); a job of an hour or more has its time in h:mm."""
    one = _job(n=1)
    assert usageplot.too_few(one) == ("job 9.1 has no samples after its start on node1 yet: "
                                      "nothing to draw")
    assert usageplot.too_few(one._replace(samples=())) == ("job 9.1 has no samples on node1 "
                                                           "yet: nothing to draw")
    with pytest.raises(GecoError, match=r"^job 9\.1 has no samples after its start on node1"):
        usageplot.plot([one], tmp_path / "one.svg")
    assert not (tmp_path / "one.svg").exists()
    at_end = one._replace(samples=(Sample(1020.0, 10_000_000, 0, 300 * M, 300 * M),))
    [d] = usageplot.plot([at_end], tmp_path / "short.svg")
    assert (d.cpu, d.memory) == (((20.0, 0.5),), ((20.0, 300.0 * M),))
    assert len(_lines(tmp_path / "short.svg")["cpu"]) == 1
    rows = usageplot.plot([one, _job(2, n=400), _job(3)], tmp_path / "long.svg")
    assert [d.name for d in rows] == ["9.2@node1", "9.3@node1"]
    text = (tmp_path / "long.svg").read_text()  # matplotlib keeps each text as a comment
    assert "<!-- time since the start (h:mm) -->" in text  # 66 minutes
    assert "<!-- minutes since the start -->" in text  # 10 minutes
    # several rows: each line's id ends in its row's name, ids unique in the file
    assert 'id="cpu-9.2@node1"' in text and 'id="cpu-9.3@node1"' in text
    assert 'id="cpu"' not in text


def test_only_png_and_svg_files_are_drawn() -> None:
    assert usageplot.check_path("a/b.SVG") == Path("a/b.SVG")
    with pytest.raises(ValueError, match=r"^--plot FILE must end in \.png or \.svg: 'b\.txt'$"):
        usageplot.check_path("b.txt")


def _geco(*args: str, conf: Path, before: str = "") -> subprocess.CompletedProcess[str]:
    """`geco` in a child (``before``: Python run first there)."""
    code = f"{before}\nfrom geco.cli import main\nraise SystemExit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120,
                          env=dict(os.environ, GECO_CONFIG=str(conf), PYTHONPATH=str(REPO)))


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    """A geco.toml whose state dir holds job 9's samples of tasks 1 and 2 (the second
    has a single sample, at its start)."""
    (tmp_path / "usage").mkdir()
    for series in (_job(), _job(2, n=1)):
        (tmp_path / "usage" / f"9.{series.header.task_id}").write_bytes(
            samples.export(series, 100))
    path = tmp_path / "geco.toml"
    path.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    return path


def test_geco_usage_plot_writes_the_file_beside_its_report(conf: Path) -> None:
    """Given job 9's samples, then `geco usage 9.1 --plot job.svg --json` prints the JSON
    report and writes the SVG of its points; `geco usage 9 --plot` says task 2 has too few
    samples to draw and draws task 1 alone."""
    out = conf.parent / "job.svg"
    res = _geco("usage", "9.1", "--json", "--plot", str(out), conf=conf)
    assert (res.returncode, res.stderr) == (0, f"geco usage: wrote {out}\n")
    assert json.loads(res.stdout)[0]["job"] == "9.1"
    assert len(_lines(out)["cpu"]) == len(_expected_cpu(_job()))
    res = _geco("usage", "9", "--plot", str(out), conf=conf)
    assert res.returncode == 0 and "9.2" in res.stdout
    assert res.stderr == (f"geco usage: job 9.2 has no samples after its start on node1 yet: "
                          f"nothing to draw: not in {out}\ngeco usage: wrote {out}\n")
    res = _geco("usage", "9.2", "--plot", str(out), conf=conf)
    assert res.returncode == 1
    assert res.stderr == ("geco usage: job 9.2 has no samples after its start on node1 yet: "
                          "nothing to draw\n")


def test_a_wrong_suffix_or_no_matplotlib_is_one_line(conf: Path) -> None:
    """Given --plot job.txt, then exit 2 naming the suffixes; given no matplotlib (its
    import fails), then exit 1 with the line saying how to install it, nothing printed."""
    res = _geco("usage", "9.1", "--plot", "job.txt", conf=conf)
    assert (res.returncode, res.stdout, res.stderr) == (
        2, "", "geco usage: --plot FILE must end in .png or .svg: 'job.txt'\n")
    res = _geco("usage", "9.1", "--plot", str(conf.parent / "job.svg"), conf=conf,
                before="import sys; sys.modules['matplotlib'] = None")
    assert (res.returncode, res.stdout, res.stderr) == (
        1, "", "geco usage: --plot needs matplotlib (Debian: apt install python3-matplotlib)\n")
    assert not (conf.parent / "job.svg").exists()


def test_geco_usage_without_plot_does_not_import_matplotlib(conf: Path) -> None:
    """`geco` starts fast: only --plot imports matplotlib."""
    told = "import atexit, sys; atexit.register(lambda: print('matplotlib' in sys.modules))"
    res = _geco("usage", "9.1", "--chart", conf=conf, before=told)
    assert res.returncode == 0 and res.stdout.endswith("\nFalse\n"), res.stdout
