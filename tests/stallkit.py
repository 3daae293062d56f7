"""A hostile user's ways to stall a node, as the stall tests and ``bench/bench_stall.py`` run them.

Each attack is a context manager that starts the attack in processes of the
attacker's (dropped to their uid, some in an emulated host's network namespace),
keeps it up until the with-block ends, and stops those processes by their pid.
What an attack did is counted, as it happens, in the ``Counter`` it yields (so a
test can wait for what it needs to see; complete once the block ended):

* :func:`ssh_logins`: ssh logins to a node as the attacker, back to back, from
  several processes (each login's callerid lookup walks the attacker's job);
* :func:`tcp_idle`: connections held open to a TCP port without a byte sent,
  re-opened as they are closed (the cluster port);
* :func:`tcp_garbage`: frames that look like the cluster channel's, naming a job
  the attacker chooses, MAC'd with a key the attacker made up.

:data:`HOG_JOB` is the job script of an attacker's job that replaces its stderr
file with a FIFO nobody reads, holds many dup'd fds in one process, and has a
child killed for its memory every few hundred milliseconds.

:func:`attack_until` keeps an attack up for at least a test's floor and until what the
test asserts about it was shown, within :data:`ATTACK_AT_MOST`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

from tests.cleanslate import stop_process

__all__ = [
    "ALLOCATE",
    "ATTACKER",
    "ATTACK_AT_MOST",
    "GOAL_MS",
    "HOG_JOB",
    "attack_until",
    "fds_held",
    "geco_ms",
    "goal_ms",
    "ssh_logins",
    "tcp_garbage",
    "tcp_idle",
    "unfifo",
    "wait_for_file",
]

ATTACKER = "gecotest-evil"
PYTHON = "/opt/geco-dev/venv/bin/python"

# A process that asks the kernel to pick it first for an OOM kill (any process may raise
# its own oom_score_adj), then grows past its job's limit: the kill always takes it, never
# the job's shell or Grid Engine's processes.
ALLOCATE = ("open('/proc/self/oom_score_adj', 'w').write('1000'); "
            "b = bytearray(800 << 20)")

# The attacker's job: its .e file becomes a FIFO nobody reads (every OOM report geco
# appends to it would wait on it), its processes hold {fds} dup'd fds between them, as
# many processes as their fd limit asks (every callerid lookup of the attacker's logins
# walks them), and a child is killed for its memory every few hundred ms (-l m_mem_free
# well below 800M). It writes "fds-held" with the count once they are held.
HOG_JOB = """#!/bin/bash
err="$SGE_STDERR_PATH"
exec 2>/dev/null
rm -f "$err" && mkfifo "$err"
/usr/bin/python3 -c '
import os, resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
each = min(hard, 1 << 20) - 64
resource.setrlimit(resource.RLIMIT_NOFILE, (each + 64, hard))
total = 0
while total < {fds}:
    n = min(each, {fds} - total)
    if os.fork() == 0:
        held = [os.dup(0) for _ in range(n)]
        open(f"fds-held.{{os.getpid()}}", "w").write(str(len(held)))
        time.sleep(100000)
    total += n
' &
touch hog-up
while :; do /usr/bin/python3 -c "{ALLOCATE}"; sleep 0.3; done
"""


def _as(user: str, argv: Sequence[str], netns: str = "") -> list[str]:
    """``argv`` as ``user`` (and in network namespace ``netns``)."""
    run = ["runuser", "-u", user, "--", *argv]
    return ["nsenter", f"--net=/run/netns/{netns}", *run] if netns else run


def _add_up(out: IO[str], counts: Counter[str], lock: threading.Lock) -> None:
    """Add each ``<what> <count>`` line of ``out`` to ``counts``, until ``out`` ends."""
    for line in out:
        what, _, n = line.rstrip("\n").rpartition(" ")
        if n.isdigit():
            with lock:
                counts[what] += int(n)


@contextlib.contextmanager
def _processes(argvs: Sequence[Sequence[str]]) -> Iterator[Counter[str]]:
    """Run each argv until the with-block ends (SIGTERM); each prints ``<what> <count>``
    lines of what it did since its last ones, summed into the yielded counter as they
    come."""
    procs = [subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, start_new_session=True) for argv in argvs]
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    readers = [threading.Thread(target=_add_up, args=(proc.stdout, counts, lock), daemon=True)
               for proc in procs]
    for reader in readers:
        reader.start()
    try:
        yield counts
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_process(proc.pid)
                proc.wait()
        for reader in readers:
            reader.join()


# a loop until SIGTERM that reports its counts as it goes (report(), at most every
# 0.2 s) and once more at its end (report(True)): the shared tail of the attackers below
_LOOP = """
import os, signal, socket, sys, time
from collections import Counter
counts = Counter()
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
reported = [time.monotonic()]
def report(last=False):
    if not last and time.monotonic() - reported[0] < 0.2:
        return
    sys.stdout.write("".join(f"{what} {n}\\n" for what, n in counts.items()))
    sys.stdout.flush()
    counts.clear()
    reported[0] = time.monotonic()
"""

_SSH = _LOOP + """
argv = sys.argv[1:]
import subprocess
while not stop:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    counts["logins admitted" if done.returncode == 0 else "logins refused"] += 1
    report()
report(True)
"""


@contextlib.contextmanager
def ssh_logins(user: str, ssh_argv: Sequence[str], processes: int) -> Iterator[Counter[str]]:
    """``processes`` loops of the login ``ssh_argv`` as ``user``, back to back."""
    with _processes([_as(user, [sys.executable, "-c", _SSH, *ssh_argv])
                     for _ in range(processes)]) as counts:
        yield counts


_IDLE = _LOOP + """
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
while not stop:
    while len(held) < count and not stop:
        s = socket.socket()
        try:
            s.connect((host, port))
        except OSError:
            s.close()
            counts["connect failed"] += 1
            time.sleep(0.01)
            break
        s.setblocking(False)
        held.append(s)
        counts["connected"] += 1
    kept = []
    for s in held:
        try:
            gone = s.recv(1) == b""
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            s.close()
            counts["closed by gecod"] += 1
        else:
            kept.append(s)
    held = kept
    report()
    time.sleep(0.05)
report(True)
"""


@contextlib.contextmanager
def tcp_idle(user: str, host: str, port: int, count: int, netns: str = ""
             ) -> Iterator[Counter[str]]:
    """``count`` idle connections to ``host:port`` as ``user`` (from ``netns``), held and
    re-opened as they are closed."""
    with _processes([_as(user, [PYTHON, "-c", _IDLE, host, str(port), str(count)],
                         netns)]) as counts:
        yield counts


_GARBAGE = _LOOP + """
from geco.wire.frame import encode
from geco.wire.messages import CLUSTER_MAX_PAYLOAD, MsgType, NodeRequest
host, port, job = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
key = os.urandom(32)
while not stop:
    frame = encode(MsgType.PREPARE,
                   NodeRequest(job, 1, host, b""), key,
                   max_payload=CLUSTER_MAX_PAYLOAD)
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(frame)
            s.recv(4096)
        counts["frames sent"] += 1
    except OSError:
        counts["send failed"] += 1
        time.sleep(0.01)
    report()
report(True)
"""


@contextlib.contextmanager
def tcp_garbage(user: str, host: str, port: int, job: int, netns: str = ""
                ) -> Iterator[Counter[str]]:
    """PREPARE frames for job ``job`` MAC'd with a made-up key, to ``host:port`` as
    ``user`` (from ``netns``), back to back."""
    with _processes([_as(user, [PYTHON, "-c", _GARBAGE, host, str(port), str(job)],
                         netns)]) as counts:
        yield counts


def wait_for_file(path: Path, timeout: float, what: str) -> None:
    """Wait until ``path`` exists."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{what}: no {path} after {timeout} s"
        time.sleep(0.2)


def fds_held(directory: Path, want: int, timeout: float) -> int:
    """Wait until the hog job's processes in ``directory`` hold ``want`` fds between them
    (each wrote ``fds-held.<pid>``); return how many."""
    deadline = time.monotonic() + timeout
    while True:
        held = sum(int(p.read_text() or 0) for p in directory.glob("fds-held.*"))
        if held >= want:
            return held
        assert time.monotonic() < deadline, f"the hog holds {held} of {want} fds"
        time.sleep(0.2)


def unfifo(path: Path, uid: int, gid: int) -> None:
    """An empty file of ``uid``'s where the FIFO ``path`` is: the attack is over (Grid
    Engine's own shepherd, running as the user, would block opening the FIFO for the
    epilog's output, geco or not)."""
    path.unlink(missing_ok=True)
    path.touch()
    os.chown(path, uid, gid)


# An attack lasts until what its test asserts about it was shown (the attacker's counts,
# gecod's records, the victim's jobs), or this long: the test's assertions then say what
# was missing.
ATTACK_AT_MOST = 180.0


def attack_until(started: float, floor: float, shown: Callable[[], bool],
                 step: Callable[[], object]) -> float:
    """Call ``step`` again and again, for at least ``floor`` seconds and until ``shown()``
    (asked once the floor passed), of an attack that began at ``started``
    (``time.monotonic()``); or until :data:`ATTACK_AT_MOST` seconds passed. Returns the
    seconds since ``started``."""
    while True:
        took = time.monotonic() - started
        if took >= ATTACK_AT_MOST or (took >= floor and shown()):
            return took
        step()


# The victim's requests must be answered within a second whatever the attacker does
# (issue 32), or within ten times the same request on the quiet node where the machine
# itself is slower than that (a loaded CI machine): a stalled gecod answers in tens of
# seconds, or never.
GOAL_MS = 1000.0
QUIET_FACTOR = 10.0


def geco_ms(started: dict[str, str]) -> float:
    """gecod's own time for a JOB_STARTED it journaled: accept to answer, less Grid Engine's
    (the one qstat of a job's first start; the attacks are on geco, the qmaster's answer
    times under the machine's load are not theirs to show)."""
    return float(started["ELAPSED_MS"]) - float(started.get("LOOKUP_MS", 0))


def goal_ms(quiet_ms: float) -> float:
    """The bound a victim's request must stay under, given the same request's time on the
    quiet node."""
    return max(GOAL_MS, QUIET_FACTOR * quiet_ms)

