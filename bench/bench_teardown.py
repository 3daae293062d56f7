"""Teardown time of a job with 1,000 processes, on this host's cgroup v1.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_teardown [--runs 5] [--processes 1000]

Each run makes a job cgroup under ``geco-test-bench-<pid>`` and starts a small
Python forker inside it (moved in before it forks) that fills the job up to
``--processes`` members: itself, ``--busy`` children spinning on a cpu,
``--daemons`` double-forked ``setsid`` daemons (their parent gone, as a job's
leftovers are) and sleepers for the rest. When the kernel lists every one of
them in the job, the teardown is timed:

* ``release``: :func:`geco.job.teardown.release` (freeze, SIGKILL, thaw, wait
  until empty, remove), what the epilog has called so far;
* ``tear_down``: :func:`geco.job.teardown.tear_down`, the epilog's and reaper's
  teardown with accounting and the stuck-process report (when this checkout has
  it; queue disabling off, journal off).

Variants alternate run by run, so machine noise hits both alike. The backend is
a subclass that notes how long each of its public calls took (minus the timed
calls inside it), which splits a teardown into freeze, the SIGKILL sweep, thaw,
waiting until empty, removal and the ``cgroup.procs`` reads inside them, with no
change to the library. Prints median and max per phase, the processes each run
killed, and any run that left processes or cgroups behind.

This process is a child subreaper, so the job's orphans are its children and
their zombies are reaped here (after the timing; zombies are not in
``cgroup.procs`` and do not keep a v1 cgroup busy). Everything is removed
afterwards, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import select
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench._common import remove_test_cgroups, run_in_cgroups, sigterm_exits, v1_backend
from bench._table import Row, add_json_option, write_rows
from geco import log
from geco.cgroup import Hierarchy, Limits, V1Backend
from geco.config import Config
from geco.job import teardown

try:
    from geco.job.teardown import tear_down
except ImportError:  # a checkout older than geco/job/teardown.py: time release() alone
    HAVE_TEAR_DOWN = False
else:
    HAVE_TEAR_DOWN = True

T = TypeVar("T")
KEY = "1.1"
PR_SET_CHILD_SUBREAPER = 36
# The job: what runs in the cgroup. argv: total members, daemons, busy. Waits for
# one byte on stdin (sent once it is in the job's cgroup), forks, prints "ready".
FORKER = r"""
import os, signal, sys
total, daemons, busy = (int(a) for a in sys.argv[1:4])
if os.read(0, 1) != b"x":  # not moved into the job: fork nothing outside it
    sys.exit(1)
null = os.open(os.devnull, os.O_RDWR)

def child(kind):
    os.dup2(null, 0)
    os.dup2(null, 1)
    if kind == "daemon":
        os.setsid()
        if os.fork():
            os._exit(0)
    if kind == "busy":
        while True:
            pass
    while True:
        signal.pause()

kinds = ["daemon"] * daemons + ["busy"] * busy
kinds += ["sleep"] * (total - 1 - len(kinds))
for kind in kinds:
    pid = os.fork()
    if pid == 0:
        child(kind)
    if kind == "daemon":
        os.waitpid(pid, 0)
os.write(1, b"ready\n")
while True:
    signal.pause()
"""
PHASES = (("exists", "exists()"), ("usage", "usage (accounting)"), ("freeze", "freeze"),
          ("kill", "SIGKILL sweep (kill)"), ("kill_except", "SIGKILL sweep (kill_except)"),
          ("thaw", "thaw"), ("wait_empty", "wait until empty"), ("destroy", "remove cgroups"),
          ("pids", "cgroup.procs reads"))


class TimedV1Backend(V1Backend):
    """A V1Backend noting the time of each public teardown call, minus the timed calls inside.

    ``spent[name]`` sums to the time spent in the backend; ``calls[name]`` counts them.
    """

    def __init__(self, hierarchies: Mapping[str, Hierarchy], name: str = "GECO", *,
                 exclusive_cpus: bool = True, proc: Path = Path("/proc")) -> None:
        super().__init__(hierarchies, name, exclusive_cpus=exclusive_cpus, proc=proc)
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._stack: list[tuple[str, list[float]]] = []  # open calls, time inside timed ones

    def reset(self) -> None:
        """Forget what was noted so far."""
        self.spent.clear()
        self.calls.clear()

    def _timed(self, name: str, call: Callable[[], T]) -> T:
        # reads are noted per caller: which phase pays for them is the question
        if name == "pids" and self._stack:
            name = f"pids/{self._stack[-1][0]}"
        inner = [0.0]
        self._stack.append((name, inner))
        start = time.perf_counter()
        try:
            return call()
        finally:
            took = time.perf_counter() - start
            self._stack.pop()
            self.spent[name] += took - inner[0]
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][1][0] += took

    def freeze(self, key: str, timeout: float = 10.0) -> None:
        self._timed("freeze", functools.partial(super().freeze, key, timeout))

    def thaw(self, key: str, timeout: float = 10.0) -> None:
        self._timed("thaw", functools.partial(super().thaw, key, timeout))

    def kill(self, key: str) -> int:
        return self._timed("kill", functools.partial(super().kill, key))

    def kill_except(self, key: str, spare: Callable[[int], bool]) -> int:
        return self._timed("kill_except", functools.partial(super().kill_except, key, spare))

    def wait_empty(self, key: str, timeout: float, *, kill_late: bool = False) -> bool:
        return self._timed("wait_empty", functools.partial(super().wait_empty, key, timeout,
                                                           kill_late=kill_late))

    def destroy(self, key: str) -> None:
        self._timed("destroy", functools.partial(super().destroy, key))

    def usage(self, key: str) -> dict[str, int]:
        return self._timed("usage", functools.partial(super().usage, key))

    def pids(self, key: str) -> list[int]:
        return self._timed("pids", functools.partial(super().pids, key))

    def exists(self, key: str) -> bool:
        return self._timed("exists", functools.partial(super().exists, key))


@dataclass(frozen=True, slots=True)
class Run:
    """One timed teardown."""

    total: float                # seconds
    spent: dict[str, float]     # seconds per backend call, nested calls excluded
    calls: dict[str, int]
    killed: int
    left: tuple[int, ...]       # pids still in the job afterwards
    cgroups_left: bool


def start_job(backend: TimedV1Backend, members: int, daemons: int, busy: int) -> None:
    """Make the job cgroup and fill it with ``members`` processes; return when all are in.

    Raises
    ------
    SystemExit
        when the forker fails or the kernel does not list every member within 60 s.
    """
    backend.create(KEY, Limits())
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, "-I", "-S", "-c", FORKER, str(members), str(daemons), str(busy)]
    # its own session: Ctrl-C on the terminal reaches the bench, which cleans up
    pid = os.posix_spawn(sys.executable, argv, {"PATH": "/usr/bin:/bin"}, setsid=True,
                         file_actions=[(os.POSIX_SPAWN_DUP2, go_r, 0),
                                       (os.POSIX_SPAWN_DUP2, ready_w, 1)])
    os.close(go_r)
    os.close(ready_w)
    try:
        backend.add_pid(KEY, pid)
        os.write(go_w, b"x")
        if not select.select([ready_r], [], [], 60)[0] or os.read(ready_r, 16) != b"ready\n":
            raise SystemExit("bench_teardown: the forker did not report ready within 60 s")
    finally:
        os.close(go_w)
        os.close(ready_r)
    deadline = time.monotonic() + 60
    while (have := len(backend.pids(KEY))) < members:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_teardown: {have} of {members} processes in the job "
                             "after 60 s")
        time.sleep(0.01)


def reap_children() -> int:
    """Reap every child that has exited (the job's zombies); return how many."""
    reaped = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def timed_teardown(backend: TimedV1Backend, variant: str, cfg: Config) -> Run:
    """Tear the job down with ``variant`` and note what it took and what it left."""
    backend.reset()
    start = time.perf_counter()
    if variant == "release":
        released = teardown.release(KEY, backend, timeout=cfg.kill_timeout)
        killed = released.killed
    else:
        result = tear_down(KEY, backend, cfg, queue_instance=None, cleaned_by="bench")
        killed = result.killed
    total = time.perf_counter() - start
    spent, calls = dict(backend.spent), dict(backend.calls)
    cgroups_left = backend.exists(KEY)
    left = tuple(backend.pids(KEY)) if cgroups_left else ()
    return Run(total, spent, calls, killed, left, cgroups_left)


def ms(seconds: list[float]) -> str:
    values = [s * 1e3 for s in seconds]
    return f"{statistics.median(values):9.1f} {max(values):9.1f}"


def report(variant: str, runs: list[Run]) -> None:
    print(f"  {variant + '  (ms)':<34}median       max")
    print(f"    {'total':<30}{ms([r.total for r in runs])}")
    # each phase, then the cgroup.procs reads it made (not counted in its own row)
    rows = [row for name, label in PHASES
            for row in ((name, label), (f"pids/{name}", "  its cgroup.procs reads"))]
    for name, label in rows:
        if any(name in r.calls for r in runs):
            calls = statistics.median([r.calls.get(name, 0) for r in runs])
            print(f"    {label:<30}{ms([r.spent.get(name, 0.0) for r in runs])}"
                  f"   ({calls:g} calls)")
    other = [r.total - sum(r.spent.values()) for r in runs]
    print(f"    {'outside the backend':<30}{ms(other)}")
    # where the thaw ends and the wait begins is chance: the killed die during both
    dying = [sum(r.spent.get(n, 0.0) for n in ("thaw", "wait_empty", "pids/wait_empty"))
             for r in runs]
    print(f"    {'= thaw + wait, reads incl.':<30}{ms(dying)}")
    print(f"    processes killed per run: {' '.join(str(r.killed) for r in runs)}")
    bad = [(i, r) for i, r in enumerate(runs, 1) if r.left or r.cgroups_left]
    if not bad:
        print("    left behind: nothing (every run emptied and removed the job's cgroups)")
    for i, r in bad:
        print(f"    LEFT BEHIND in run {i}: {len(r.left)} process(es)"
              f"{' ' + ' '.join(map(str, r.left[:10])) if r.left else ''}"
              f"{', its cgroups' if r.cgroups_left else ''}")


def measure(backend: TimedV1Backend, args: argparse.Namespace,
            results: dict[str, list[Run]], reads: list[float]) -> None:
    """``args.runs`` teardowns per variant, alternating; note each and the pids() reads."""
    with tempfile.TemporaryDirectory(prefix="geco-bench-teardown-") as state:
        cfg = Config()._replace(cgroup_name=backend.name, state_dir=Path(state),
                      trace_dir=Path(state) / "trace", kill_timeout=30.0,
                      disable_queue_on_stuck=False)
        for _ in range(args.runs):
            for variant, runs in results.items():
                start_job(backend, args.processes, args.daemons, args.busy)
                backend.reset()
                for _ in range(3):
                    backend.pids(KEY)
                reads.append(backend.spent["pids"] / 3)
                runs.append(timed_teardown(backend, variant, cfg))
                reap_children()
                if backend.exists(KEY):  # a run that left something: start clean
                    remove_test_cgroups(backend)
                    backend.ensure_root()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="teardowns per variant")
    parser.add_argument("--processes", type=int, default=1000,
                        help="members of the job, its forker included")
    parser.add_argument("--daemons", type=int, default=10,
                        help="double-forked setsid daemons among them")
    parser.add_argument("--busy", type=int, default=2, help="cpu-bound ones among them")
    add_json_option(parser)
    args = parser.parse_args()
    if args.processes < 1 + args.daemons + args.busy:
        parser.error("--processes must leave room for the forker, --daemons and --busy")
    if os.geteuid() != 0:
        print("bench_teardown: run as root (it makes cgroups)", file=sys.stderr)
        return 1
    # the teardown's journal records would only add noise here
    log.setup("quiet", journal=False)
    sigterm_exits()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"bench_teardown: cannot become a child subreaper: "
              f"{os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    variants = ["release", "tear_down"] if HAVE_TEAR_DOWN else ["release"]
    results: dict[str, list[Run]] = {v: [] for v in variants}
    reads: list[float] = []
    backend = v1_backend(f"geco-test-bench-{os.getpid()}", TimedV1Backend)
    code = run_in_cgroups("bench_teardown", backend,
                          lambda: measure(backend, args, results, reads))
    reap_children()
    if code:
        return code
    print(f"teardown of a job with {args.processes} processes ({args.busy} busy, "
          f"{args.daemons} daemonized by double fork, the rest sleeping) on Linux "
          f"{os.uname().release}, cgroup v1 ({', '.join(backend.controllers)}), "
          f"{os.cpu_count()} cpus, Python {sys.version.split()[0]}; {args.runs} runs each")
    print(f"  one cgroup.procs read of the full job (pids(), every controller): "
          f"median {statistics.median(reads) * 1e3:.1f} ms")
    for variant in variants:
        report(variant, results[variant])
    write_rows(args.json, [
        Row(f"teardown ({v}) of a job with {args.processes:,} processes, p50",
            statistics.median(r.total for r in results[v]) * 1e3, "ms") for v in variants])
    if not HAVE_TEAR_DOWN:
        print("  tear_down: not timed (this checkout has no geco/job/teardown.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
