"""Measure a victim's JOB_STARTED while a user attacks gecod, one way at a time (issue 32).

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_stall [--rounds 40] [--fds 200000] [--hold 1000]
                                                   [--json PATH]

Starts a throw-away gecod with its own configuration (its own directory under
/tmp, fresh keys, the cgroup parent ``geco-test-bench-stall-<pid>``, a fake execd
spool, no qstat, and a cluster channel on a free loopback port). The victim is a
fresh one-slot job each round (spool dir and resource file made here): its fake
master shepherd, a Python client run through a symlink named ``sge_shepherd`` in
the job's spool dir with real uid 0, sends JOB_STARTED for itself on gecod's
privileged socket (a job's first process: gecod serves it in its pool of job
starts), times connect to verified ACK, and exits, so gecod ends the job; the
next round starts once the job's cgroups are gone. The node has 2 cores: one
victim job at a time, an attacker's job holds the other.

Phases, each ``--rounds`` rounds long, measured once its attack is at full
strength (what shows it is named below, awaited in the journal or in /proc):

1. **quiet**: no attack;
2. **OOM reports to a FIFO**: a job of ``nobody`` (its own fake shepherd's
   JOB_STARTED contains it) whose spooled config names a stderr file that is a
   FIFO nobody reads, and which has a child killed for its memory every ~300 ms
   (64 MiB limit; the child raises its own ``oom_score_adj`` to 1000 first, so the
   kill takes it): full strength at gecod's first ``oom-report-failed``;
3. **callerid logins**: a job of ``nobody`` contained the same way (no FIFO, no OOM
   kills: one attack at a time) whose processes hold ``--fds`` dup'd fds between
   them (as many processes as their fd limit asks), and 6 threads sending ADOPT
   (stage ACCOUNT, MAC'd with the key, as pam_geco does) for uid nobody naming a
   live loopback TCP connection whose client end this bench holds, outside the
   job: each login's callerid lookup walks the job's fds to its ``[ssh]
   callerid_budget`` and finds nothing. Full strength once the fds are held and
   gecod journaled a login ``CALLERID=over-budget``;
4. **idle public connections**: uid nobody opening up to ``--hold`` connections to
   the public socket and holding them (``tests/flood.py``), far more than its share
   of 64 (gecod closes its oldest for each new one): full strength at the first
   eviction gecod journals;
5. **the cluster port**: as nobody on loopback, 64 idle TCP connections held and
   re-opened, and PREPARE frames MAC'd with a made-up key sent back to back
   (``tests/stallkit.py``): full strength once gecod journaled both an eviction
   and a bad MAC from that address (a record, or its window's summary). Here, and
   on the quiet node, each round also times a NODE_STATUS (the cluster key, for a
   job not on the node: answered "refused"); one that gets no answer (the victim
   shares its address with the attacker, and with its share of connections) is
   counted and said, not timed.

Floors, measured in the same run: each figure on the quiet node, and a bare Unix
socket round trip (connect, 64 bytes each way, close) to a process that only
echoes. Goal: under any attack, p99 at most 2 x the quiet node's.

Prints one table (and what each attack did); ``--json`` writes the rows for
``bench/run``. Removes its cgroups, processes and files, also when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import REPO, journald, percentile, sigterm_exits
from bench._table import Row, add_json_option, cells, table, write_rows
from bench.bench_flood import socket_floor
from geco.errors import GecoError
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.wire import cluster, keys
from geco.wire.frame import decode, encode
from geco.wire.messages import Adopt, AdoptReply, AdoptStage, MsgType, NodeRequest
from geco.wire.reader import read_frame
from tests.cgroup_testkit import cgroup_mounts, raw_cleanup
from tests.flood import NOBODY, flooding
from tests.stallkit import ALLOCATE, tcp_garbage, tcp_idle

HOST = short_hostname()
MiB = 1 << 20
LOGIN_SENDERS = 6
CLUSTER_IDLE = 64
# the attacker's jobs (one at a time, on the core the victim's leaves), the victim's first
OOM_JOB, FDS_JOB, FIRST_VICTIM = 890001, 890002, 890101
# how long an attack may take to reach full strength
RAMP_UP = 60.0

# A job's master shepherd: real uid 0, working in the job's spool dir, called sge_shepherd
# (Python run through a symlink of that name). It sends JOB_STARTED for itself, times
# connect to verified ACK and prints "<status> <seconds> <pid of its work>". The victim's
# then exits (gecod ends the job); an attacker's starts its work as nobody (in the job's
# cgroups, as a job script) and stays until its stdin closes.
SHEPHERD = r"""
import os, socket, subprocess, sys, time
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
from geco.wire.reader import read_frame
key_file, sock_path, job, workdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
work = sys.argv[5:]
key = open(key_file, "rb").read()
frame = encode(MsgType.JOB_STARTED, JobStarted(job, 1, os.getpid()), key)
started = time.perf_counter()
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(sock_path)
    s.sendall(frame)
    reply = read_frame(s, time.monotonic() + 30)
status = decode_ack(reply, key, frame[12:28]).status.name
took = time.perf_counter() - started
pid = 0
if work and status == "OK":
    pid = subprocess.Popen(work, cwd=workdir, user=65534, group=65534, extra_groups=[],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}).pid
print(status, took, pid, flush=True)
if work:
    sys.stdin.read()
"""

# The OOM attacker's work: a child killed for its memory every ~300 ms.
OOM_LOOP = f'while :; do /usr/bin/python3 -c "{ALLOCATE}"; sleep 0.3; done'

# The callerid attacker's work: hold argv[1] dup'd fds, in as many processes as the fd
# limit asks; each writes fds-held.<pid> with its count once it holds them.
FD_HOLDER = r"""
import os, resource, sys, time
want = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
each = min(hard, 1 << 20) - 64
resource.setrlimit(resource.RLIMIT_NOFILE, (each + 64, hard))
total = 0
while total < want:
    n = min(each, want - total)
    if os.fork() == 0:
        held = [os.dup(0) for _ in range(n)]
        with open(f"fds-held.{os.getpid()}", "w") as f:
            f.write(str(len(held)))
        time.sleep(1e6)
    total += n
time.sleep(1e6)
"""


def wait_until(ready: Callable[[], object], timeout: float, what: str,
               interval: float = 0.2) -> None:
    """Poll ``ready`` until it is true; SystemExit naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_stall: {what}: not within {timeout:g} s")
        time.sleep(interval)


# -- the bench's gecod ------------------------------------------------------------


@dataclass(frozen=True)
class StallGecod:
    """A throw-away gecod (see the module docstring) and where its pieces are."""

    pid: int
    base: Path
    key_file: Path
    public_socket: str  # anyone's
    root_socket: str  # the preload's, pam_geco's
    cluster_port: int
    cluster_key: bytes
    cgroup_name: str
    shepherd: Path  # a symlink to Python named sge_shepherd
    log: Path

    @property
    def spool(self) -> Path:
        return self.base / "spool" / HOST / "active_jobs"

    def job_dir(self, job: int) -> Path:
        return self.spool / f"{job}.1"

    def job_cgroups(self, job: int) -> list[Path]:
        """The job's directories that exist, in every cgroup hierarchy mounted here."""
        return [d for m in cgroup_mounts() if (d := m / self.cgroup_name / f"{job}.1").exists()]

    def journaled(self, since: float, **match: str) -> list[dict[str, Any]]:
        """This gecod's journal records since ``since`` (epoch s) with every field of
        ``match``."""
        argv = ["journalctl", "-o", "json", "--no-pager", "--since", f"@{since - 1:.0f}",
                f"_PID={self.pid}", *(f"{k}={v}" for k, v in match.items())]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        entries = [json.loads(line) for line in out.splitlines() if line.strip()]
        # --since has whole seconds
        return [e for e in entries if int(e["__REALTIME_TIMESTAMP"]) >= since * 1e6]

    def refused(self, since: float, event: str, reason: str, **match: str) -> bool:
        """gecod journaled a refusal for ``reason``: a record of its own, or counted in a
        window's summary (each peer gets a few records a window, then one summary)."""
        return bool(self.journaled(since, GECO_EVENT=event, REASON=reason, **match)) or any(
            f"{reason}:" in str(e.get("REASONS", ""))
            for e in self.journaled(since, GECO_EVENT=f"{event}-summary", **match))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def stall_gecod() -> Iterator[StallGecod]:
    """Start gecod with its own configuration and cgroup parent; remove it all afterwards."""
    base = Path(tempfile.mkdtemp(prefix="geco-test-bench-stall-"))
    base.chmod(0o755)  # nobody's processes reach the public socket and the FIFO in it
    name = f"geco-test-bench-stall-{os.getpid()}"
    key_file, cluster_key = base / "quarantine.key", base / "cluster.key"
    keys.generate_key(key_file)
    keys.generate_key(cluster_key)
    sock_path, root_path = base / "gecod.sock", base / "gecod-root.sock"
    port = _free_port()
    (base / "spool" / HOST / "active_jobs").mkdir(parents=True)
    shepherd = base / "shepherd-link" / "sge_shepherd"
    shepherd.parent.mkdir()
    shepherd.symlink_to(os.path.realpath(sys.executable))
    config = base / "geco.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{base / "state"}"\nexecd_spool_dir = "{base / "spool"}"\n'
        f'[cgroup]\nname = "{name}"\n'
        f'[log]\ntrace_dir = "{base / "trace"}"\n'
        # this machine's Grid Engine is not the bench's to disable, nor its qmaster to ask
        '[epilog]\ndisable_queue_on_stuck = false\n'
        '[qstat]\ncommand = "/bin/false"\nretries = 0\n'
        # the attacker is nobody: no process of nobody's on this machine is the bench's
        # to end (nobody is exempt by default; said here, not relied upon)
        '[strays]\nkill = false\n'
        f'[gecod]\nsocket = "path:{sock_path}"\nkey_file = "{key_file}"\n'
        f'[cluster]\naddress = "port:{port}"\nbind = "127.0.0.1"\n'
        f'key_file = "{cluster_key}"\nallow = ["127.0.0.0/8"]\n')
    log_path = base / "gecod.log"
    gecod = None
    try:
        with log_path.open("wb") as log:
            gecod = subprocess.Popen([sys.executable, "-m", "geco.daemon", "--config",
                                      str(config)], cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True,
                                     env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})

        def listening() -> bool:
            if gecod is not None and gecod.poll() is not None:
                raise SystemExit("bench_stall: gecod exited at start:\n" + log_path.read_text())
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return sock_path.exists() and root_path.exists()

        wait_until(listening, 30, "gecod listening on its sockets and cluster port", 0.05)
        yield StallGecod(gecod.pid, base, key_file, str(sock_path), str(root_path), port,
                         keys.load_key(cluster_key, "cluster key"), name, shepherd, log_path)
    finally:
        if gecod is not None:
            gecod.send_signal(signal.SIGTERM)
            try:
                gecod.wait(30)
            except subprocess.TimeoutExpired:
                gecod.kill()
                gecod.wait()
        for what in raw_cleanup(m / name for m in cgroup_mounts()):
            print(f"bench_stall: cannot remove a test cgroup: {what}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)


# -- jobs -----------------------------------------------------------------------


def make_job(g: StallGecod, job: int, *, owner: str = "root", memory: int = 256 * MiB,
             stderr_path: str = "/dev/null") -> Path:
    """Spool a running one-slot job the way sge_execd does, and its resource file."""
    d = g.job_dir(job)
    d.mkdir()
    (d / "environment").write_text(f"JOB_ID={job}\nSGE_TASK_ID=undefined\nJOB_NAME=stall\n")
    (d / "config").write_text(f"job_owner={owner}\njob_name=stall\njob_id={job}\n"
                              f"stderr_path={stderr_path}\n")
    (d / "pe_hostfile").write_text(f"{HOST} 1 all.q@{HOST} UNDEFINED\n")
    resourcefile.write(g.base / "state" / "resources", ResourceSet(
        job, 1, job_name="stall", owner=owner,
        nodes=(NodeResources(HOST, slots=1, memory_limit=memory),)))
    return d


def shepherd(g: StallGecod, job: int, workdir: str = "", *work: str
             ) -> subprocess.Popen[str]:
    """Start the job's master shepherd (:data:`SHEPHERD`), with ``work`` for an attacker's."""
    path = [str(REPO), *site.getsitepackages()]  # run through the link, Python finds no venv
    return subprocess.Popen([str(g.shepherd), "-c", SHEPHERD, str(g.key_file), g.root_socket,
                             str(job), workdir, *work], cwd=g.job_dir(job),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": os.pathsep.join(path), "PATH": "/usr/bin:/bin"})


def _answer(g: StallGecod, proc: subprocess.Popen[str], job: int) -> tuple[float, int]:
    """A shepherd's seconds to its verified ACK and its work's pid; SystemExit unless OK."""
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "OK":
        proc.kill()
        raise SystemExit(f"bench_stall: job {job}'s JOB_STARTED: {line or proc.stderr.read()}"
                         f"\n{g.log.read_text()[-2000:]}")
    return float(line[1]), int(line[2])


def wait_gone(g: StallGecod, job: int) -> None:
    """Wait until gecod has removed the job's cgroups (its master shepherd exited)."""
    wait_until(lambda: not g.job_cgroups(job), 30, f"job {job}.1's cgroups removed", 0.005)


def victim_round(g: StallGecod, job: int) -> float:
    """One victim job: its shepherd's JOB_STARTED (seconds), its end, its cgroups gone."""
    make_job(g, job)
    proc = shepherd(g, job)
    try:
        took, _ = _answer(g, proc, job)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    wait_gone(g, job)
    shutil.rmtree(g.job_dir(job))
    return took


def node_status(g: StallGecod) -> cluster.Answer:
    """A NODE_STATUS over the cluster channel for a job not on this node (answered
    "refused" when gecod answers it)."""
    return cluster.ask("127.0.0.1", MsgType.NODE_STATUS, NodeRequest(1, 1, HOST, b""),
                       g.cluster_key, g.cluster_port, 10.0)


@contextlib.contextmanager
def attacker_job(g: StallGecod, job: int, memory: int, stderr_path: str, workdir: Path,
                 *work: str) -> Iterator[int]:
    """A job of nobody's running ``work`` in ``workdir``, contained by gecod (its shepherd's
    JOB_STARTED); yields the work's pid. Afterwards its shepherd exits, gecod ends it, and
    the bench waits until its cgroups are gone."""
    make_job(g, job, owner="nobody", memory=memory, stderr_path=stderr_path)
    proc = shepherd(g, job, str(workdir), *work)
    try:
        _, pid = _answer(g, proc, job)
        yield pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        wait_gone(g, job)
        shutil.rmtree(g.job_dir(job), ignore_errors=True)


def _nobodys_dir(g: StallGecod, name: str) -> Path:
    d = g.base / name
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


# -- the attacks: each yields at full strength, and counts what it did --------------


@contextlib.contextmanager
def quiet(g: StallGecod) -> Iterator[Counter[str]]:
    yield Counter()


@contextlib.contextmanager
def oom_to_fifo(g: StallGecod) -> Iterator[Counter[str]]:
    """A job of nobody's whose stderr file is a FIFO nobody reads, a child of it killed for
    its memory every ~300 ms."""
    done: Counter[str] = Counter()
    workdir = _nobodys_dir(g, "oom")
    fifo = workdir / "stall.err"
    os.mkfifo(fifo, 0o600)
    os.chown(fifo, NOBODY, NOBODY)
    since = time.time()
    with attacker_job(g, OOM_JOB, 64 * MiB, str(fifo), workdir,
                      "/bin/bash", "-c", OOM_LOOP):
        wait_until(lambda: g.journaled(since, GECO_EVENT="oom-report-failed",
                                       JOB_ID=str(OOM_JOB)),
                   RAMP_UP, "the first OOM report refused for the FIFO")
        yield done
        oom = Path("/sys/fs/cgroup/memory", g.cgroup_name, f"{OOM_JOB}.1",
                   "memory.oom_control")
        for line in oom.read_text().splitlines():
            if line.startswith("oom_kill "):
                done["OOM kills"] = int(line.split()[1])
    done["OOM reports refused (journaled one by one)"] = len(g.journaled(
        since, GECO_EVENT="oom-report-failed", JOB_ID=str(OOM_JOB)))


def _adopt_loop(sock_path: str, key: bytes, connection: str, senders: int,
                stop: multiprocessing.synchronize.Event,
                out: multiprocessing.connection.Connection) -> None:
    """The forked sender process: ``senders`` threads sending ADOPT (stage ACCOUNT, for uid
    nobody, as sshd's PAM module asks) back to back until ``stop`` (or until the bench is
    gone); sends its counts."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the bench's SystemExit: just end
    parent = os.getppid()
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def send() -> None:
        while not stop.is_set():
            adopt = Adopt(0, 0, os.getpid(), NOBODY, AdoptStage.ACCOUNT, connection)
            frame = encode(MsgType.ADOPT, adopt, key)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(30)
                    s.connect(sock_path)
                    s.sendall(frame)
                    got = decode(read_frame(s, time.monotonic() + 30), key)
                reply = got.message
                outcome = (f"logins {reply.status.name}"
                           if isinstance(reply, AdoptReply) else "logins answered?")
            except (OSError, GecoError) as exc:
                outcome = f"logins failed: {type(exc).__name__}"
                time.sleep(0.01)
            with lock:
                counts[outcome] += 1

    for _ in range(senders):
        threading.Thread(target=send, daemon=True).start()
    while not stop.wait(0.5) and os.getppid() == parent:
        pass
    with lock:
        out.send(dict(counts))


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the block. A child forked in it ignores Ctrl-C, which reaches the
    terminal's whole process group (a flooder whose main thread took KeyboardInterrupt
    would wait for its own threads for good); the bench's clean-up stops it instead."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def callerid_logins(g: StallGecod, fds: int) -> Iterator[Counter[str]]:
    """A job of nobody's holding ``fds`` fds, and :data:`LOGIN_SENDERS` senders of nobody's
    logins naming a connection no process of the job made."""
    done: Counter[str] = Counter()
    workdir = _nobodys_dir(g, "fds")
    since = time.time()
    with contextlib.ExitStack() as stack:
        stack.enter_context(attacker_job(g, FDS_JOB, 512 * MiB, "/dev/null", workdir,
                                         "/usr/bin/python3", "-c", FD_HOLDER, str(fds)))

        def held() -> int:
            return sum(int(p.read_text() or 0) for p in workdir.glob("fds-held.*"))

        wait_until(lambda: held() >= fds, RAMP_UP, f"the attacker's job holding {fds:,} fds")
        # a live loopback connection whose client end this process holds (outside the job)
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        client = stack.enter_context(socket.create_connection(listener.getsockname()))
        server_end = stack.enter_context(listener.accept()[0])
        connection = (f"127.0.0.1 {client.getsockname()[1]} 127.0.0.1 "
                      f"{server_end.getsockname()[1]}")
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        ours, theirs = ctx.Pipe()
        sender = ctx.Process(target=_adopt_loop, args=(g.root_socket, g.key_file.read_bytes(),
                                                       connection, LOGIN_SENDERS, stop, theirs))
        with sigint_ignored():
            sender.start()
        theirs.close()  # the sender's end: gone with it, so a dead sender reads as EOF
        try:
            wait_until(lambda: g.journaled(since, GECO_EVENT="ssh-admitted",
                                           CALLERID="over-budget", SSH_USER="nobody"),
                       RAMP_UP, "a login of nobody's past the callerid budget")
            yield done
        finally:
            stop.set()
            with contextlib.suppress(EOFError):
                if ours.poll(30):
                    done.update(ours.recv())
            ours.close()
            sender.join(10)
            if sender.is_alive():
                sender.kill()
                sender.join()
        done["fds held"] = held()
    done["logins past the callerid budget"] = len(g.journaled(
        since, GECO_EVENT="ssh-admitted", CALLERID="over-budget", SSH_USER="nobody"))


@contextlib.contextmanager
def idle_public(g: StallGecod, hold: int) -> Iterator[Counter[str]]:
    """nobody holding up to ``hold`` idle connections to the public socket."""
    since = time.time()
    with contextlib.ExitStack() as stack:
        with sigint_ignored():
            flood = stack.enter_context(flooding(g.public_socket, hold=hold))
        wait_until(lambda: g.refused(since, "quarantine-refused", "evicted",
                                     PEER_UID=str(NOBODY)),
                   RAMP_UP, "the first of nobody's idle connections evicted")
        yield flood.stats
    # the flood's stats are filled when its block ends


@contextlib.contextmanager
def cluster_port(g: StallGecod) -> Iterator[Counter[str]]:
    """nobody's idle connections to the cluster port and frames MAC'd with a made-up key."""
    since = time.time()
    with tcp_idle("nobody", "127.0.0.1", g.cluster_port, CLUSTER_IDLE) as idle, \
            tcp_garbage("nobody", "127.0.0.1", g.cluster_port, OOM_JOB) as garbage:
        wait_until(lambda: g.refused(since, "cluster-refused", "evicted")
                   and g.refused(since, "cluster-refused", "mac"),
                   RAMP_UP, "an idle cluster connection evicted and a bad MAC refused")
        done: Counter[str] = Counter()
        yield done
    done.update(idle)
    done.update(garbage)


# -- the phases -----------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str  # as the rows say it: "JOB_STARTED p99 under <name>"
    attack: Callable[[], contextlib.AbstractContextManager[Counter[str]]]
    node_status: bool = False  # also time NODE_STATUS each round


@dataclass(frozen=True)
class Measured:
    phase: Phase
    started: list[float]  # JOB_STARTED, seconds
    status: list[float]  # NODE_STATUS answered, seconds (node_status phases only)
    unanswered: list[str]  # NODE_STATUS not answered: what the asker got
    did: Counter[str]


def run_phase(g: StallGecod, phase: Phase, rounds: int, jobs: Iterator[int]) -> Measured:
    """The phase's attack at full strength, ``rounds`` victim jobs meanwhile."""
    started: list[float] = []
    status: list[float] = []
    unanswered: list[str] = []
    with phase.attack() as did:
        for _ in range(rounds):
            started.append(victim_round(g, next(jobs)))
            if phase.node_status:
                # not a reason to stop: an answer that never came is a figure of its own
                answer = node_status(g)
                if answer.status == "refused":
                    status.append(answer.seconds)
                else:
                    unanswered.append(f"{answer.status} after {answer.seconds * 1e3:.1f} ms "
                                      f"({answer.reason})")
    return Measured(phase, started, status, unanswered, did)


def figures(times: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``times`` (seconds), in ms."""
    return percentile(times, 0.5) * 1e3, percentile(times, 0.99) * 1e3


def rows_of(results: list[Measured], floor: list[float]) -> list[Row]:
    """The table: the quiet node beside a bare socket round trip, each attack beside the
    quiet node."""
    quiet, attacks = results[0], results[1:]
    q50, q99 = figures(quiet.started)
    f50, f99 = figures(floor)
    rows = [Row("JOB_STARTED p50, quiet node", q50, "ms", "-", f50,
                "bare Unix-socket round trip, p50"),
            Row("JOB_STARTED p99, quiet node", q99, "ms", "-", f99,
                "bare Unix-socket round trip, p99")]
    for m in attacks:
        m50, m99 = figures(m.started)
        rows.append(Row(f"JOB_STARTED p50 under {m.phase.name}", m50, "ms", "-", q50,
                        "quiet node"))
        rows.append(Row(f"JOB_STARTED p99 under {m.phase.name}", m99, "ms",
                        f"<= {2 * q99:.3g} (2 x quiet)", q99, "quiet node"))
        if m.phase.node_status and quiet.status and m.status:
            s50, s99 = figures(quiet.status)
            n50, n99 = figures(m.status)
            rows.append(Row(f"NODE_STATUS p50 under {m.phase.name}", n50, "ms", "-", s50,
                            "quiet node"))
            # no goal of the issue's: a look-up is no job start (a few ms either way)
            rows.append(Row(f"NODE_STATUS p99 under {m.phase.name}", n99, "ms", "-", s99,
                            "quiet node"))
        if m.phase.node_status:
            rows.append(Row(f"NODE_STATUS not answered under {m.phase.name}, of "
                            f"{len(m.status) + len(m.unanswered)}", len(m.unanswered),
                            "requests", "0", len(quiet.unanswered), "quiet node"))
    return rows


def measure(args: argparse.Namespace) -> list[Measured]:
    """Every phase, in order, on one gecod."""
    jobs = itertools.count(FIRST_VICTIM)
    results: list[Measured] = []
    with journald(), stall_gecod() as g:
        attacks = {"fifo": Phase("OOM reports to a FIFO", lambda: oom_to_fifo(g)),
                   "callerid": Phase("callerid logins", lambda: callerid_logins(g, args.fds)),
                   "public": Phase("idle public connections",
                                   lambda: idle_public(g, args.hold)),
                   "cluster": Phase("the cluster port", lambda: cluster_port(g),
                                    node_status=True)}
        phases = [Phase("a quiet node", lambda: quiet(g), node_status=True),
                  *(attacks[name] for name in args.attacks.split(","))]
        for phase in phases:
            began = time.monotonic()
            results.append(run_phase(g, phase, args.rounds, jobs))
            print(f"bench_stall: {phase.name}: {time.monotonic() - began:.0f} s",
                  file=sys.stderr, flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="victim jobs per phase")
    parser.add_argument("--fds", type=int, default=200_000,
                        help="fds the callerid attacker's job holds")
    parser.add_argument("--hold", type=int, default=1000,
                        help="idle connections nobody holds to the public socket")
    parser.add_argument("--attacks", default="fifo,callerid,public,cluster",
                        help="the attacks to run after the quiet node, in order (comma "
                             "separated: fifo, callerid, public, cluster)")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_stall: run as root (gecod creates cgroups)", file=sys.stderr)
        return 2
    sigterm_exits()
    floor = socket_floor(1000)
    try:
        results = measure(args)
    except KeyboardInterrupt:
        print("bench_stall: interrupted; its gecod, attackers and cgroups are gone",
              file=sys.stderr)
        return 130
    rows = rows_of(results, floor)
    print(f"a victim's JOB_STARTED while uid nobody attacks gecod, on {HOST}, "
          f"{len(os.sched_getaffinity(0))} cpus, Python {sys.version.split()[0]}, "
          f"{args.rounds} victim jobs a phase")
    print(table([cells(r) for r in rows]))
    print("what each attack did:")
    for m in results[1:]:
        said = ", ".join(f"{what} {n:,}" for what, n in sorted(m.did.items()))
        print(f"  {m.phase.name}: {said}")
    for m in results:
        for what in m.unanswered:
            print(f"NODE_STATUS not answered, {m.phase.name}: {what}")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
