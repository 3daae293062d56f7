"""Measure gecod: quarantine round trips under concurrency, memory, and idle wake-ups.

Run as root from the repo root:

    /opt/geco/venv/bin/python bench/bench_gecod.py [--requests 100] [--idle-seconds 60]

Starts gecod (``python -m geco.daemon``) with a throw-away configuration: its
own directory under /tmp, a fresh key, the cgroup parent ``geco-test-bench-<pid>``
(cgroup v1 or v2, as this machine has them) and one spooled 2-slot job with a
resource file, so no qstat is involved. Then:

* **round trip**: client *processes* whose cwd is a PE task dir of the job (as
  the shepherds of ``qrsh -inherit`` tasks: gecod ends a job when its master
  shepherd exits, and a client in the job's own dir would be taken for it) send
  JOB_STARTED for their own pid (the preload's request, on gecod's privileged
  socket as the preload does) and wait for the ACK,
  ``--requests`` times each, with 1 and with 64 clients at once. The first
  request of a client moves it into the job's cgroups; later ones find it there
  and move it again (the same kernel writes). Time = connect to verified ACK,
  measured in the client. gecod journals every success, as in production,
  when journald runs.
* **RSS**: ``VmRSS`` of gecod from ``/proc/<pid>/status``, after start-up and
  after the load.
* **idle wake-ups**: the sum over gecod's threads (``/proc/<pid>/task/*/status``)
  of ``voluntary_ctxt_switches + nonvoluntary_ctxt_switches`` across
  ``--idle-seconds`` with no client, scaled to one minute. No watchdog is set
  (systemd's ``WatchdogSec=30`` adds 4 wake-ups a minute).

Prints a table. Cleans up its cgroups, processes and files.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _common import REPO, percentile

from geco import protocol
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile

JOB, TASK = 77001, 1
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _client(key: bytes, sock_path: str, job_dir: str, requests: int, start: float,
            out: multiprocessing.queues.Queue[list[float] | str]) -> None:
    """One client process: JOB_STARTED for itself, ``requests`` times; report latencies."""
    os.chdir(job_dir)
    while time.time() < start:  # all clients begin together
        time.sleep(0.001)
    times: list[float] = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            frame = protocol.encode(protocol.MsgType.JOB_STARTED,
                                    protocol.JobStarted(JOB, TASK, os.getpid()), key)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(sock_path)
                s.sendall(frame)
                reply = protocol.read_frame(s, time.monotonic() + 30)
            ack = protocol.decode_ack(reply, key, frame[12:28])
            times.append(time.perf_counter() - t0)
            if ack.status is not protocol.AckStatus.OK:
                out.put(f"ACK {ack.status.name}")
                return
        out.put(times)
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def _round_trips(key: bytes, sock_path: str, job_dir: Path, clients: int,
                 requests: int) -> tuple[list[float], float]:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.queues.Queue[list[float] | str] = ctx.Queue()
    start = time.time() + 0.5 + clients * 0.01
    procs = [ctx.Process(target=_client, args=(key, sock_path, str(job_dir), requests, start,
                                                out)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    wall = time.time() - start
    for p in procs:
        p.join()
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise SystemExit(f"bench_gecod: {len(errors)} client(s) failed: {errors[0]}")
    return [t for r in results if isinstance(r, list) for t in r], wall


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
    key: bytes
    public_socket: str  # anyone's
    root_socket: str  # the preload's
    job_dir: Path  # where clients work: a PE task dir of the job
    host: str
    ncpu: int


@contextlib.contextmanager
def bench_gecod() -> Iterator[BenchGecod]:
    """Start gecod with its own configuration, cgroups and job; remove it all afterwards."""
    base = Path(tempfile.mkdtemp(prefix="geco-test-bench-"))
    base.chmod(0o755)
    name = f"geco-test-bench-{os.getpid()}"
    host = short_hostname()
    key = os.urandom(32)
    key_file = base / "key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key)
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
        yield BenchGecod(gecod.pid, key, sock_path, root_path, task_dir, host, ncpu)
    finally:
        gecod.send_signal(signal.SIGTERM)
        try:
            gecod.wait(30)
        except subprocess.TimeoutExpired:
            gecod.kill()
        log.close()
        _remove_cgroups(name)
        shutil.rmtree(base, ignore_errors=True)


def round_trip_figures(times: list[float], wall: float) -> str:
    """p50, p99 and rate of a round of requests, as the table shows them."""
    ms = [t * 1e3 for t in times]
    return (f"p50 {statistics.median(ms):.2f} ms, p99 {percentile(ms, 0.99):.2f} ms, "
            f"{len(ms) / wall:.0f} req/s ({len(ms)} requests)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per client")
    parser.add_argument("--idle-seconds", type=float, default=60.0,
                        help="window for counting idle wake-ups (scaled to a minute)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_gecod: run as root (gecod creates cgroups)", file=sys.stderr)
        return 2
    rows: list[tuple[str, str]] = []
    with bench_gecod() as g:
        rss_start = _status_field(g.pid, "VmRSS")
        # the first request builds the job's cgroups; the rounds measure steady state
        _round_trips(g.key, g.root_socket, g.job_dir, 1, 1)
        for clients in (1, 64):
            times, wall = _round_trips(g.key, g.root_socket, g.job_dir, clients, args.requests)
            rows.append((f"JOB_STARTED round trip, {clients} client(s)",
                         round_trip_figures(times, wall)))
        rss_after = _status_field(g.pid, "VmRSS")
        time.sleep(1.0)  # let the last replies and journal writes settle
        before = _switches(g.pid)
        time.sleep(args.idle_seconds)
        after = _switches(g.pid)
        per_minute = (after - before) * 60.0 / args.idle_seconds
        rows.append(("gecod VmRSS after start-up", f"{rss_start / 1024:.1f} MiB"))
        rows.append(("gecod VmRSS after the load", f"{rss_after / 1024:.1f} MiB"))
        rows.append((f"idle wake-ups (ctxt switches, all threads, {args.idle_seconds:g} s"
                     " window)", f"{per_minute:.1f} per minute"))
        journald = Path("/run/systemd/journal/socket").is_socket()
        rows.append(("journald receiving gecod's entries", "yes" if journald else "no"))
    width = max(len(r[0]) for r in rows)
    print(f"gecod on {g.host}, {g.ncpu} cpus, Python {sys.version.split()[0]}")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
