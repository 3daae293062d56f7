"""A job task's CPU and memory over time, drawn in the terminal (``geco usage --chart``).

Two panels, CPU (cores in use) and memory, each with its request drawn as a line of
``-`` across the panel, time along the bottom; at most ``width`` columns (80 by
default, a terminal's). A column stands for an equal stretch of the job's time: the
cores it used on average then, and its highest memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

from geco.units import format_memory
from geco.usage.samples import Sample, Series

__all__ = ["chart", "columns", "cpu_points", "memory_points", "start_of"]

_LABEL = 8  # "  1.5G |": the value labels and the axis
_BAR, _REQUEST, _EMPTY = "#", "-", " "


def start_of(series: Series) -> float:
    """When the job task started: its header's time, else its first sample's (0: none)."""
    return series.header.started or (series.samples[0].time if series.samples else 0.0)


def cpu_points(series: Series) -> list[tuple[float, float]]:
    """(time, cores in use since the sample before) for each sample (where both count CPU
    time): CPU time used over the wall time between them. Before the first comes the
    job's start, when known, its counters at zero then (as the report reads them): a job
    shorter than the sampling interval, sampled once at its end, has its point too."""
    out = []
    h = series.header
    start = (Sample(h.started, cpu_user_usec=0, cpu_system_usec=0),) if h.started else ()
    for a, b in pairwise((*start, *series.samples)):
        if min(a.cpu_user_usec, b.cpu_user_usec, a.cpu_system_usec, b.cpu_system_usec) < 0:
            continue
        dt = b.time - a.time
        if dt > 0:
            used = (b.cpu_user_usec + b.cpu_system_usec - a.cpu_user_usec - a.cpu_system_usec)
            out.append((b.time, max(0.0, used / 1e6 / dt)))
    return out


def memory_points(series: Series, *, peak: bool = False) -> list[tuple[float, float]]:
    """(time, bytes in use) for each sample that counts it; ``peak``: the highest so far
    (the cgroup's own record) instead of the current."""
    values = ((s.time, s.memory_peak if peak else s.memory_current) for s in series.samples)
    return [(t, float(v)) for t, v in values if v >= 0]


def columns(points: Sequence[tuple[float, float]], start: float, end: float, width: int,
            *, highest: bool) -> list[float | None]:
    """``points`` (in time order) spread over ``width`` columns of equal time from
    ``start`` to ``end``: each column's highest value (``highest``) or its mean; a column
    no point falls in takes the next point's (a sample speaks for the time before it);
    None after the last point."""
    span = max(end - start, 1e-9)
    cells: list[list[float]] = [[] for _ in range(width)]
    for t, value in points:
        i = min(width - 1, max(0, int((t - start) / span * width)))
        cells[i].append(value)
    out: list[float | None] = [None] * width
    following: float | None = None
    for i in range(width - 1, -1, -1):
        if cells[i]:
            out[i] = max(cells[i]) if highest else sum(cells[i]) / len(cells[i])
            following = cells[i][0]
        else:
            out[i] = following
    return out


def _panel(title: str, values: list[float | None], request: float, top: float, height: int,
           label: Callable[[float], str]) -> list[str]:
    """One panel: rows from the top, a bar where a column reaches the row, the request's
    line where it does not."""
    rows = [title]
    request_row = min(height - 1, int(request / top * height)) if request > 0 else None
    for row in range(height - 1, -1, -1):
        level = (row + 0.5) / height * top
        cells = []
        for v in values:
            if v is not None and v >= level:
                cells.append(_BAR)
            elif row == request_row:
                cells.append(_REQUEST)
            else:
                cells.append(_EMPTY)
        name = label(top) if row == height - 1 else "0" if row == 0 else ""
        rows.append(f"{name:>{_LABEL - 2}} |{''.join(cells)}".rstrip())
    return rows


def chart(series: Series, *, width: int = 80, height: int = 6) -> str:
    """The job task's CPU and memory panels, no line wider than ``width``."""
    h, samples = series.header, series.samples
    if not samples:
        return "no samples yet\n"
    start, end = start_of(series), samples[-1].time
    plot = max(10, width - _LABEL)
    cpu = columns(cpu_points(series), start, end, plot, highest=False)
    memory = columns(memory_points(series), start, end, plot, highest=True)
    cpu_top = max([float(h.cores), *(v for v in cpu if v is not None)]) or 1.0
    mem_top = max([float(h.memory), *(v for v in memory if v is not None)]) or 1.0
    minutes = (end - start) / 60
    axis = f"{'':>{_LABEL - 2}} +{'-' * plot}"
    times = f"{'':>{_LABEL}}0{f'{minutes:.1f} min':>{plot - 1}}"
    lines = [*_panel(f"CPU: cores in use (- - request: {h.cores})", cpu, float(h.cores),
                     cpu_top, height, lambda v: f"{v:.1f}"), axis, times,
             *_panel(f"memory (- - request: {format_memory(h.memory) if h.memory else 'none'})",
                     memory, float(h.memory), mem_top, height,
                     lambda v: format_memory(int(v))), axis, times]
    return "\n".join(line[:width] for line in lines) + "\n"
