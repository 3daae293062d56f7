"""The terminal chart of a job's CPU and memory (geco usage --chart), checked from its data."""

from __future__ import annotations

from geco.usage.samples import Header, Sample, Series
from geco.usage.usagechart import chart, columns

G, M = 1 << 30, 1 << 20


def _job() -> Series:
    """2 cores and 1G asked; one core busy for the first 300 s, idle for the next 300 s;
    memory at 300M throughout."""
    samples = []
    cpu = 0
    for i in range(61):
        t = 1000.0 + 10 * i
        if 0 < i <= 30:
            cpu += 10_000_000  # one core for those 10 s
        samples.append(Sample(t, cpu_user_usec=cpu, cpu_system_usec=0,
                              memory_current=300 * M, memory_peak=300 * M, tasks=1))
    return Series(Header(9, 1, owner="alice", cores=2, memory=G, started=1000.0),
                  tuple(samples))


def test_columns_spread_points_over_equal_time() -> None:
    points = [(0.0, 1.0), (1.0, 3.0), (9.0, 5.0)]
    assert columns(points, 0.0, 10.0, 5, highest=False) == [2.0, 5.0, 5.0, 5.0, 5.0]
    assert columns(points, 0.0, 10.0, 5, highest=True) == [3.0, 5.0, 5.0, 5.0, 5.0]
    assert columns(points[:1], 0.0, 10.0, 5, highest=True) == [1.0, None, None, None, None]


def test_the_chart_fits_80_columns_and_draws_the_jobs_points_and_requests() -> None:
    text = chart(_job())
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), [len(line) for line in lines]
    cpu_rows = [line for line in lines[1:7]]  # the CPU panel: title, then 6 rows
    plots = [row.split("|", 1)[1].ljust(72) for row in cpu_rows]
    heights = [sum(row[c] == "#" for row in plots) for c in range(72)]
    # one core of two: half the panel's height while busy, nothing after
    assert set(heights[:35]) == {3} and set(heights[37:]) == {0}, heights
    # the request (2 cores) is the top row's line where no bar reaches it
    assert set(plots[0]) == {"-"}
    memory_rows = [row.split("|", 1)[1] for row in lines[10:16]]
    mem_heights = {sum(row.ljust(72)[c] == "#" for row in memory_rows) for c in range(72)}
    assert mem_heights == {2}  # 300M of a 1G panel: two rows of six
    assert "1G" in lines[10] and lines[9] == "memory (- - request: 1G)"


def test_a_job_without_samples_says_so() -> None:
    assert chart(Series(Header(9, 1), ())) == "no samples yet\n"
