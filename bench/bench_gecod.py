"""Measure gecod: quarantine round trips under concurrency, memory, and idle wake-ups.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_gecod [--requests 100] [--idle-seconds 60]

Starts gecod (``python -m geco.daemon``) with a throw-away configuration: its
own directory under /tmp, a fresh key, the cgroup parent ``geco-test-bench-<pid>``
(cgroup v1 or v2, as this machine has them) and one spooled 2-slot job with a
resource file, so no qstat is involved. Then:

* **round trip**: ``bench/geco_qbench.c`` (built here with the preload's own
  client code: the C call the preload makes) forks client *processes* whose cwd
  is a PE task dir of the job (as the shepherds of ``qrsh -inherit`` tasks:
  gecod ends a job when its master shepherd exits, and a client in the job's
  own dir would be taken for it); each sends JOB_STARTED for its own pid on
  gecod's privileged socket and waits for the verified ACK, ``--requests``
  times, with 1 and with 64 clients at once. The first request of a client
  moves it into the job's cgroups; later ones find it there and move it again
  (the same kernel writes). Time = connect to verified ACK, in the client.
  gecod journals the successes as in production (a job's first 200 of each 10 s
  window one by one, then one summary for the rest): journald runs (started here
  when none does).
* **floors**, measured in the same run by the same program: a bare Unix-socket
  round trip of the same sizes against servers that do no work (as many as gecod
  has lane threads), with 1 and with 64 clients, and one
  ``cgroup.procs`` write (a move into the job's cpuset cgroup), a quarantine's writes
  (one per hierarchy) as real moves and as the round trips' later requests make them
  (the process already there: the kernel takes its lock all the same); beside them, one
  such write 0.2 s after the last (what a quiet node's first job start pays: the
  kernel's cgroup lock waits for an RCU grace period when it was not taken lately,
  unless the kernel is in its ``favordynmods`` mode: README, "Busy nodes"; the mode
  mountinfo shows is printed too).
* **RSS**: ``VmRSS`` of gecod from ``/proc/<pid>/status``, after start-up and
  after the load.
* **idle wake-ups**: the sum over gecod's threads (``/proc/<pid>/task/*/status``)
  of ``voluntary_ctxt_switches + nonvoluntary_ctxt_switches`` across
  ``--idle-seconds`` with no client, scaled to one minute, from the end of the
  load's journal window (its summary is written then). No watchdog is set
  (systemd's ``WatchdogSec=30`` adds 4 wake-ups a minute).

Prints a table. Cleans up its cgroups, processes and files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._common import REPO, journald
from bench._table import Row, add_json_option, write_rows
from geco.cgroup import favors_dynmods, parse_mountinfo
from geco.daemon.ratelimit import WINDOW
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile

JOB, TASK = 77001, 1
CGROUP_ROOT = Path("/sys/fs/cgroup")


def qbench() -> Path:
    """Build ``geco_qbench`` (the preload's own client code, timed) once per run."""
    build = Path(tempfile.mkdtemp(prefix="geco-test-qbench-"))
    target = build / "geco_qbench"
    subprocess.run(["make", "-s", "-C", str(REPO), f"BUILD={build}", str(target)],
                   check=True, stdout=subprocess.DEVNULL)
    return target


def run_qbench(binary: Path, *args: str) -> dict[str, float | str]:
    """One ``geco_qbench`` mode; its JSON line (latencies in microseconds)."""
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=600)
    try:
        figures: dict[str, float | str] = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"bench_gecod: geco_qbench {args[0]} printed no figures: "
                         f"{out.stderr.strip() or out.stdout.strip()}") from None
    if out.returncode != 0:
        raise SystemExit(f"bench_gecod: geco_qbench {args[0]}: {figures['failed']} of "
                         f"{figures['requests']} requests failed: {figures['first_error']}")
    return figures


def round_trips(binary: Path, g: BenchGecod, clients: int,
                requests: int) -> dict[str, float | str]:
    """``clients`` processes working in the job's PE task dir, ``requests`` JOB_STARTED each
    for their own pid on the privileged socket, as the preload sends them."""
    return run_qbench(binary, "rtt", "--address", f"path:{g.root_socket}", "--key-file",
                      str(g.key_file), "--job", str(JOB), "--task", str(TASK), "--clients",
                      str(clients), "--requests", str(requests), "--cwd", str(g.job_dir))


def _status_field(pid: int, name: str, task: str | None = None) -> int:
    path = Path(f"/proc/{pid}/task/{task}/status" if task else f"/proc/{pid}/status")
    for line in path.read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def _switches(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            total += (_status_field(pid, "voluntary_ctxt_switches", task)
                      + _status_field(pid, "nonvoluntary_ctxt_switches", task))
    return total


def _remove_cgroups(name: str) -> None:
    for parent in [*CGROUP_ROOT.glob(f"*/{name}"), CGROUP_ROOT / name]:
        if not parent.is_dir():
            continue
        children = sorted((p for p in parent.rglob("*") if p.is_dir()),
                          key=lambda p: -len(p.parts))
        for d in [*children, parent]:
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


@dataclass(frozen=True)
class BenchGecod:
    """A throw-away gecod with one spooled job (see the module docstring)."""

    pid: int
    key_file: Path
    public_socket: str  # anyone's
    root_socket: str  # the preload's
    job_dir: Path  # where clients work: a PE task dir of the job
    host: str
    ncpu: int
    cgroup_name: str  # the parent of the job's cgroups


@contextlib.contextmanager
def bench_gecod() -> Iterator[BenchGecod]:
    """Start gecod with its own configuration, cgroups and job; remove it all afterwards."""
    base = Path(tempfile.mkdtemp(prefix="geco-test-bench-"))
    base.chmod(0o755)
    name = f"geco-test-bench-{os.getpid()}"
    host = short_hostname()
    key_file = base / "key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    sock_path = str(base / "gecod.sock")
    job_dir = base / "spool" / host / "active_jobs" / f"{JOB}.{TASK}"
    job_dir.mkdir(parents=True)
    (job_dir / "environment").write_text(f"JOB_ID={JOB}\nSGE_TASK_ID=undefined\n")
    (job_dir / "config").write_text("job_owner=root\n")
    task_dir = job_dir / f"1.{host}"
    task_dir.mkdir()
    (task_dir / "environment").write_text(f"JOB_ID={JOB}\nSGE_TASK_ID=undefined\n")
    ncpu = len(os.sched_getaffinity(0))
    resourcefile.write(base / "state" / "resources", ResourceSet(
        JOB, TASK, owner="root", nodes=(NodeResources(host, slots=ncpu),)))
    config = base / "geco.toml"
    config.write_text(f'[paths]\nstate_dir = "{base / "state"}"\n'
                      f'execd_spool_dir = "{base / "spool"}"\n[cgroup]\nname = "{name}"\n'
                      f'[gecod]\nsocket = "path:{sock_path}"\nkey_file = "{key_file}"\n')
    root_path = str(base / "gecod-root.sock")
    log = open(base / "gecod.log", "wb")  # noqa: SIM115
    gecod = subprocess.Popen([sys.executable, "-m", "geco.daemon", "--config", str(config)],
                             cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 30
        while not (Path(sock_path).exists() and Path(root_path).exists()):
            if gecod.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench: gecod did not start:\n"
                                 + (base / "gecod.log").read_text())
            time.sleep(0.05)
        time.sleep(0.2)
        yield BenchGecod(gecod.pid, key_file, sock_path, root_path, task_dir, host, ncpu,
                         name)
    finally:
        gecod.send_signal(signal.SIGTERM)
        try:
            gecod.wait(30)
        except subprocess.TimeoutExpired:
            gecod.kill()
        log.close()
        _remove_cgroups(name)
        shutil.rmtree(base, ignore_errors=True)


def round_trip_figures(f: dict[str, float | str]) -> str:
    """p50, p99 and rate of a round of requests, as the table shows them."""
    return (f"p50 {f['p50_us']:.0f} us, p99 {f['p99_us']:.0f} us, "
            f"{f['rate_per_s']:,.0f} req/s ({f['requests']:,} requests)")


def move_targets(g: BenchGecod) -> list[Path]:
    """Every ``cgroup.procs`` of the job (one per hierarchy on v1, one on v2): a quarantine
    writes each of them."""
    key = f"{JOB}.{TASK}"
    found = sorted(CGROUP_ROOT.glob(f"*/{g.cgroup_name}/{key}/cgroup.procs")) or \
        sorted(CGROUP_ROOT.glob(f"{g.cgroup_name}/{key}/cgroup.procs"))
    if not found:
        raise SystemExit(f"bench_gecod: no cgroup of job {key} under {g.cgroup_name}")
    return found


def cgroup_procs(g: BenchGecod) -> Path:
    """The job's cgroup.procs in the cpuset hierarchy (v1; the one file on v2): the
    costliest move, since the kernel re-binds the task's CPUs."""
    for base in (CGROUP_ROOT / "cpuset", CGROUP_ROOT):
        path = base / g.cgroup_name / f"{JOB}.{TASK}" / "cgroup.procs"
        if path.exists():
            return path
    raise SystemExit(f"bench_gecod: no cgroup of job {JOB}.{TASK} under {g.cgroup_name}")


def idle_move_ms(procs: Path, runs: int = 10, gap: float = 0.2) -> float:
    """Median time of one ``cgroup.procs`` write ``gap`` s after the last one, ms.

    The kernel serializes moves with a lock whose first taker after a quiet spell
    waits for an RCU grace period; moves back to back (the floor above, a loaded
    gecod) skip that wait, a node's first job start after a quiet spell does not.
    """
    sleeper = subprocess.Popen(["sleep", "600"])
    times = []
    try:
        for _ in range(runs):
            time.sleep(gap)
            started = time.perf_counter()
            procs.write_text(str(sleeper.pid))
            times.append((time.perf_counter() - started) * 1000)
    finally:
        sleeper.kill()
        sleeper.wait()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--idle-seconds", type=float, default=60.0,
                        help="window for counting idle wake-ups (scaled to a minute)")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_gecod: run as root (gecod creates cgroups)", file=sys.stderr)
        return 2
    rows: list[tuple[str, str]] = []
    binary = qbench()
    with journald(), bench_gecod() as g:
        rss_start = _status_field(g.pid, "VmRSS")
        # the first request builds the job's cgroups; the rounds measure steady state
        round_trips(binary, g, 1, 1)
        one, many = (round_trips(binary, g, clients, args.requests) for clients in (1, 64))
        rss_after = _status_field(g.pid, "VmRSS")
        floor = run_qbench(binary, "floor-socket", "--requests", "2000")
        floor_many = run_qbench(binary, "floor-socket", "--clients", "64", "--requests",
                                str(args.requests))
        move = run_qbench(binary, "floor-cgroup", "--cgroup-procs", str(cgroup_procs(g)),
                          "--requests", "500")
        targets = move_targets(g)
        moves, again = (run_qbench(binary, mode, "--cgroup-procs", ",".join(map(str, targets)),
                                   "--requests", "500")
                        for mode in ("floor-cgroup", "floor-cgroup-again"))
        quiet_move = idle_move_ms(cgroup_procs(g))
        for clients, got in ((1, one), (64, many)):
            rows.append((f"JOB_STARTED round trip, {clients} client(s) (C, as the preload)",
                         round_trip_figures(got)))
        rows.append(("floor: bare Unix-socket round trip (same sizes, no work)",
                     round_trip_figures(floor)))
        rows.append(("floor: the same, 64 clients", round_trip_figures(floor_many)))
        rows.append(("floor: one cgroup.procs write (cpuset, a move)", round_trip_figures(move)))
        rows.append((f"floor: a quarantine's moves ({len(targets)} hierarchies; the kernel "
                     "serializes them)", round_trip_figures(moves)))
        rows.append(("floor: the same writes, the process already there (the round trips' "
                     "later requests)", round_trip_figures(again)))
        rows.append(("one cgroup.procs write 0.2 s after the last", f"p50 {quiet_move:.2f} ms"))
        rows.append(("the kernel's mode for moves, as mountinfo shows it",
                     "favordynmods" if favors_dynmods(parse_mountinfo(
                         Path("/proc/self/mountinfo").read_bytes())) else "its default"))
        # let the last replies settle and the load's journal window end (its summary is
        # the load's, not idling's)
        time.sleep(WINDOW + 1.0)
        before = _switches(g.pid)
        time.sleep(args.idle_seconds)
        after = _switches(g.pid)
        per_minute = (after - before) * 60.0 / args.idle_seconds
        rows.append(("gecod VmRSS after start-up", f"{rss_start / 1024:.1f} MiB"))
        rows.append(("gecod VmRSS after the load", f"{rss_after / 1024:.1f} MiB"))
        rows.append((f"idle wake-ups (ctxt switches, all threads, {args.idle_seconds:g} s"
                     " window)", f"{per_minute:.1f} per minute"))
        journaling = Path("/run/systemd/journal/socket").is_socket()
        rows.append(("journald receiving gecod's entries", "yes" if journaling else "no"))
    rtt = float(floor["p50_us"])
    write_rows(args.json, [
        Row("quarantine round trip, 1 client, p50", float(one["p50_us"]), "us", "<= 200",
            rtt, "bare Unix-socket round trip"),
        Row("quarantine round trip, 64 clients, p99", float(many["p99_us"]) / 1e3, "ms",
            "<= 10", float(floor_many["p99_us"]) / 1e3,
            "bare Unix-socket round trip, 64 clients, p99"),
        Row("quarantine requests per second, 64 clients", float(many["rate_per_s"]), "/s",
            ">= 10,000", float(floor_many["rate_per_s"]),
            "bare round trips per second, 64 clients"),
        Row("one cgroup.procs move (cpuset), p50", float(move["p50_us"]), "us"),
        Row(f"a quarantine's moves ({len(targets)} cgroup.procs writes), p50",
            float(moves["p50_us"]), "us"),
        # the kernel takes one move at a time (cgroup_threadgroup_rwsem): what it could do
        # in a second if it did nothing else (the run's own rate counts its moves back too)
        Row("a quarantine's moves per second, the kernel's ceiling (1 / their p50)",
            1e6 / float(moves["p50_us"]), "/s"),
        # the round trips above: a client's later requests find it in the job already, and
        # the kernel still takes its lock for each write
        Row(f"the same {len(targets)} writes, the process already there (the round trips' "
            "later requests), p50", float(again["p50_us"]), "us"),
        Row("those writes per second, the kernel's ceiling (1 / their p50)",
            1e6 / float(again["p50_us"]), "/s"),
        Row("one cgroup.procs move 0.2 s after the last (a quiet node's first job), p50",
            quiet_move, "ms"),
        Row("gecod RSS after start-up", rss_start / 1024, "MiB"),
        Row(f"gecod RSS after {int(many['requests']) + int(one['requests']):,} requests",
            rss_after / 1024, "MiB"),
        Row("gecod idle wake-ups", per_minute, "/min")])
    shutil.rmtree(binary.parent, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"gecod on {g.host}, {g.ncpu} cpus, Python {sys.version.split()[0]}")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
