"""What several bench scripts share: test cgroups, journald, percentiles.

A bench script runs as a module of the package ``bench`` from the repo root
(``python -m bench.bench_x``, as ``bench/run`` starts each), so ``geco`` and the
test kits under ``tests/`` import from the checkout, not from an installed copy.

Cgroups are made the way the system tests make theirs: a ``geco-test-bench-*``
parent in every v1 hierarchy (inside an idle cpu_exclusive GECO cpuset when one
holds the cpus, see ``tests/cgroup_testkit.py``), removed afterwards with plain
syscalls (thaw, SIGKILL, rmdir), so a bench that is interrupted or that finds a
bug in the backend leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent

from geco.cgroup import V1Backend, find_hierarchies, parse_mountinfo  # noqa: E402
from geco.errors import GecoError  # noqa: E402
from tests.cgroup_testkit import raw_cleanup, usable_v1_hierarchies  # noqa: E402

__all__ = ["REPO", "gecod", "journald", "median_time", "percentile", "remove_test_cgroups",
           "run_in_cgroups", "sigterm_exits", "v1_backend"]

CGROUP_MOUNT = Path("/sys/fs/cgroup")
B = TypeVar("B", bound=V1Backend)


def median_time(runs: int, work: Callable[[], object]) -> float:
    """The median of ``runs`` timings of ``work()``, in seconds."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank ``p`` quantile (0..1) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]


def v1_backend(name: str, cls: type[B]) -> B:
    """A cgroup v1 backend (of class ``cls``) for a test parent ``name`` in every hierarchy.

    Use it through :func:`run_in_cgroups`, which makes the parent and removes it.

    Parameters
    ----------
    name: the parent's directory name; must start with ``geco-test-``.
    cls: :class:`V1Backend` or a subclass of it (built with non-exclusive cpus,
        so the parent coexists with any other cpuset).

    Raises
    ------
    SystemExit
        with the reason when this host cannot hold test cgroups (no v1 cpuset and
        memory, or its cpus are held by a busy cpu_exclusive cpuset).
    GecoError
        when the name is not one directory name.
    """
    if not name.startswith("geco-test-"):
        raise ValueError(f"a bench cgroup name must start with geco-test-, got {name!r}")
    mounted = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                               CGROUP_MOUNT)
    hierarchies, why_not = usable_v1_hierarchies(mounted)
    if why_not:
        raise SystemExit(f"{Path(sys.argv[0]).name}: cannot make test cgroups here: {why_not}")
    return cls(hierarchies, name, exclusive_cpus=False)


def remove_test_cgroups(backend: V1Backend) -> None:
    """Kill whatever is left in the backend's parent (thawing it first) and remove it all;
    say on stderr what could not be removed."""
    for what in raw_cleanup(backend.parent_paths().values()):
        print(f"cannot remove a test cgroup: {what}", file=sys.stderr)


def run_in_cgroups(prog: str, backend: V1Backend, body: Callable[[], None]) -> int:
    """Make the backend's parent, run ``body``, and remove every cgroup and process it left.

    Returns
    -------
    The exit code: 0, 1 after a GecoError (printed), 130 after Ctrl-C.
    """
    try:
        backend.ensure_root()
        body()
    except GecoError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; removing its cgroups and processes", file=sys.stderr)
        return 130
    finally:
        remove_test_cgroups(backend)
    return 0


def sigterm_exits() -> None:
    """Make SIGTERM raise SystemExit, so ``finally`` clean-ups run as they do on Ctrl-C."""
    def _exit(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


@contextlib.contextmanager
def journald() -> Iterator[None]:
    """A running journald for the block, shared with test sessions as the fixture shares it.

    Uses the one that runs; otherwise starts ``systemd-journald`` by hand (no systemd
    as PID 1 needed) and stops it afterwards unless a test session started using it
    meanwhile (the same lock as the ``journal`` fixture in ``tests/conftest.py``).
    """
    # imported here: servicekit pulls in pytest, which only the journal benches need
    from tests import servicekit as harness

    with harness.shared_use("journald") as lock:
        run_dir_existed = harness.JOURNAL_SOCKET.parent.exists()
        started = None if harness.journald_alive() else harness.start_journald()
        try:
            yield
        finally:
            if started is not None and harness.sole_user(lock):
                harness.stop(started)
                # its socket files outlive it and would look like a journal refusing all
                if not run_dir_existed:
                    shutil.rmtree(harness.JOURNAL_SOCKET.parent, ignore_errors=True)


@contextlib.contextmanager
def gecod() -> Iterator[None]:
    """The installed gecod serving the site configuration for the block (started here,
    ended by its pid afterwards); SystemExit when another one serves already."""
    proc = subprocess.Popen(["/usr/bin/geco", "daemon"], cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise SystemExit("gecod exited at start (another one serving?)")
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                s.connect("/run/geco/gecod.sock")
                break
            if time.monotonic() > deadline:
                raise SystemExit("gecod did not start serving within 30 s")
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(30)
