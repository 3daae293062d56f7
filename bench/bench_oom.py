"""Time from the kernel's OOM kill to geco's OomEvent, on this host's cgroup v1.

Run as root from the repo root:  /opt/geco/venv/bin/python bench/bench_oom.py [--runs N]

A child in a 64 MiB job cgroup touches 200 MiB and is OOM-killed; a thread
blocked in ``waitpid`` notes when the kernel has reaped it, and an
:class:`geco.oom.OomMonitor` in a :class:`geco.daemon.runloop.RunLoop` notes
when its event callback runs. Printed: callback time minus waitpid time
(negative = the event was out before ``waitpid`` returned), median of
``--runs`` kills, with min and max; once with ``/dev/kmsg`` (the monitor's
normal set-up, victims named) and once without (only the eventfd and the
re-check timers). Also: how often the v1 eventfd fires before the kill is
counted, seen by a bare :class:`geco.oom.OomWatch` read at once on wake-up.

Cgroups are made under ``geco-test-bench-<pid>`` and removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from geco import log, oom
from geco.cgroup import Limits, V1Backend, find_hierarchies, parse_mountinfo
from geco.daemon.runloop import RunLoop
from geco.errors import GecoError

MiB = 1 << 20
KEY = "1.1"


def start_victim(backend: V1Backend) -> tuple[int, int]:
    """Fork a child that waits, then touches 200 MiB; return (pid, fd that releases it)."""
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.read(go_r, 1)
        block = bytearray(200 * MiB)
        os._exit(len(block) & 0)
    os.close(go_r)
    backend.add_pid(KEY, pid)
    return pid, go_w


def waitpid_stamp(pid: int, out: list[float]) -> threading.Thread:
    def run() -> None:
        os.waitpid(pid, 0)
        out.append(time.monotonic())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def monitor_runs(backend: V1Backend, runs: int, kmsg: bool) -> list[float]:
    """Milliseconds from waitpid to the monitor's callback, per kill."""
    stamps: list[float] = []
    deltas = []
    with tempfile.TemporaryDirectory(prefix="geco-bench-oom-") as state, \
            RunLoop(granularity=1.0) as loop:
        monitor = oom.OomMonitor(loop, backend, state_dir=Path(state),
                                 kmsg=oom.KMSG if kmsg else None, sweep_interval=3600,
                                 on_events=lambda events: stamps.append(time.monotonic()))
        monitor.start()
        try:
            for _ in range(runs):
                before = len(stamps)
                waited: list[float] = []
                pid, go = start_victim(backend)
                thread = waitpid_stamp(pid, waited)
                os.write(go, b"x")
                os.close(go)
                deadline = time.monotonic() + 10
                while len(stamps) == before and time.monotonic() < deadline:
                    loop.run_once()
                thread.join(10)
                if len(stamps) == before or not waited:
                    raise SystemExit("bench_oom: no OOM event within 10 s")
                deltas.append((stamps[-1] - waited[0]) * 1e3)
        finally:
            monitor.close()
    return deltas


def early_wakeups(backend: V1Backend, runs: int) -> int:
    """How many eventfd wake-ups found the kill not yet counted."""
    early = 0
    with tempfile.TemporaryDirectory(prefix="geco-bench-oom-") as state, \
            oom.OomWatch(backend, KEY, state_dir=Path(state)) as watch:
        watch.check()
        for _ in range(runs):
            pid, go = start_victim(backend)
            os.write(go, b"x")
            os.close(go)
            select.select([watch], [], [], 10)
            if not watch.on_readable():
                early += 1
            os.waitpid(pid, 0)
            watch.check()
    return early


def row(label: str, values: list[float]) -> None:
    print(f"  {label:<34} median {statistics.median(values):7.2f} ms   "
          f"min {min(values):7.2f}   max {max(values):7.2f}   (n={len(values)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="kills per measurement")
    args = parser.parse_args()
    # the monitor's journal records would only add noise (and journald load) here
    log.setup("quiet", journal=False)
    if os.geteuid() != 0:
        print("bench_oom: run as root (it makes memory cgroups)", file=sys.stderr)
        return 1
    hier = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                            Path("/sys/fs/cgroup"))
    name = f"geco-test-bench-{os.getpid()}"
    backend = V1Backend(hier, name, exclusive_cpus=False)
    try:
        backend.ensure_root()
        backend.create(KEY, Limits(memory=64 * MiB, memory_swap=64 * MiB))
    except GecoError as exc:
        print(f"bench_oom: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"OOM kill -> OomEvent on Linux {os.uname().release}, cgroup v1, 64 MiB job, "
              f"{os.cpu_count()} cpus, Python {sys.version.split()[0]}")
        print("  (callback time - waitpid return; negative = event before waitpid)")
        row("monitor with /dev/kmsg", monitor_runs(backend, args.runs, kmsg=True))
        row("monitor without /dev/kmsg", monitor_runs(backend, args.runs, kmsg=False))
        early = early_wakeups(backend, args.runs)
        print(f"  v1 eventfd wake-ups before the kill was counted: {early} of {args.runs}")
    finally:
        with contextlib.suppress(GecoError):
            for pid in backend.pids(KEY):
                os.kill(pid, signal.SIGKILL)
            backend.wait_empty(KEY, 10)
            backend.destroy(KEY)
        for parent in backend.parent_paths().values():
            with contextlib.suppress(OSError):
                parent.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
