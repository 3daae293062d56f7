"""Did the job use what it asked for? A job task's samples turned into ``seff``'s figures.

As Slurm's ``seff`` defines them: CPU efficiency = CPU time / (cores x wall time),
memory efficiency = peak / requested. Beside them the peak and when it came, the OOM
kills, and a line of advice where the request was far off, both ways (as Princeton's
jobstats words it: "you asked 8 cores and used 1.1 on average: request 2").
"""

from __future__ import annotations

import math
from typing import Any

from geco._tuple import NamedTuple
from geco.terminal import printable
from geco.units import format_memory
from geco.usage.samples import Series

__all__ = ["Report", "Whole", "cpu_ratio", "memory_ratio", "render", "render_whole", "report",
           "whole"]

# Below this many seconds of wall time a job says too little to advise on.
_ADVISE_AFTER = 10.0
# Cores used on average beyond a whole number that are noise (the job's own threads
# waking, the kernel's accounting): 1.03 of 2 cores is "request 1", 1.1 is "request 2".
_CORE_NOISE = 0.05
# Memory: a peak over this share of the request leaves no headroom; under the other
# share (and more than _MEMORY_SLACK unused) the request was far too high.
_TIGHT, _LOOSE = 0.9, 0.5
_MEMORY_SLACK = 256 << 20
_HEADROOM = 1.2  # what to request: the peak and a fifth more


def cpu_ratio(cpu_seconds: float, cores: int, wall: float) -> float | None:
    """seff's CPU efficiency as a share (1 = every granted core busy all along): CPU time
    / (cores x wall time); None when it cannot be told (no cores, no wall time yet, a
    counter the kernel does not keep here: negative)."""
    return cpu_seconds / (cores * wall) if cpu_seconds >= 0 and cores > 0 and wall > 0 \
        else None


def memory_ratio(peak: int, requested: int) -> float | None:
    """seff's memory efficiency as a share: peak / requested; None without a request (or
    a peak the kernel does not keep here: negative)."""
    return peak / requested if peak >= 0 and requested > 0 else None


class Report(NamedTuple):
    """One job task on one host: requested beside used."""

    job: str
    host: str
    owner: str
    name: str
    running: bool
    started: float
    last: float
    wall: float
    cores: int
    cpu_seconds: float | None
    cpu_efficiency: float | None
    memory_requested: int
    memory_peak: int
    memory_peak_at: float | None
    memory_efficiency: float | None
    gpus: int
    oom_kills: int
    advice: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return self._asdict() | {"advice": list(self.advice)}


def _advice(cores: int, cpu_eff: float | None, wall: float, requested: int, peak: int,
            oom_kills: int) -> tuple[str, ...]:
    lines = []
    if oom_kills:
        lines.append(f"the kernel's OOM killer ended {oom_kills} process(es) of the job: "
                     + (f"request more than {format_memory(requested)} of memory" if requested
                        else f"it held {format_memory(peak)} with no limit of its own: the "
                             f"node ran out; request the memory it needs"))
    if wall < _ADVISE_AFTER:
        return tuple(lines)
    if cpu_eff is not None and cores > 1:
        used = cores * cpu_eff / 100
        cores_wanted = max(1, math.ceil(used - _CORE_NOISE))
        if cores_wanted < cores:
            lines.append(f"you asked {cores} cores and used {used:.1f} on average: request "
                         f"{cores_wanted}")
    if requested and peak and not oom_kills:
        want = format_memory(int(peak * _HEADROOM))
        if peak > requested * _TIGHT:
            lines.append(f"peak {format_memory(peak)} of {format_memory(requested)}: request "
                         f"more headroom ({want})")
        elif peak < requested * _LOOSE and requested - peak > _MEMORY_SLACK:
            lines.append(f"peak {format_memory(peak)} of {format_memory(requested)}: request "
                         f"{want}")
    return tuple(lines)


def report(series: Series, *, running: bool) -> Report:
    """The report of one job task's samples (``running``: its cgroups are still there)."""
    h, samples = series.header, series.samples
    last = samples[-1] if samples else None
    started = h.started or (samples[0].time if samples else 0.0)
    end = last.time if last is not None else started
    wall = max(0.0, end - started)
    cpu = None
    if last is not None and last.cpu_user_usec >= 0 and last.cpu_system_usec >= 0:
        cpu = (last.cpu_user_usec + last.cpu_system_usec) / 1e6
    cpu_share = cpu_ratio(cpu, h.cores, wall) if cpu is not None else None
    cpu_eff = round(100 * cpu_share, 1) if cpu_share is not None else None
    peak = max((max(s.memory_peak, s.memory_current) for s in samples), default=0)
    peak = max(peak, 0)
    peak_at = next((s.time for s in samples if max(s.memory_peak, s.memory_current) == peak),
                   None) if peak else None
    memory_share = memory_ratio(peak, h.memory) if peak else None
    mem_eff = round(100 * memory_share, 1) if memory_share is not None else None
    kills = max((s.oom_kills for s in samples), default=0)
    kills = max(kills, 0)
    return Report(f"{h.job_id}.{h.task_id}", h.host, h.owner, h.job_name, running, started,
                  end, round(wall, 1), h.cores, None if cpu is None else round(cpu, 1),
                  cpu_eff, h.memory, peak, peak_at, mem_eff, h.gpus, kills,
                  _advice(h.cores, cpu_eff, wall, h.memory, peak, kills))


class Whole(NamedTuple):
    """A job task over all its hosts (a parallel job's; one host's report alone is its
    own whole): seff's figures over the sums, each host's advice."""

    hosts: int
    cpu_efficiency: float | None
    memory_efficiency: float | None
    advice: tuple[str, ...]


def whole(reports: list[Report]) -> Whole:
    """The job over ``reports`` (one per host): CPU time / the sum of cores x wall time,
    the sum of the peaks / the sum of the requests (when every host had one)."""
    if len(reports) == 1:
        [r] = reports
        return Whole(1, r.cpu_efficiency, r.memory_efficiency, r.advice)
    counted = [r for r in reports if r.cpu_seconds is not None]
    granted = sum(r.cores * r.wall for r in counted)
    cpu = round(100 * sum(r.cpu_seconds or 0.0 for r in counted) / granted, 1) \
        if counted and granted else None
    requested = sum(r.memory_requested for r in reports)
    memory = round(100 * sum(r.memory_peak for r in reports) / requested, 1) \
        if requested and all(r.memory_requested for r in reports) else None
    return Whole(len(reports), cpu, memory,
                 tuple(f"{r.host}: {line}" for r in reports for line in r.advice))


def render_whole(job: str, w: Whole) -> str:
    """One line for a job over its hosts."""
    figures = [f"{what} efficiency {value:.1f}%" for what, value in
               (("CPU", w.cpu_efficiency), ("memory", w.memory_efficiency))
               if value is not None]
    return f"job {job} on its {w.hosts} hosts: {', '.join(figures) or 'no figures'}\n"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def render(r: Report) -> str:
    """The report as a person reads it (one block per job task)."""
    state = "running" if r.running else "ended"
    # the header's name, owner and host came from the job and its hosts: escaped
    lines = [f"job {r.job} ({printable(r.name) or 'no name'}) of {printable(r.owner) or '?'} "
             f"on {printable(r.host)}: {state}, {_duration(r.wall)} wall time"]
    if r.cpu_seconds is None:
        lines.append(f"  cores   {r.cores} requested; CPU time not counted on this node")
    else:
        used = r.cpu_seconds / r.wall if r.wall else 0.0
        eff = f"{r.cpu_efficiency:.1f}%" if r.cpu_efficiency is not None else "-"
        lines.append(f"  cores   {r.cores} requested, {used:.2f} used on average "
                     f"({r.cpu_seconds:.1f} s of CPU): CPU efficiency {eff}")
    peak = format_memory(r.memory_peak)
    when = f" at {_duration(r.memory_peak_at - r.started)}" if r.memory_peak_at else ""
    if r.memory_requested:
        eff = f"{r.memory_efficiency:.1f}%" if r.memory_efficiency is not None else "-"
        lines.append(f"  memory  {format_memory(r.memory_requested)} requested, peak {peak}"
                     f"{when}: memory efficiency {eff}")
    else:
        lines.append(f"  memory  no limit, peak {peak}{when}")
    lines.append(f"  GPUs    {r.gpus} granted")
    lines.append(f"  OOM     {r.oom_kills} process(es) killed by the kernel's OOM killer")
    lines += [f"  advice: {line}" for line in r.advice]
    return "\n".join(lines) + "\n"
