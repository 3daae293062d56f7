"""A clean slate for a test session: undo what demo.sh or an interrupted run left behind.

tests/conftest.py runs :func:`clean_slate` at session start when no other geco test
session runs on this machine. Each step acts only on what a test or the demo makes:

1. a ``geco daemon`` serving the site socket ``/run/geco/gecod.sock`` (the demo's,
   or a test's whose session was killed): found by the kernel's word on who listens
   there (``SO_PEERCRED``), stopped with SIGTERM (SIGKILL after 20 s). The tests start
   their own gecod there and would otherwise talk to this one. Not the node's own
   gecod.service under systemd (the VM tests use that one);
2. ``/etc/geco/geco.toml`` left rewritten: :func:`site_config_rewritten`, through
   which every test rewrites it, keeps the original in ``geco.toml.geco-test-saved``
   until it has put it back; a backup still there is put back here;
3. with Grid Engine running: the jobs of the test user (``qdel -f``), then the queues
   the tests add (named ``geco-test-*``);
4. job cgroups (``<mount>/<controller>/GECO/<job>.<task>``) of jobs that no longer
   run: one round of gecod's own reaper decides (execd spool, then qstat; a failing
   qstat keeps them) and tears them down. A frozen ``geco-test-*`` sub-cgroup (a
   test's unkillable process) is thawed first, else teardown would leave it;
5. the cgroup parents a test makes, ``<mount>/geco-test-<pid>[-<n>]`` in any hierarchy
   (named after its session's pid), of a session that is gone: one killed outright
   never ran its own clean-up. What is in them is killed, then they are removed
   (:func:`cgroup_testkit.raw_cleanup`); a live session's are not looked into.

What was done comes back as phrases for one line of pytest's output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geco.config import Config

SITE_SOCKET = Path("/run/geco/gecod.sock")
SITE_CONFIG = Path("/etc/geco/geco.toml")
SITE_CONFIG_SAVED = SITE_CONFIG.with_name(SITE_CONFIG.name + ".geco-test-saved")
TEST_USER = "gecotest"
TEST_PREFIX = "geco-test-"  # queues and sub-cgroups the tests make are named so
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Rounds "every second": the reaper judges only cgroups older than two rounds.
REAPER_INTERVAL = 1.0
# a test's cgroup parent, named after its session's pid (cgroup_testkit.fresh_name)
SESSION_CGROUP = re.compile(r"geco-test-(\d+)(-.*)?")


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _run(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str] | None:
    """Run a command with a clean environment; None when it cannot be run or hangs."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=CLEAN_ENV, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` at once: a hook reading it never sees half a file."""
    tmp = path.with_name(f".{path.name}.geco-test-tmp")
    tmp.write_bytes(data)
    with contextlib.suppress(FileNotFoundError):
        os.chmod(tmp, path.stat().st_mode & 0o7777)
    tmp.replace(path)


# ---------------------------------------------------------------------------
# the site configuration
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def site_config_rewritten(edit: Callable[[str], str]) -> Iterator[None]:
    """``/etc/geco/geco.toml`` as ``edit(its text)`` for the with-block, then put back
    byte for byte. The original is kept in ``geco.toml.geco-test-saved`` meanwhile, so
    that a session killed inside the block is undone by the next one's clean slate (a
    backup that is already there -- a nested block -- is kept as it is)."""
    saved = SITE_CONFIG.read_bytes() if SITE_CONFIG.exists() else None
    backup = saved is not None and not SITE_CONFIG_SAVED.exists()
    if backup and saved is not None:
        _write_atomically(SITE_CONFIG_SAVED, saved)
    try:
        SITE_CONFIG.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(SITE_CONFIG, edit("" if saved is None else saved.decode()).encode())
        yield
    finally:
        if saved is None:
            SITE_CONFIG.unlink(missing_ok=True)
        else:
            _write_atomically(SITE_CONFIG, saved)
        if backup:
            SITE_CONFIG_SAVED.unlink(missing_ok=True)


def restore_site_config() -> list[str]:
    """Put the backup of an interrupted :func:`site_config_rewritten` back."""
    try:
        saved = SITE_CONFIG_SAVED.read_bytes()
    except FileNotFoundError:
        return []
    done = []
    if not SITE_CONFIG.exists() or SITE_CONFIG.read_bytes() != saved:
        _write_atomically(SITE_CONFIG, saved)
        done.append(f"restored {SITE_CONFIG}")
    SITE_CONFIG_SAVED.unlink()
    return done


# ---------------------------------------------------------------------------
# a gecod left serving the site socket
# ---------------------------------------------------------------------------

def listener_pid(path: Path = SITE_SOCKET) -> int | None:
    """The pid of the process listening on the Unix socket ``path`` (SO_PEERCRED of a
    connection to it: the credentials the listener had at listen()), None if none does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(str(path))
        except OSError:
            return None
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    if pid and not alive(pid):  # it listened, then handed the socket over (geco handover)
        return _holder(path)
    return pid or None


def _holder(path: Path) -> int | None:
    """A live process holding the Unix socket bound to ``path`` open."""
    inodes = {f"socket:[{cols[6]}]" for cols in map(str.split, Path("/proc/net/unix")
                                                     .read_text().splitlines()[1:])
              if len(cols) == 8 and cols[7] == str(path)}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
    return None


def is_geco_daemon(pid: int) -> bool:
    """True when ``pid`` runs ``geco daemon`` (``python .../geco daemon``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(Path(os.fsdecode(arg)).name == "geco" and argv[i + 1:i + 2] == [b"daemon"]
               for i, arg in enumerate(argv))


def alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (its parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or before the read
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def _gone_within(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_process(pid: int, grace: float = 20.0) -> bool:
    """SIGTERM, SIGKILL after ``grace`` seconds; True once it is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        if _gone_within(pid, wait):
            return True
    return False


def is_gecod_service(pid: int) -> bool:
    """True when ``pid`` is the node's gecod, run by systemd as gecod.service (what
    scripts/install.sh sets up on a systemd node): not a leftover, whoever started it."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.endswith("/gecod.service") for line in lines)


def stop_leftover_gecod(path: Path = SITE_SOCKET) -> list[str]:
    """Stop a ``geco daemon`` serving ``path``; leave any other listener alone, and the
    node's gecod.service."""
    pid = listener_pid(path)
    if pid is None or is_gecod_service(pid):
        return []
    if not is_geco_daemon(pid):
        return [f"left pid {pid} serving {path} alone: it is not a `geco daemon` (tests that "
                "start gecod will fail)"]
    if stop_process(pid):
        return [f"stopped gecod pid {pid} left serving {path} (by demo.sh or an interrupted "
                "run)"]
    return [f"could not stop gecod pid {pid} serving {path}"]


# ---------------------------------------------------------------------------
# Grid Engine: leftover jobs and queues
# ---------------------------------------------------------------------------

def _jobs_of(user: str) -> set[int] | None:
    """Job ids ``qstat -u <user>`` lists (any state); None when qstat does not answer."""
    proc = _run(["qstat", "-u", user], timeout=30)
    if proc is None or proc.returncode != 0:
        return None
    return {int(cols[0]) for cols in map(str.split, proc.stdout.splitlines())
            if cols and cols[0].isdigit()}


def _execd_running(spool: Path) -> bool:
    """True when an sge_execd of this machine runs (per its pid file in the spool)."""
    for pidfile in spool.glob("*/execd.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sge_execd":
                return True
    return False


def _in_execd_spool(jobs: set[int], spool: Path) -> bool:
    """True while a running sge_execd still has one of the jobs (it removes it after the
    epilog; a stopped one finishes them when it is started again)."""
    return (any(any(spool.glob(f"*/active_jobs/{job}.*")) for job in jobs)
            and _execd_running(spool))


def delete_leftover_jobs(user: str = TEST_USER, timeout: float = 60.0) -> list[str]:
    """``qdel -f`` every job of ``user`` and wait until Grid Engine and sge_execd are done
    with them. Nothing when qstat does not answer (no Grid Engine running)."""
    jobs = _jobs_of(user)
    if not jobs:
        return []
    _run(["qdel", "-f", "-u", user])
    spool = _site_config().execd_spool_dir
    deadline = time.monotonic() + timeout
    while (left := _jobs_of(user)) or _in_execd_spool(jobs, spool):
        if time.monotonic() > deadline:
            return [f"{plural(len(jobs), 'leftover job')} of {user} deleted, but "
                    f"{' '.join(map(str, sorted(left or jobs)))} still there after {timeout:g} s"]
        time.sleep(0.3)
    return [f"deleted {plural(len(jobs), 'leftover job')} of {user} "
            f"({' '.join(map(str, sorted(jobs)))})"]


def delete_test_queues() -> list[str]:
    """Delete the cluster queues named ``geco-test-*`` (the tests add and delete them)."""
    proc = _run(["qconf", "-sql"], timeout=30)
    if proc is None or proc.returncode != 0:
        return []
    done = []
    for queue in proc.stdout.split():
        if queue.startswith(TEST_PREFIX):
            result = _run(["qconf", "-dq", queue])
            ok = result is not None and result.returncode == 0
            done.append(f"removed the leftover queue {queue}" if ok else
                        f"could not remove the leftover queue {queue}")
    return done


# ---------------------------------------------------------------------------
# stale job cgroups: one round of gecod's reaper
# ---------------------------------------------------------------------------

def _site_config() -> Config:
    """The site configuration; its defaults when it is unusable."""
    from geco import config  # here: conftest's services need no geco
    from geco.errors import GecoError

    try:
        return config.load(SITE_CONFIG)
    except GecoError:
        return config.Config()


class _NoLoop:
    """The runloop of a reaper that only runs one round by hand: no timer, no callback."""

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> Any:
        raise AssertionError("a reaper round run by hand arms no timer")

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        raise AssertionError("a reaper without on_reaped hands nothing back")


@contextlib.contextmanager
def _geco_logs_silenced() -> Iterator[None]:
    """The reaper and teardown log every step: the one line of the report says it all."""
    logger = logging.getLogger("geco")
    saved = (logger.handlers[:], logger.propagate)
    logger.handlers[:] = [logging.NullHandler()]
    logger.propagate = False
    try:
        yield
    finally:
        logger.handlers[:], logger.propagate = saved


def _thaw_test_freezers(freezers: list[Path]) -> None:
    """Thaw the frozen ``geco-test-*`` sub-cgroups of these job freezer cgroups."""
    for job in freezers:
        for sub in job.glob(f"{TEST_PREFIX}*"):
            state = sub / "freezer.state"
            with contextlib.suppress(OSError):
                if state.read_text().strip() != "THAWED":
                    state.write_text("THAWED")


def remove_stale_cgroups() -> list[str]:
    """Tear down the job cgroups of jobs that no longer run, as gecod's reaper would."""
    from geco import cgroup
    from geco.daemon.reaper import Reaper, Verdict
    from geco.errors import GecoError

    site = _site_config()
    try:
        backend = cgroup.for_config(site)
        keys = backend.job_keys()
    except GecoError:
        return []  # no cgroups geco could use here, so none it left
    if not keys:
        return []
    # the reaper's round, without what only a long-running gecod should do
    cfg = site._replace(gecod_reaper_interval=REAPER_INTERVAL,
                              gecod_walltime_backstop=False, trace_keep_days=0,
                              disable_queue_on_stuck=False, kill_timeout=10.0,
                              qstat_retries=0)
    _thaw_test_freezers([p for key in keys if (p := backend.paths(key).get("freezer"))])
    with _geco_logs_silenced(), ThreadPoolExecutor(max_workers=1) as unused:
        report = Reaper(_NoLoop(), backend, cfg, unused).run_round()
    done = []
    if report.reaped:
        done.append(f"removed {plural(len(report.reaped), 'stale job cgroup')} "
                    f"({' '.join(report.reaped)})")
    if report.stuck:
        done.append(f"kept {plural(len(report.stuck), 'stale job cgroup')} whose processes "
                    f"cannot be killed ({' '.join(report.stuck)})")
    unknown = report.keys(Verdict.UNKNOWN)
    if unknown:
        done.append(f"kept {plural(len(unknown), 'job cgroup')} ({' '.join(unknown)}): "
                    f"qstat failed: {report.qstat_error}")
    return done


def remove_orphaned_test_cgroups() -> list[str]:
    """Remove the test cgroup parents of sessions that are gone (step 5 of the docstring)."""
    from tests.cgroup_testkit import cgroup_mounts, raw_cleanup

    tops = []
    for mount in cgroup_mounts():
        with contextlib.suppress(OSError), os.scandir(mount) as entries:
            tops += [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)
                     and (m := SESSION_CGROUP.fullmatch(e.name)) and not alive(int(m[1]))]
    if not tops:
        return []
    names = sorted({top.name for top in tops})
    left = raw_cleanup(tops)
    done = [f"removed {plural(len(names), 'test cgroup parent')} of sessions that are gone "
            f"({' '.join(names)})"]
    if left:
        done.append(f"could not remove {'; '.join(left)}")
    return done


# ---------------------------------------------------------------------------

def clean_slate() -> list[str]:
    """Undo what demo.sh or an interrupted session left (see the module docstring).

    Returns
    -------
    What was done, as phrases for one line (empty when there was nothing to do).
    """
    done = stop_leftover_gecod()
    done += restore_site_config()
    done += delete_leftover_jobs()
    done += delete_test_queues()
    done += remove_stale_cgroups()
    done += remove_orphaned_test_cgroups()
    return done


def report_line(done: list[str]) -> str:
    """The one line pytest prints: ``geco tests: <phrase>; <phrase>``."""
    return f"geco tests: {'; '.join(done)}" if done else ""
