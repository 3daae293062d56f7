"""gecod's memory over a long run: RSS after the first jobs and requests, and after many.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_gecod_memory [--jobs 10000]
        [--requests 1000000] [--first 1000] [--tracemalloc] [--json PATH]

A daemon that lives for months must not grow with the jobs it has seen or the requests
it answered (issue 37: RSS after the long run within 5 MiB of RSS after the first 1,000).
Starts gecod (``python -m geco.daemon``) on a test node of its own (``tests/gecodkit.py``:
a directory under /tmp, a fresh key, the cgroup parent ``geco-test-mem-<pid>``, a fake
execd spool; journald running, started here when none does), then, through gecod's own
request paths:

* **jobs**: ``--jobs`` short jobs one after another, as many at once as this machine has
  cpus. Each is spooled as sge_execd spools it (``Node.make_job``: environment, config,
  pe_hostfile, resource file); a process forked in its spool dir sends JOB_STARTED for
  itself on root's socket, as the preload does for the shepherd, so gecod contains the job
  (its cgroups made, the process moved in, its shepherd watched) and, when the process
  exits, ends it (accounting journaled, cgroups removed, files forgotten). The bench waits
  until the job's cgroups are gone, then removes its spool dir, as execd does.
* **requests**: ``--requests`` JOB_STARTED requests of a running job's PE task processes
  (``bench/geco_qbench.c``, the preload's own client call, 8 clients at once; the fast
  lane serves them, as bench_gecod's round trips).

Printed: gecod's RSS (``VmRSS``) at start, after the first ``--first`` jobs and after
them all, after the first ``--first`` requests and after them all, each difference
beside the goal (<= 5 MiB), and, as floors measured in the same run, a bare
``python3 -I -S -c pass``'s RSS and gecod's at start. Each point is read settled: once
a journal window (10 s) and the replay window have passed, and a few requests more have
let the replay cache drop what expired, so the figures compare the same state (held-back
records summed up, the window's tables cleared, no nonce of the run still live). A
burst's nonces are memory while they live (28 bytes each, for the replay window: rate x
2 x ``max_skew``), whatever gecod served before: the node's configuration here has
``max_skew = 5`` (a 10 s window; 30 s by default), and the RSS right at the burst's end
is printed beside the settled one. Some growth at first is Python's allocator and the
threads warming up; what counts is that it levels off.

``--tracemalloc``: gecod runs with :mod:`tracemalloc` and the bench prints its traced
total at the first point and the last, and the 15 lines whose allocations changed most
between them: where to look when the level does not hold (the RSS figures then include
the tracer's own memory and its snapshots: not the ones to quote).

The default sizes are the acceptance run (about 10 minutes on a 2-cpu machine);
``bench/run`` runs a short one. Cleans up its cgroups, processes and files.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._common import REPO, journald
from bench._table import Row, add_json_option, write_rows
from bench.bench_gecod import qbench, run_qbench
from geco.daemon.ratelimit import WINDOW
from geco.errors import GecoError
from geco.wire import address, client
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import AckStatus, JobStarted, MsgType
from tests.gecodkit import Node, make_node

GOAL_MIB = 5.0  # issue 37: the long run's RSS within this of the first 1,000's
MAX_SKEW = 5.0  # the node's [gecod] max_skew: a replay window of 10 s to wait out
# gecod with tracemalloc: a snapshot is dumped whenever the trigger file names where
TRACED = r"""
import gc, os, runpy, signal, sys, threading, time, tracemalloc
trigger = sys.argv.pop(1)
tracemalloc.start()
def dump():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                              signal.SIGUSR2})  # gecod's loop takes them
    while True:
        time.sleep(0.1)
        if os.path.exists(trigger):
            with open(trigger) as f:
                out = f.read().strip()
            gc.collect()
            tracemalloc.take_snapshot().dump(out + ".part")
            os.rename(out + ".part", out)
            os.unlink(trigger)
threading.Thread(target=dump, name="bench-tracemalloc", daemon=True).start()
sys.argv[0] = "gecod"
runpy.run_module("geco.daemon", run_name="__main__", alter_sys=True)
"""


def rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"bench_gecod_memory: process {pid} has no VmRSS (gone?)")


def bare_python_rss() -> float:
    """The RSS of a bare interpreter (``python3 -I -S``), read by itself, MiB."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS:')))"],
        check=True, capture_output=True, text=True)
    return int(out.stdout) / 1024


@dataclass
class MemGecod:
    """A gecod started by the bench on its node."""

    proc: subprocess.Popen[bytes]
    node: Node
    traced: bool

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def root_socket(self) -> str:
        return str(self.node.base / "gecod-root.sock")

    def snapshot(self, name: str) -> tracemalloc.Snapshot | None:
        """gecod's tracemalloc snapshot now (None when not traced)."""
        if not self.traced:
            return None
        trigger, out = self.node.base / "snapshot.trigger", self.node.base / name
        trigger.write_text(str(out))
        deadline = time.monotonic() + 120
        while trigger.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench_gecod_memory: gecod took no tracemalloc snapshot")
            time.sleep(0.05)
        return tracemalloc.Snapshot.load(str(out))


@contextlib.contextmanager
def mem_gecod(traced: bool) -> Iterator[MemGecod]:
    """gecod on a test node of its own; everything removed afterwards."""
    with make_node(Node, "mem", f"geco-test-mem-{os.getpid()}") as node:
        config = node.write_config("gecod", max_skew=str(MAX_SKEW))
        log = open(node.base / "gecod.log", "ab")  # noqa: SIM115
        argv = ([sys.executable, "-c", TRACED, str(node.base / "snapshot.trigger")] if traced
                else [sys.executable, "-m", "geco.daemon"])
        proc = subprocess.Popen([*argv, "--config", str(config)], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env={"PYTHONPATH": str(REPO),
                                     "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        log.close()
        g = MemGecod(proc, node, traced)
        try:
            where = address.parse(f"path:{g.root_socket}")
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("bench_gecod_memory: gecod did not start:\n"
                                     + (node.base / "gecod.log").read_text())
                with contextlib.suppress(GecoError):
                    address.connect(where, 1.0).close()
                    break
                time.sleep(0.05)
            yield g
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start_job(g: MemGecod, job: int) -> tuple[int, Path]:
    """Spool job ``job`` and fork its "shepherd": JOB_STARTED for itself from the job's spool
    dir, then exit (the ACK's status is its exit status; 255: no answer)."""
    job_dir = g.node.make_job(job)
    key, where = g.node.key, address.parse(f"path:{g.root_socket}")
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        code = 255
        try:
            os.chdir(job_dir)
            frame = encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()), key)
            code = int(decode_ack(client.request(where, frame, 60), key, frame[12:28]).status)
        finally:
            os._exit(code)
    return pid, job_dir


def run_jobs(g: MemGecod, first_job: int, count: int, at_once: int,
             refused: dict[str, int]) -> None:
    """``count`` jobs contained and ended through gecod, ``at_once`` at a time; the ACKs
    other than OK are counted into ``refused`` by status."""
    running: dict[int, tuple[int, int, Path]] = {}  # pidfd -> pid, job, spool dir
    started = 0
    statuses = {s.value: s.name for s in AckStatus}
    while started < count or running:
        while started < count and len(running) < at_once:
            pid, job_dir = _start_job(g, first_job + started)
            running[os.pidfd_open(pid)] = (pid, first_job + started, job_dir)
            started += 1
        # only our children: a plain wait() could reap a journald the bench started
        ready, _, _ = select.select(list(running), [], [])
        pidfd = ready[0]
        pid, job, job_dir = running.pop(pidfd)
        os.close(pidfd)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code != AckStatus.OK:
            name = statuses.get(code, f"exit {code}")
            refused[name] = refused.get(name, 0) + 1
        deadline = time.monotonic() + 60
        while g.node.job_cgroups_left(f"{job}.1"):  # gecod ends it once the process exited
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_gecod_memory: job {job}.1 was not ended within 60 s")
            time.sleep(0.002)
        shutil.rmtree(job_dir, ignore_errors=True)  # as execd, once the shepherd is gone


def settled_rss(g: MemGecod, poke: Callable[[], object]) -> float:
    """gecod's RSS once the journal and replay windows have passed and ``poke`` (a few
    requests) let the replay cache drop the nonces that expired: each point is read in the
    same state."""
    time.sleep(max(WINDOW, 2 * MAX_SKEW) + 1.0)
    poke()
    time.sleep(0.5)
    return rss_mib(g.pid)


def run_requests(binary: Path, g: MemGecod, job_dir: Path, job: int, count: int) -> None:
    """``count`` JOB_STARTED requests from 8 client processes in a PE task dir of ``job``."""
    clients = min(8, count)
    run_qbench(binary, "rtt", "--address", f"path:{g.root_socket}", "--key-file",
               str(g.node.key_file), "--job", str(job), "--task", "1", "--clients",
               str(clients), "--requests", str(max(1, count // clients)), "--cwd", str(job_dir))


def grown(first: tracemalloc.Snapshot | None, last: tracemalloc.Snapshot | None) -> list[str]:
    """The lines whose traced allocations grew most from ``first`` to ``last``."""
    if first is None or last is None:
        return []
    total = [sum(stat.size for stat in snap.statistics("filename")) / 2**20
             for snap in (first, last)]
    return [f"traced Python allocations: {total[0]:.2f} MiB, then {total[1]:.2f} MiB",
            *(str(stat) for stat in last.compare_to(first, "lineno")[:15])]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000,
                        help="jobs contained and ended (default 10,000; 0: none)")
    parser.add_argument("--requests", type=int, default=1_000_000,
                        help="JOB_STARTED requests of a running job (default 1,000,000; 0: none)")
    parser.add_argument("--first", type=int, default=1000,
                        help="the early point each run is compared with (default 1,000)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="trace gecod's allocations; print what grew most")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_gecod_memory: run as root (gecod creates cgroups)", file=sys.stderr)
        return 2
    for name in ("jobs", "requests"):
        value = getattr(args, name)
        if value and value <= args.first:
            parser.error(f"--{name} must be 0 or more than --first ({args.first}), got {value}")
    binary = qbench()
    rows: list[Row] = []
    report: list[str] = []
    bare = bare_python_rss()
    at_once = len(os.sched_getaffinity(0))
    job0 = 700_000_000 + os.getpid() % 100_000 * 1000  # ids of this run only
    refused: dict[str, int] = {}
    try:
        with journald(), mem_gecod(args.tracemalloc) as g:
            # the job the requests are of, running from the start: a few of them are what
            # lets the replay cache drop expired nonces before each point is read
            job = job0 + args.jobs + 1
            g.node.make_job(job, slots=1)
            task_dir = g.node.make_pe_task_dir(job)

            def settled() -> float:
                return settled_rss(g, lambda: run_requests(binary, g, task_dir, job, 8))

            start = settled()
            rows.append(Row("gecod RSS at start", start, "MiB", floor=bare,
                            floor_label="python3 -I -S -c pass"))
            if args.jobs:
                began = time.monotonic()
                run_jobs(g, job0, args.first, at_once, refused)
                spent = time.monotonic() - began
                after_first, snap_first = settled(), g.snapshot("jobs-first")
                began = time.monotonic()
                run_jobs(g, job0 + args.first, args.jobs - args.first, at_once, refused)
                spent += time.monotonic() - began
                after_all, snap_all = settled(), g.snapshot("jobs-all")
                rows += [
                    Row(f"gecod RSS after the first {args.first:,} jobs", after_first, "MiB",
                        floor=start, floor_label="gecod at start"),
                    Row(f"gecod RSS after {args.jobs:,} jobs", after_all, "MiB",
                        floor=start, floor_label="gecod at start"),
                    Row(f"gecod RSS growth, job {args.first:,} to {args.jobs:,}",
                        after_all - after_first, "MiB", goal=f"<= {GOAL_MIB:g}")]
                report.append(f"{args.jobs:,} jobs contained and ended, "
                              f"{args.jobs / spent:.0f} a second; not OK: {refused or 'none'}")
                report += grown(snap_first, snap_all)
            if args.requests:
                before = rss_mib(g.pid)
                run_requests(binary, g, task_dir, job, args.first)
                after_first, snap_first = settled(), g.snapshot("requests-first")
                began = time.monotonic()
                run_requests(binary, g, task_dir, job, args.requests - args.first)
                rate = (args.requests - args.first) / (time.monotonic() - began)
                burst = rss_mib(g.pid)
                after_all, snap_all = settled(), g.snapshot("requests-all")
                rows += [
                    Row(f"gecod RSS after the first {args.first:,} requests", after_first,
                        "MiB", floor=before, floor_label="gecod before them"),
                    Row(f"gecod RSS at the end of {args.requests:,} requests (their window's "
                        "nonces live)", burst, "MiB", floor=before,
                        floor_label="gecod before them"),
                    Row(f"gecod RSS after {args.requests:,} requests", after_all, "MiB",
                        floor=before, floor_label="gecod before them"),
                    Row(f"gecod RSS growth, request {args.first:,} to {args.requests:,}",
                        after_all - after_first, "MiB", goal=f"<= {GOAL_MIB:g}")]
                report.append(f"{args.requests:,} requests of a running job's tasks, "
                              f"{rate:,.0f} a second (the fast lane)")
                report += grown(snap_first, snap_all)
    finally:
        shutil.rmtree(binary.parent, ignore_errors=True)
    write_rows(args.json, rows)
    width = max(len(r.figure) for r in rows)
    for row in rows:
        floor = f"   (floor {row.floor:.1f} MiB: {row.floor_label})" if row.floor else ""
        goal = f"   goal {row.goal} MiB" if row.goal != "-" else ""
        print(f"  {row.figure:<{width}}  {row.measured:6.1f} MiB{goal}{floor}")
    for line in report:
        print(f"  {line}")
    over = [r.figure for r in rows if r.goal != "-" and r.measured > GOAL_MIB]
    if over:
        print(f"bench_gecod_memory: past the goal: {', '.join(over)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
