"""gecod started for a test: its node, its clients, and what tests ask of it.

gecod runs as ``python -m geco.daemon`` with a test configuration: its own
directory under /tmp (key, socket, state dir, a fake execd spool tree) and the
cgroup parent ``geco-test-<pid>`` (never ``GECO``). A job is a spool dir
``<spool>/vm/active_jobs/<job>.<task>/`` with ``environment``, ``config`` and
``pe_hostfile``, plus a resource file written with :mod:`geco.sge.resourcefile`, so no
qstat is ever needed.

A "job process" is a separate Python process whose cwd is that spool dir and
which sends JOB_STARTED for its own pid, as the preload does inside the child
sge_execd forks for sge_shepherd (or, as the job owner without the key, a
peer-credentialed QUARANTINE_SELF through :mod:`geco.wire.client`, as the starter's
fallback does); it prints the ACK's status and stays alive until the test lets
it go.

Every cgroup and process a test creates is removed with plain syscalls (not
with the code under test) after each test, so a broken gecod cannot leak them: in
every cgroup hierarchy mounted here (:func:`tests.cgroup_testkit.raw_cleanup` over
:func:`tests.cgroup_testkit.cgroup_mounts`), not only in those a test knows of.

A test module takes the fixtures by importing them (``from tests.gecodkit import
gecod as gecod``): ``node`` and ``gecod`` are module-scoped, one node and one gecod per
module that imports them, and ``_clean_jobs`` (autouse where imported) ends each test's
jobs on that node. ``MARKS`` is the modules' ``pytestmark``: root, and cgroup v1 with a
cpuset a test can use.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from geco import config
from geco.cgroup import find_hierarchies, parse_mountinfo
from geco.cgroup._v1 import OPTIONAL, REQUIRED
from geco.errors import GecoError
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.wire import address, client
from geco.wire.frame import decode, encode
from geco.wire.messages import Adopt, AdoptReply, AdoptStage, MsgType
from tests.cgroup_testkit import cgroup_mounts, raw_cleanup
from tests.cleanslate import alive

REPO = Path(__file__).resolve().parents[1]
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The v1 hierarchies gecod makes job cgroups in here: geco's own list, as mounted (a list
# of its own here would miss the next controller geco takes up, as it missed devices)
MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           CGROUP_ROOT)
CONTROLLERS = tuple(c for c in (*REQUIRED, *OPTIONAL) if c in MOUNTED)
HOST = short_hostname()
MiB = 1 << 20
NOBODY = 65534
DEADLINE = 1.0  # [gecod] connection_deadline in the test configuration


def why_not() -> str:
    if os.geteuid() != 0:
        return "gecod and cgroups need root"
    missing = [c for c in ("cpuset", "memory") if not (CGROUP_ROOT / c / "tasks").exists()]
    if missing:
        return f"this machine has no cgroup v1 {' and '.join(missing)} at {CGROUP_ROOT}"
    for d in (CGROUP_ROOT / "cpuset").iterdir():
        if d.is_dir() and (d / "cpuset.cpu_exclusive").read_text().strip() == "1":
            return f"the cpuset {d} is cpu_exclusive, so no test cpuset can get a cpu"
    return ""


MARKS = [pytest.mark.root, pytest.mark.skipif(bool(why_not()), reason=why_not())]

# The job process: read the key as root (except "peercred"), then (optionally) drop to
# nobody, ask for quarantine, print the ACK status, stay alive until stdin closes.
CLIENT = r"""
import dataclasses, os, sys
from geco import config
from geco.wire import address, client
from geco.wire.frame import decode_ack, encode
from geco.wire.messages import JobStarted, MsgType
key_file, where, job, task, mode = sys.argv[1:6]
key = b"" if mode == "peercred" else open(key_file, "rb").read()
pid = os.getpid()
if mode.endswith("nobody") or mode == "peercred":
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
elif mode == "execd":  # as sge_execd forks the shepherd: real uid root, effective not
    os.setegid(65534); os.seteuid(65534)
elif mode.startswith("pid="):
    pid = int(mode[4:])
if mode == "peercred":  # the starter's fallback: no key, the kernel vouches
    try:
        open(key_file, "rb")
        sys.exit("nobody can read the key file")
    except PermissionError:
        pass
    cfg = config.Config()._replace(gecod_socket=where)
    try:
        status = client.quarantine_self(cfg, int(job), int(task), timeout=30).status.name
    except client.GecodRefused as exc:
        status = exc.status.name
else:
    kind = MsgType.QUARANTINE_SELF if mode.startswith("self") else \
        MsgType.JOB_STARTED
    frame = encode(kind, JobStarted(int(job), int(task), pid), key)
    reply = client.request(address.parse(where), frame, 30)
    status = decode_ack(reply, key, frame[12:28]).status.name
print(status, job, task, os.getpid(), flush=True)
sys.stdin.read()
"""


# -- the test node ------------------------------------------------------------


@dataclass
class Node:
    """The test's node: its directory, key, configuration, spool tree and cgroup name."""

    base: Path
    name: str  # the cgroup parent, geco-test-<pid>
    key: bytes
    processes: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def key_file(self) -> Path:
        return self.base / "quarantine.key"

    @property
    def spool(self) -> Path:
        return self.base / "spool"

    @property
    def state_dir(self) -> Path:
        return self.base / "state"

    def socket_path(self, tag: str = "gecod") -> str:
        return str(self.base / f"{tag}.sock")

    def write_config(self, tag: str = "gecod", sock: str | None = None, qstat: str = "",
                     kill_timeout: float | None = None, *, degraded: bool = False,
                     sections: str = "", **gecod: str) -> Path:
        """Write ``<tag>.toml``: socket ``path:<tag>.sock`` (or the address ``sock``), more
        [gecod] keys, a [qstat] command when given (qstat fails at once otherwise), and
        [epilog] kill_timeout when given; ``degraded``: [qstat] run_without_memory_limits;
        ``sections``: more TOML at the end (other sections)."""
        path = self.base / f"{tag}.toml"
        extra = "".join(f"{k} = {v}\n" for k, v in gecod.items())
        extra += f'[qstat]\ncommand = "{qstat or "/bin/false"}"\nretries = 0\n'
        extra += f"run_without_memory_limits = {str(degraded).lower()}\n"
        path.write_text(
            f'[paths]\nstate_dir = "{self.state_dir}"\nexecd_spool_dir = "{self.spool}"\n'
            f'[cgroup]\nname = "{self.name}"\n'
            f'[log]\ntrace_dir = "{self.base / "trace"}"\n'
            # this machine's Grid Engine is not the test's to disable
            f'[epilog]\ndisable_queue_on_stuck = false\n'
            + (f"kill_timeout = {kill_timeout}\n" if kill_timeout is not None else "") +
            f'[gecod]\nsocket = "{sock or "path:" + self.socket_path(tag)}"\n'
            f'key_file = "{self.key_file}"\n'
            f"connection_deadline = {DEADLINE}\n{extra}{sections}")
        return path

    def job_dir(self, job: int, task: int = 1) -> Path:
        return self.spool / HOST / "active_jobs" / f"{job}.{task}"

    def make_job(self, job: int, task: int = 1, *, slots: int = 1, memory: int = 256 * MiB,
                 owner: str = "root", trace_level: int = 0) -> Path:
        """Spool a running job the way sge_execd does, and its resource file."""
        d = self.job_dir(job, task)
        d.mkdir(parents=True)
        (d / "environment").write_text(
            f"JOB_ID={job}\nSGE_TASK_ID={'undefined' if task == 1 else task}\nJOB_NAME=t\n")
        (d / "config").write_text(f"job_owner={owner}\njob_name=t\njob_id={job}\n")
        (d / "pe_hostfile").write_text(f"{HOST} {slots} all.q@{HOST} UNDEFINED\n")
        resourcefile.write(self.state_dir / "resources", ResourceSet(
            job, task, job_name="t", owner=owner, trace_level=trace_level,
            nodes=(NodeResources(HOST, slots=slots, memory_limit=memory),)))
        return d

    def make_pe_task_dir(self, job: int, task: int = 1, petask: str = f"1.{HOST}") -> Path:
        """A qrsh -inherit task's spool dir below the job's (own environment file)."""
        d = self.job_dir(job, task) / petask
        d.mkdir()
        shutil.copy(self.job_dir(job, task) / "environment", d / "environment")
        return d

    def under_shepherd(self, argv: list[str]) -> list[str]:
        """``argv`` run as the child of a fake ``sge_shepherd`` (a copy of /bin/sh)."""
        fake = self.base / "shepherd-bin" / "sge_shepherd"
        fake.parent.mkdir(exist_ok=True)
        if not fake.exists():
            shutil.copy("/bin/sh", fake)
        # "; exit $?" keeps the shell as the parent instead of exec'ing the client
        return [str(fake), "-c", 'exec_client() { "$@"; exit $?; }; exec_client "$@"',
                "sge_shepherd", *argv]

    def client_config(self, sock: str) -> config.Config:
        """The configuration a client of the gecod at ``sock`` uses (geco.wire.client)."""
        return config.Config()._replace(gecod_socket=sock)

    def cgroup(self, controller: str, key: str = "") -> Path:
        parent = MOUNTED[controller].mount_point / self.name
        return parent / key if key else parent

    def parents(self) -> list[Path]:
        """The node's cgroup parent in every hierarchy mounted here (whether it exists or
        not), those geco does not use included: where anything of the node's may be."""
        return [mount / self.name for mount in cgroup_mounts()]

    def job_cgroups_left(self, key: str) -> list[Path]:
        """The directories of job ``key`` that exist, in any hierarchy mounted here."""
        return [d for parent in self.parents() if (d := parent / key).exists()]

    def job_process(self, job: int, task: int = 1, *, cwd: Path | None = None,
                    mode: str = "plain", sock: str | None = None,
                    shepherd: bool = False, named_shepherd: bool = False) -> JobProcess:
        """Start a client process in the job's spool dir (or ``cwd``).

        ``mode``: ``plain`` (JOB_STARTED for itself), ``nobody`` (the same after
        dropping to uid nobody), ``execd`` (the same with euid nobody, real uid root,
        as the child sge_execd forks for the shepherd), ``pid=<n>`` (JOB_STARTED for another pid),
        ``self-nobody`` (QUARANTINE_SELF as nobody, MAC'd with the key read before),
        ``peercred`` (QUARANTINE_SELF as nobody that never had the key:
        :func:`geco.wire.client.quarantine_self`). ``shepherd``: run it as the
        child of a fake ``sge_shepherd`` (a copy of /bin/sh) working in the spool dir.
        ``named_shepherd``: the process itself is called ``sge_shepherd`` (Python run
        through a symlink of that name), as the shepherd JOB_STARTED comes from is.
        """
        python, path = sys.executable, [str(REPO)]
        if named_shepherd:
            link = self.base / "shepherd-link" / "sge_shepherd"
            link.parent.mkdir(exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(os.path.realpath(sys.executable))
            # run through the link, Python does not find the venv: name its packages
            python, path = str(link), [*path, *site.getsitepackages()]
        argv = [python, "-c", CLIENT, str(self.key_file), sock or self.socket_path(),
                str(job), str(task), mode]
        if shepherd:
            argv = self.under_shepherd(argv)
        proc = subprocess.Popen(
            argv,
            cwd=cwd or self.job_dir(job, task), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={"PYTHONPATH": os.pathsep.join(path), "PATH": "/usr/bin"})
        self.processes.append(proc)
        return JobProcess(proc)


@dataclass
class JobProcess:
    proc: subprocess.Popen[str]
    client_pid: int = 0  # the client's own pid (not the fake shepherd's), once answered

    @property
    def pid(self) -> int:
        return self.client_pid or self.proc.pid

    def answer(self, timeout: float = 30.0) -> str:
        """The ACK status name the process got (e.g. "OK"); fails with its stderr if none."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready = _wait_readable(self.proc.stdout.fileno(), timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"job process {self.pid} got no ACK: {self.proc.stderr.read()}")
        status, _job, _task, pid = line.split()
        self.client_pid = int(pid)
        return status

    def exit(self) -> None:
        """Let the process go (it exits when its stdin closes) and reap it."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def cgroups(self) -> dict[str, str]:
        """Controller -> cgroup path, from /proc/<pid>/cgroup."""
        out = {}
        for line in Path(f"/proc/{self.pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(","):
                out[c] = path
        return out


def _wait_readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


NodeT = TypeVar("NodeT", bound=Node)


@contextlib.contextmanager
def make_node(kind: type[NodeT], tag: str, name: str) -> Iterator[NodeT]:
    """A ``kind`` of node in a fresh ``/tmp/geco-test-<tag>-*`` with a new key file and the
    cgroup parent ``name``; afterwards its processes end, its cgroups in every hierarchy
    (:func:`tests.cgroup_testkit.raw_cleanup`: thawed, emptied, removed) and its directory go.
    A cgroup that vanishes meanwhile is no failure: gecod may be removing it right now (a
    job whose first process exited has ended, and test_gecod_reaper's reaper removes jobs
    it finds gone)."""
    # /tmp, not pytest's 0700 tmp dirs: nobody's processes (a client, test_gecod_reaper's
    # fake shepherd) must reach the socket and the binaries in it
    base = Path(tempfile.mkdtemp(prefix=f"geco-test-{tag}-"))
    base.chmod(0o755)
    key = os.urandom(32)
    n = kind(base, name, key)
    fd = os.open(n.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, key)
    os.close(fd)
    try:
        yield n
    finally:
        for proc in n.processes:
            proc.kill()
            proc.wait()
        left = raw_cleanup(n.parents())
        shutil.rmtree(base, ignore_errors=True)
        assert not left, left


def end_jobs(node: Node) -> None:
    """What a test leaves: its job processes end, its job cgroups in every hierarchy (see
    :func:`make_node`), spool dirs and resource files go."""
    for proc in node.processes:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    node.processes.clear()
    left = raw_cleanup(job for parent in node.parents() if parent.is_dir()
                       for job in parent.iterdir() if job.is_dir())
    assert not left, left
    shutil.rmtree(node.spool, ignore_errors=True)
    shutil.rmtree(node.state_dir / "resources", ignore_errors=True)


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with make_node(Node, "gecod", f"geco-test-{os.getpid()}") as n:
        yield n


@pytest.fixture(autouse=True)
def _clean_jobs(node: Node) -> Iterator[None]:
    """After each test: its job processes end, its job cgroups and spool dirs go."""
    yield
    end_jobs(node)


# -- gecod ----------------------------------------------------------------------


@dataclass
class Gecod:
    proc: subprocess.Popen[bytes]
    sock: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def output_with(self, *lines: str, timeout: float = 30.0) -> str:
        """The log once it holds every one of ``lines``: gecod journals from a thread
        of its own, so a line can reach the file just after the reply it explains."""
        deadline = time.monotonic() + timeout
        while not all(line in (log := self.output()) for line in lines) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        return log

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_gecod(node: Node, tag: str = "gecod", env: dict[str, str] | None = None,
                prefix: tuple[str, ...] = (), **gecod: Any) -> Gecod:
    """Start gecod with ``<tag>.toml`` (``gecod`` = extra [gecod] keys) and wait until it
    listens; ``prefix`` runs it through a wrapper (setpriv)."""
    config = node.write_config(tag, **gecod)
    log = node.base / f"{tag}.log"
    out = open(log, "ab")  # noqa: SIM115
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "geco.daemon", "--config",
                             str(config), "--log-level", "info"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                 **(env or {})})
    out.close()
    g = Gecod(proc, gecod["sock"] if "sock" in gecod else node.socket_path(tag), log)
    where = address.parse(g.sock)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"gecod exited {proc.returncode} at start:\n{g.output()}")
        with contextlib.suppress(GecoError):
            address.connect(where, 1.0).close()
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"gecod did not listen within 30 s:\n{g.output()}")
        time.sleep(0.05)
    return g


@pytest.fixture(scope="module")
def gecod(node: Node, journal: Any) -> Iterator[Gecod]:
    g = start_gecod(node)
    try:
        yield g
    finally:
        code = g.stop()
        assert code == 0, g.output()


def exchange(sock_path: str, data: bytes, *, half_close: bool = False,
             timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection and return everything gecod sends until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
    return out


def status(node: Node, sock: str) -> dict[str, Any]:
    """Ask gecod for STATUS (as any user would: geco.wire.client) and return the JSON document."""
    return client.status(node.client_config(sock), timeout=10)


def assert_serving(node: Node, g: Gecod, within: float = 2.0) -> None:
    """A valid request right now is answered promptly."""
    started = time.monotonic()
    doc = status(node, g.sock)
    assert doc["pid"] == g.pid
    assert time.monotonic() - started < within


def logged(journal: Any, since: float, **match: str) -> list[dict[str, Any]]:
    """Journal entries matching ``match`` received after ``since`` (epoch seconds, to the
    microsecond: an entry of the previous test never counts for this one)."""
    return journal.entries(since, **match)


# job ids of this session only: the journal outlives sessions, and a test that counts
# a job's entries must not see those of an earlier run (or a parallel one)
_jobs = itertools.count(100_000 + os.getpid() % 90_000 * 100)


def new_job() -> int:
    return next(_jobs)


def free_tcp_port() -> int:
    """A loopback TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_gone(node: Node, key: str, timeout: float = 15.0) -> None:
    """Wait until no directory of the job is left in any cgroup hierarchy mounted here."""
    deadline = time.monotonic() + timeout
    while left := node.job_cgroups_left(key):
        assert time.monotonic() < deadline, f"job {key}'s cgroups are still there: {left}"
        time.sleep(0.05)



def adopt(sock: str, key: bytes, pid: int, uid: int,
           stage: AdoptStage = AdoptStage.ACCOUNT) -> AdoptReply:
    """Send one ADOPT and return gecod's verified ADOPT_REPLY."""
    return adopt_frame(sock, key, Adopt(0, 0, pid, uid, stage,
                                        "127.0.0.1 40000 127.0.0.1 22"))


def adopt_frame(sock: str, key: bytes, adopt: Adopt) -> AdoptReply:
    frame = encode(MsgType.ADOPT, adopt, key)
    got = decode(exchange(sock, frame), key)
    assert got.type is MsgType.ADOPT_REPLY
    reply = got.message
    assert isinstance(reply, AdoptReply) and reply.request_nonce == frame[12:28]
    return reply


def root_socket(g: Gecod) -> str:
    return g.sock.removesuffix(".sock") + "-root.sock"


def stop_by_pid(pid: int, timeout: float = 30.0) -> None:
    """End a gecod the test did not start itself (a handover's successor): SIGTERM, then
    wait until it no longer runs."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"gecod {pid} still running {timeout:g} s after SIGTERM"
        time.sleep(0.05)


def unit_capabilities() -> list[str]:
    """conf/gecod.service's CapabilityBoundingSet."""
    for line in (REPO / "conf" / "gecod.service").read_text().splitlines():
        if line.startswith("CapabilityBoundingSet="):
            return line.split("=", 1)[1].split()
    raise AssertionError("conf/gecod.service has no CapabilityBoundingSet")


def with_unit_capabilities() -> tuple[str, ...]:
    """A :func:`start_gecod` prefix: gecod with only the unit's capabilities (setpriv)."""
    bounding = "-all," + ",".join("+" + c.removeprefix("CAP_").lower()
                                  for c in unit_capabilities())
    return ("setpriv", f"--bounding-set={bounding}", "--")
