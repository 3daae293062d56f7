"""A job task's CPU and memory over time, drawn to a PNG or SVG file (``geco usage --plot``).

The terminal chart's two panels (:mod:`geco.usage.usagechart`, whose points these are) as a
picture: CPU, the cores in use since the sample before, under the cores granted as a dashed
line; memory, the current and (where the kernel counts it) the peak so far, under the limit
as a dashed line; time since the job's start along the bottom. One row of the two panels
per series asked for (a job's tasks on this node), each titled with the job's id, name,
host and owner.

matplotlib draws it: its object API on the Agg canvas, no pyplot and none of its global
figures. It is an optional dependency (the package only suggests it), imported here only
when a file is asked for, so ``geco`` starts without it. The data lines carry ids
(:data:`GIDS`), which an SVG keeps as its groups' ids: a reader of the file finds the job's
points by name, every one of them (the path is not simplified). With several rows, each id
ends in its row's name, as ``cpu-12.3@node2`` (ids are unique in a file).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geco import atomicfile
from geco._tuple import NamedTuple
from geco.errors import GecoError
from geco.units import format_memory
from geco.usage.samples import Series
from geco.usage.usagechart import cpu_points, memory_points, start_of

__all__ = ["GIDS", "MISSING", "SUFFIXES", "Drawn", "check_path", "plot", "require",
           "too_few"]

SUFFIXES = (".png", ".svg")
MISSING = "--plot needs matplotlib (Debian: apt install python3-matplotlib)"
GIDS = ("cpu", "cpu-request", "memory", "memory-peak", "memory-request")
_MARKED = 50  # a line of fewer points marks each: a short job's few samples, each seen
_WIDTH, _ROW_HEIGHT, _DPI = 10.0, 3.4, 100  # inches, and dots an inch in a PNG
# Minutes between two time ticks on a job of an hour or more (h:mm), the first of these
# that puts at most _TICKS ticks on the axis.
_TICK_STEPS = (15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
_TICKS = 8
_MEMORY_UNITS = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
_HEADROOM = 1.1  # above the highest line, so it does not run along the panel's top edge
_PAST_END = 1.02  # of the time axis: the last sample's dot drawn whole


class Drawn(NamedTuple):
    """What one row of panels shows, in the data's units (times: seconds since the job
    task's start)."""

    name: str  # job.task@host (job.task where the host is not known)
    title: str
    cpu: tuple[tuple[float, float], ...]  # cores in use
    memory: tuple[tuple[float, float], ...]  # bytes in use
    peak: tuple[tuple[float, float], ...]  # bytes, the highest so far; () where not counted
    cores: int  # granted, the CPU panel's dashed line (0: none drawn)
    limit: int  # bytes, the memory panel's dashed line (0: no limit, none drawn)
    span: float  # seconds from the start to the last sample


def check_path(path: str) -> Path:
    """``path`` as the file to write; ValueError (its message for the user) unless it
    ends in one of :data:`SUFFIXES`, which chooses the format."""
    if Path(path).suffix.lower() not in SUFFIXES:
        raise ValueError(f"--plot FILE must end in {' or '.join(SUFFIXES)}: {path!r}")
    return Path(path)


def require() -> Any:
    """matplotlib with the parts drawn with, imported (a few tenths of a second).

    Raises
    ------
    GecoError
        :data:`MISSING` when it is not installed (or cannot be imported: why, then).
    """
    try:
        import matplotlib
        import matplotlib.backends.backend_agg
        import matplotlib.figure
        import matplotlib.ticker
    except ImportError as exc:
        missing = (exc.name or "").partition(".")[0] == "matplotlib"
        raise GecoError(MISSING if missing else f"{MISSING}: {exc}") from None
    return matplotlib


def too_few(series: Series) -> str | None:
    """Why ``series`` cannot be drawn (it has no sample after its start), or None when it
    can."""
    if series.samples and series.samples[-1].time > start_of(series):
        return None
    h, after = series.header, " after its start" if series.samples else ""
    return (f"job {h.job_id}.{h.task_id} has no samples{after} on {h.host or 'this host'} "
            f"yet: nothing to draw")


def plot(series: Sequence[Series], path: Path) -> list[Drawn]:
    """Draw each of ``series`` that :func:`too_few` lets through, one row each, to
    ``path`` (its suffix chooses PNG or SVG), replacing it whole; return what was drawn.

    Raises
    ------
    GecoError
        when matplotlib is missing (:func:`require`), none of ``series`` can be drawn, or
        the file cannot be written.
    """
    mpl = require()
    shown = [s for s in series if too_few(s) is None]
    if not shown:
        raise GecoError((too_few(series[0]) or "") if series else "no samples to draw")
    drawn = [_drawn(s) for s in shown]
    # every sample's vertex kept: the file carries the job's points, not an approximation
    with mpl.rc_context({"path.simplify": False}):
        figure = mpl.figure.Figure(figsize=(_WIDTH, _ROW_HEIGHT * len(drawn)), dpi=_DPI,
                                   layout="constrained")
        mpl.backends.backend_agg.FigureCanvasAgg(figure)
        rows = figure.subfigures(len(drawn), 1, squeeze=False)[:, 0]
        for row, d in zip(rows, drawn, strict=True):
            row.suptitle(d.title)
            _panels(mpl, row, d, f"-{d.name}" if len(drawn) > 1 else "")
        out = io.BytesIO()
        figure.savefig(out, format=path.suffix.lower()[1:])
    umask = os.umask(0)
    os.umask(umask)
    atomicfile.write_atomic(path, out.getvalue(), mode=0o666 & ~umask, what="plot")
    return drawn


def _drawn(series: Series) -> Drawn:
    h, start = series.header, start_of(series)

    def since_start(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
        return tuple((t - start, v) for t, v in points)

    key = f"{h.job_id}.{h.task_id}"
    who = [f"job {key}", h.job_name, h.host and f"on {h.host}",
           h.owner and f"({h.owner})"]
    return Drawn(f"{key}@{h.host}" if h.host else key, " ".join(w for w in who if w),
                 since_start(cpu_points(series)),
                 since_start(memory_points(series)),
                 since_start(memory_points(series, peak=True)), max(0, h.cores),
                 max(0, h.memory), series.samples[-1].time - start)


def _panels(mpl: Any, row: Any, d: Drawn, suffix: str) -> None:
    """The CPU panel and the memory panel of one row (``suffix`` ends its lines' ids)."""
    cpu, memory = row.subplots(1, 2)
    _line(cpu, d.cpu, 1.0, f"cpu{suffix}", "in use")
    if d.cores:
        cpu.axhline(d.cores, linestyle="--", color="C3", gid=f"cpu-request{suffix}",
                    label=f"granted: {d.cores} core{'s' * (d.cores != 1)}")
    top = max([float(d.cores), *(v for _, v in d.cpu)])
    cpu.set_ylim(0, top * _HEADROOM or 1.0)
    cpu.set_ylabel("cores")

    highest = max([float(d.limit), *(v for _, v in (*d.memory, *d.peak))])
    letter, unit = next(((u, f) for u, f in _MEMORY_UNITS if highest >= f), ("", 1))
    _line(memory, d.memory, unit, f"memory{suffix}", "in use")
    if d.peak:
        _line(memory, d.peak, unit, f"memory-peak{suffix}", "peak so far", linestyle=":")
    if d.limit:
        memory.axhline(d.limit / unit, linestyle="--", color="C3", gid=f"memory-request{suffix}",
                       label=f"limit: {format_memory(d.limit)}")
    memory.set_ylim(0, highest / unit * _HEADROOM or 1.0)
    memory.set_ylabel("memory")
    memory.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}{letter}"))
    for ax in (cpu, memory):
        _time_axis(mpl, ax, d.span / 60)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")


def _line(ax: Any, points: Sequence[tuple[float, float]], unit: float, gid: str,
          label: str, **style: Any) -> None:
    """``points`` (seconds, value) drawn in minutes and ``value / unit``, named ``gid``."""
    dots = {"marker": "o", "markersize": 3} if len(points) < _MARKED else {}
    ax.plot([t / 60 for t, _ in points], [v / unit for _, v in points], gid=gid, label=label,
            **dots, **style)


def _time_axis(mpl: Any, ax: Any, minutes: float) -> None:
    """Minutes since the start along the bottom; h:mm from an hour on."""
    ax.set_xlim(0, max(minutes, 1e-3) * _PAST_END)
    if minutes < 60:
        ax.set_xlabel("minutes since the start")
        return
    step = next((s for s in _TICK_STEPS if minutes / s <= _TICKS), _TICK_STEPS[-1])
    ax.xaxis.set_major_locator(mpl.ticker.MultipleLocator(step))
    ax.xaxis.set_major_formatter(
        mpl.ticker.FuncFormatter(lambda v, _: f"{int(v) // 60}:{int(v) % 60:02d}"))
    ax.set_xlabel("time since the start (h:mm)")
