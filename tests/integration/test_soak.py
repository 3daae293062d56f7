"""Soak: many short jobs of every kind through the real Grid Engine leave nothing behind.

The recommended deployment: sge_execd with the exec() preload, gecod serving, and a queue
(``geco-test-soak.q``, 2 slots) with geco's starter and no prolog or epilog, so gecod
alone contains every job at its shepherd's exec and tears it down when the shepherd exits.
``GECO_SOAK_JOBS`` job tasks (default 100: the mix ten times over; ``bench/soak.py`` runs
1,000) in the mix of soakkit: serial, array tasks, smp (``-pe smp 2``), mpi (``-pe mpi 2``
with a ``qrsh -inherit`` task) and OOM jobs. Afterwards: every task reported from inside
that it ran in its own cgroups, no two jobs held a core at once, no job cgroup, resource
file or process is left, no queue instance or job is in error state, each OOM kill was
journaled exactly once, and gecod's resident memory grew by at most ``RSS_BOUND_MIB``.

Before gecod and the preload come in, the ``floor`` fixture times the same number of
bare ``qsub -b y /bin/true`` jobs (``FLOOR_JOBS``) through a queue without geco on the
plain execd: the machine's own turnaround, printed beside the soak's figures (with
``pytest -s``, and as ``$GECO_FIGURES_DIR/soak.json`` when that is set).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.soakkit import KINDS, Batch, bare_turnaround, rss_kib, write_figures

pytestmark = pytest.mark.sge

JOBS = int(os.environ.get("GECO_SOAK_JOBS", "100"))
FLOOR_JOBS = 20
RSS_BOUND_MIB = 20
STARTER = "/usr/libexec/geco/starter"


@pytest.fixture(scope="module")
def floor(sge: Any) -> dict[str, float]:
    """Bare Grid Engine: ``FLOOR_JOBS`` ``/bin/true`` jobs through a queue without geco's
    hooks, on the execd without the preload (before the ``gecod`` fixture gives it)."""
    sge.execd_with("")
    with sge.temporary_queue("geco-test-bare.q", prolog="NONE", epilog="NONE",
                             starter_method="NONE", slots="2") as queue:
        seconds = bare_turnaround(sge, queue, FLOOR_JOBS)
    started = time.monotonic()
    os.spawnv(os.P_WAIT, "/usr/bin/python3", ["python3", "-c", "pass"])
    return {"bare_jobs": FLOOR_JOBS, "bare_seconds": round(seconds, 2),
            "bare_jobs_per_s": round(FLOOR_JOBS / seconds, 2),
            "python_start_ms": round((time.monotonic() - started) * 1000, 1)}


@pytest.fixture
def soak_queue(sge: Any) -> Iterator[str]:
    """The preload deployment's queue: geco's starter, no prolog or epilog."""
    with sge.temporary_queue("geco-test-soak.q", prolog="NONE", epilog="NONE",
                             starter_method=STARTER, slots="2") as queue:
        yield queue


def table(figures: dict[str, Any]) -> str:
    rows = [("job tasks run", f"{figures['tasks_run']} of {figures['tasks']}"),
            *[(f"  {kind}", str(figures['per_kind'].get(kind, 0))) for kind in KINDS],
            ("leaked cgroups", str(figures["leaked_cgroups"])),
            ("leaked resource/OOM files", str(figures["leaked_files"])),
            ("leftover processes", str(figures["leftover_processes"])),
            ("uncontained tasks", str(figures["uncontained"])),
            ("cores shared", str(figures["shared_cores"])),
            ("queue error states", str(figures["queue_errors"])),
            ("jobs held in error", str(figures["held"])),
            ("OOM jobs / relayed once", f"{figures['oom_jobs']} / {figures['oom_once']}"),
            ("gecod RSS start / end", f"{figures['rss_start_kib'] / 1024:.1f} / "
                                      f"{figures['rss_end_kib'] / 1024:.1f} MiB "
                                      f"(bound +{RSS_BOUND_MIB} MiB)"),
            ("wall time", f"{figures['wall_s']:.1f} s"),
            ("job tasks / s", f"{figures['tasks_per_s']:.2f}"),
            ("floor: bare /bin/true jobs", f"{figures['floor']['bare_jobs']} in "
                                           f"{figures['floor']['bare_seconds']:.1f} s = "
                                           f"{figures['floor']['bare_jobs_per_s']:.2f} /s"),
            ("floor: python3 -c pass", f"{figures['floor']['python_start_ms']:.1f} ms")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


@pytest.mark.starts_on_plain_execd  # floor: bare jobs before the preload comes in
def test_a_soak_of_short_jobs_of_every_kind_leaves_nothing_behind(
        floor: dict[str, float], sge: Any, gecod: Any, job_dir: Any, journal: Any,
        soak_queue: str, figures: list[str]) -> None:
    """Given the preload deployment, when JOBS short job tasks of every kind (serial, array,
    smp, mpi with a qrsh -inherit task, OOM) run through Grid Engine, then each ran contained
    and on cores no other job held at the time, nothing of them is left (cgroups, resource
    files, processes), no queue instance or job is in error state, each OOM kill was
    journaled exactly once, and gecod's RSS grew by at most RSS_BOUND_MIB."""
    rss_start = rss_kib(gecod.proc.pid)
    started = time.monotonic()
    batch = Batch(sge, job_dir, soak_queue, "soak")
    batch.submit_mix(JOBS)
    held = batch.wait(timeout=60 + 3 * JOBS)
    wall = time.monotonic() - started
    found = batch.check(journal)
    rss_end = rss_kib(gecod.proc.pid)

    measured = {
        "tasks": batch.task_count(), "tasks_run": sum(found.tasks.values()),
        "per_kind": dict(found.tasks), "leaked_cgroups": len(found.leaked_cgroups),
        "leaked_files": len(found.leaked_files),
        "leftover_processes": len(found.leftover_processes),
        "uncontained": len(found.uncontained), "shared_cores": len(found.shared_cores),
        "queue_errors": len(found.queue_errors), "held": len(held),
        "oom_jobs": len(found.oom_events),
        "oom_once": sum(1 for n in found.oom_events.values() if n == 1),
        "rss_start_kib": rss_start, "rss_end_kib": rss_end,
        "wall_s": round(wall, 1), "tasks_per_s": round(batch.task_count() / wall, 3),
        "failed_records": len(found.failed), "floor": floor,
    }
    shown = f"soak of {JOBS} job tasks (geco-test-soak.q, preload + starter):\n{table(measured)}"
    print(f"\n{shown}")
    figures.extend(shown.splitlines())
    write_figures("soak", measured)

    assert held == []
    assert found.problems() == {}
    assert found.tasks == {kind: n for kind, n in batch_kinds(batch).items()}
    assert found.failed == []
    assert rss_end <= rss_start + RSS_BOUND_MIB * 1024


def batch_kinds(batch: Batch) -> dict[str, int]:
    """Job tasks submitted, per kind."""
    counts: dict[str, int] = {}
    for job in batch.jobs:
        counts[job.kind] = counts.get(job.kind, 0) + len(job.tasks)
    return counts
