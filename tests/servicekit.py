"""The services tests and benches share: commands run clean, journald, the test user.

Plain helpers, no fixtures: ``tests/conftest.py`` builds its session fixtures (``journal``,
``job_owner``, ``sge``) on them, and bench/ uses them directly. A service one of several
overlapping sessions (or a bench) started is stopped only by its last user: each holds a
shared lock on ``/run/lock/geco-test-<name>.users`` (:func:`shared_use`) and stops the
service only when it can make that lock exclusive (:func:`sole_user`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SGE_SETUP = REPO / "integration" / "sge" / "setup.sh"
SGE_TEARDOWN = REPO / "integration" / "sge" / "teardown.sh"
LIBEXEC = Path("/usr/libexec/geco")
JOURNALD = Path("/lib/systemd/systemd-journald")
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
SGE_SPOOL = Path("/var/spool/gridengine")
SGE_CELL_COMMON = Path("/var/lib/gridengine/default/common")
LOCK_DIR = Path("/run/lock")
SGE_ENV_SH = REPO / "integration" / "sge" / "env.sh"


def sge_env(path: str) -> dict[str, str]:
    """integration/sge/env.sh's environment on ``path``: Grid Engine's, as a site's
    settings.sh gives it to its users, its own clients first in PATH (not Debian's
    wrappers, which run ~45 processes a call to find the architecture)."""
    out = subprocess.run(["bash", "-c", f'. "{SGE_ENV_SH}" && env -0'], env={"PATH": path},
                         capture_output=True, check=True).stdout.decode()
    return {k: v for k, _, v in (item.partition("=") for item in out.split("\0") if item)
            if k == "PATH" or k.startswith("SGE_")}


# What every child gets instead of pytest's environment (pyenv shims, PYTHONPATH, ...):
# the system's PATH and Grid Engine's environment (SGE_ENV).
SGE_ENV = sge_env("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
CLEAN_ENV = {**SGE_ENV, "LANG": "C.UTF-8"}
# Between two looks at Grid Engine while a test waits for it: a look forks its clients
# (qstat, qacct). In the QEMU guests (run-in-vm sets RUNINVM=1) a fork and exec costs ~55 ms
# of the emulated CPU and a qstat ~0.5 s, so five looks a second would keep a CPU busy
# beside the job waited for.
POLL = 1.0 if os.environ.get("RUNINVM") == "1" else 0.2

HOOK_LINES = {
    "prolog": "root@/usr/libexec/geco/prolog $job_id $ja_task_id",
    "epilog": "root@/usr/libexec/geco/epilog $job_id $ja_task_id",
    "starter": "/usr/libexec/geco/starter",
}


def run(argv: list[str], *, timeout: float = 60.0, check: bool = True,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command with a clean environment; on failure raise with its whole output.

    Parameters
    ----------
    argv: the command.
    timeout: seconds before it is killed (subprocess.TimeoutExpired).
    check: raise RuntimeError when it exits non-zero.
    **kwargs: passed to subprocess.run (cwd, env, input, ...).

    Returns
    -------
    The completed process, stdout and stderr as text.
    """
    kwargs.setdefault("env", CLEAN_ENV)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}\n"
                           f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}")
    return proc


# ---------------------------------------------------------------------------
# shared use of a service started by one of several overlapping sessions
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def shared_use(name: str) -> Iterator[IO[bytes]]:
    """Hold a shared lock saying "this session uses <name>" for the with-block."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"geco-test-{name}.users", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield lock


def sole_user(lock: IO[bytes]) -> bool:
    """True when no other session holds *lock* (converts our shared lock to exclusive)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def journald_alive(path: Path = JOURNAL_SOCKET) -> bool:
    """True when something receives datagrams on *path* (a stale socket file refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


@dataclass
class Journal:
    """A running journald, and the entries it got during this session."""

    socket: Path
    pid: int | None  # journald started by this session, None when it was running already
    since: float = field(default_factory=time.time)

    def sync(self) -> None:
        """Make journald write out everything it received so far (journalctl --sync)."""
        run(["journalctl", "--sync"], timeout=30)

    def entries(self, since: float | None = None, /, **match: str | int) -> list[dict[str, Any]]:
        """Return the journal entries that match every field, oldest first.

        Parameters
        ----------
        since: epoch seconds; default: the start of this session (0 = everything kept).
        **match: journal fields, e.g. ``JOB_ID="42"``, ``GECO_EVENT="cgroup-created"``.

        Returns
        -------
        journalctl's JSON objects (values are str; repeated fields are lists).
        """
        self.sync()
        start = self.since if since is None else since
        argv = ["journalctl", "-o", "json", "--no-pager", "--since", f"@{max(start - 1, 0):.0f}"]
        argv += [f"{key}={value}" for key, value in match.items()]
        out = run(argv, timeout=30).stdout
        found = [json.loads(line) for line in out.splitlines() if line.strip()]
        # --since takes whole seconds: what the previous test logged just before is not ours
        return [e for e in found if int(e["__REALTIME_TIMESTAMP"]) >= start * 1_000_000]

    def wait_for(self, timeout: float = 10.0, **match: str | int) -> list[dict[str, Any]]:
        """Like :meth:`entries`, but wait until there is at least one (hooks log asynchronously).

        Raises
        ------
        TimeoutError: nothing matched within *timeout* seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.entries(**match)
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no journal entry with {match} within {timeout} s")
            time.sleep(0.2)


def start_journald() -> subprocess.Popen[bytes]:
    """Start systemd-journald without systemd as PID 1 and wait for its socket."""
    if not JOURNALD.exists():
        pytest.fail(f"{JOURNALD} missing: run scripts/install.sh (Debian package systemd)")
    log = open(tempfile.gettempdir() + "/geco-test-journald.log", "ab")  # noqa: SIM115
    # Same hygiene as the Grid Engine daemons: clean environment, own session, cwd /.
    proc = subprocess.Popen([str(JOURNALD)], env=CLEAN_ENV, cwd="/", stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 15
    while not journald_alive():
        if proc.poll() is not None:
            pytest.fail(f"systemd-journald exited {proc.returncode} at start; see {log.name}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"systemd-journald did not open {JOURNAL_SOCKET} within 15 s")
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class JobOwner:
    """An unprivileged user who submits jobs."""

    name: str
    uid: int
    gid: int
    home: Path

    def make_dir(self, prefix: str = "job") -> Path:
        """Create a fresh directory the user owns, under ``~/geco-tests/``, and return it."""
        base = self.home / "geco-tests"
        base.mkdir(mode=0o755, exist_ok=True)
        os.chown(base, self.uid, self.gid)
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=base))
        os.chown(path, self.uid, self.gid)
        path.chmod(0o755)
        return path


def ensure_user(name: str) -> JobOwner:
    """Create *name* (uid >= 1000, home dir, bash) unless it exists; return its ids."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        proc = run(["useradd", "-m", "-K", "UID_MIN=1000", "-K", "GID_MIN=1000",
                    "-s", "/bin/bash", name], check=False)
        # 9 = name in use: another session created it meanwhile, which is fine
        if proc.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name} exited {proc.returncode}: {proc.stderr}") from None
        pw = pwd.getpwnam(name)
    if pw.pw_uid < 1000:
        pytest.fail(f"user {name} has uid {pw.pw_uid}: Grid Engine refuses jobs of uids < 1000")
    return JobOwner(pw.pw_name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))
