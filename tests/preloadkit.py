"""The exec() preload built for tests, and a fake execd node to run it in.

Used by ``tests/system/test_preload.py`` and ``test_ocs_preload.py``: :func:`build`
builds the library with the project's Makefile and the tiny C programs of
``tests/preload/`` with ``cc`` into a scratch directory that unprivileged users can
traverse; :func:`new_node` makes one test's world: a test config
(``$GECO_PRELOAD_CONF``), a test key (a root-owned 0600 file), a job directory with
its ``environment``, and :class:`FakeGecod`, a fake gecod that speaks the real
protocol (``geco.wire``), records each request with the kernel's view of the
sender (SO_PEERCRED) and answers as the test tells it to.

Programs (``tests/preload/``):

* ``exec_variant VARIANT TARGET PATHDIR`` calls one exec function with a fixed
  argv/environment full of odd entries and prints its pid, then ``rc``/``errno``
  if the call returns;
* ``execd_exec VARIANT SHEPHERD [soge]`` starts a shepherd as a Grid Engine execd
  does, with its own environment (Open Cluster Scheduler) or without its
  ``LD_PRELOAD`` (Son of Grid Engine);
* ``dump_args`` (also copied as ``sge_shepherd``) prints its pid, argv and
  environment byte for byte;
* ``shepherd_job``, a fake shepherd that reports its environment and mapped files,
  then starts a "job" that does the same;
* ``spy_exec.so``, a second preload under ours, reports the errno and the
  argv/envp pointers the "real" function receives; ``other_preload.so``, a
  preload that does nothing;
* ``fork_exec`` and ``mt_exec``: fork-then-exec, and threads that fork and exec
  while others allocate and fail execs.

Each program runs as ``<name>/sge_execd`` (:meth:`Built.prog`): the preload
works only in sge_execd and sshd. As ``<name>/sshd`` (:meth:`Built.sshd`), run as
a user, it is an ssh session's process, which asks gecod to place it before it
execs. Under its own name (:meth:`Built.plain`) it is a process that merely
inherited ``LD_PRELOAD``, where the preload must read nothing and do nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from geco.wire import address
from geco.wire.frame import VERSION, decode, encode
from geco.wire.messages import Ack, AckStatus, JobStarted, MsgType
from geco.wire.reader import read_frame
from geco.wire.replay import ReplayCache

REPO = Path(__file__).resolve().parents[1]
PROGRAMS_SRC = REPO / "tests" / "preload"
# the tests/preload/*.c built as shared libraries (lib/<name>.so), not as programs
SHARED_LIBS = ("spy_exec", "other_preload")
VARIANTS = ("execve", "execv", "execvp", "execvpe", "execl", "execle", "execlp", "fexecve")
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


# ---------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Built:
    """The library and the test programs, in a directory everyone can traverse."""

    root: Path
    lib: Path
    spy: Path  # spy_exec.so
    other: Path  # other_preload.so

    def prog(self, name: str) -> Path:
        """Path of the compiled ``tests/preload/<name>.c``, installed as ``<name>/sge_execd``:
        the preload works only in sge_execd and sshd (by the kernel's name of the binary)."""
        return self.root / "bin" / name / "sge_execd"

    def plain(self, name: str) -> Path:
        """The same program under its own name: a process that merely inherits LD_PRELOAD."""
        return self.root / "plain" / name

    def sshd(self, name: str) -> Path:
        """The same program installed as ``<name>/sshd``: the preload works for ssh sessions
        there (the first exec of a process that runs as a user asks gecod to place it)."""
        return self.root / "sshd" / name / "sshd"


@contextlib.contextmanager
def build() -> Iterator[Built]:
    """Build libgeco_preload.so (make, with geco's other C programs) and every
    tests/preload/*.c (cc) into a scratch
    directory, removed afterwards (a module's ``built`` fixture, once per session)."""
    for tool in ("make", "cc", "strace", "nm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install build-essential strace binutils")
    # mkdtemp is 0700; 0755 so the tests that drop to nobody can run the programs
    root = Path(tempfile.mkdtemp(prefix="geco-test-preload-"))
    root.chmod(0o755)
    try:
        proc = subprocess.run(["make", "-C", str(REPO), f"BUILD={root}/lib"],
                              capture_output=True, text=True, env=BASE_ENV, check=False)
        if proc.returncode != 0:
            pytest.fail(f"make failed:\n{proc.stdout}{proc.stderr}")
        (root / "plain").mkdir(mode=0o755)
        for src in sorted(PROGRAMS_SRC.glob("*.c")):
            shared = src.stem in SHARED_LIBS
            out = root / "lib" / f"{src.stem}.so" if shared else root / "plain" / src.stem
            argv = ["cc", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(out),
                    str(src)]
            if shared:
                argv[1:1] = ["-shared", "-fPIC"]
                argv.append("-ldl")
            proc = subprocess.run(argv, capture_output=True, text=True, env=BASE_ENV,
                                  check=False)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(argv)} failed:\n{proc.stderr}")
            if not shared:  # a copy: /proc/self/exe names a symlink's target
                for where, host in (("bin", "sge_execd"), ("sshd", "sshd")):
                    (root / where / src.stem).mkdir(parents=True)
                    shutil.copy(out, root / where / src.stem / host)
        for path in root.rglob("*"):
            path.chmod(0o755)
        lib = root / "lib"
        yield Built(root, lib / "libgeco_preload.so", lib / "spy_exec.so",
                    lib / "other_preload.so")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------
# the fake gecod
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One JOB_STARTED as the fake gecod received it."""

    job: int
    task: int
    pid: int
    peer_pid: int | None  # SO_PEERCRED (Unix socket only)
    nonce: bytes


ANSWERS = ("ok", "refused", "busy_once", "close_once", "bad_mac", "wrong_nonce", "other_job",
           "stale", "silent", "close", "version")


class FakeGecod:
    """Serves one connection at a time on ``addr`` and answers each request per ``answer``.

    ``ok`` ACK OK; ``refused`` ACK REFUSED; ``busy_once`` BUSY first, then OK;
    ``close_once`` hangs up without a reply first (a full connection table), then OK;
    ``bad_mac`` an OK ack with one MAC bit flipped; ``wrong_nonce`` an OK ack
    bound to another request; ``other_job`` an OK ack for job+1; ``stale`` an OK
    ack stamped 60 s ago; ``silent`` never answers (waits for the client to
    give up); ``close`` hangs up without a reply; ``version`` an OK ack in
    protocol version 2.
    """

    def __init__(self, addr: address.Address, key: bytes, answer: str) -> None:
        assert answer in ANSWERS, answer
        self.key = key
        self.answer = answer
        self.requests: list[Request] = []
        self.errors: list[str] = []
        self._cache = ReplayCache.for_skew(30.0)
        self._stop = threading.Event()
        self._listener = address.listen(addr)
        self._listener.settimeout(0.05)
        self.addr = addr
        if addr.family == "tcp" and addr.port == 0:
            self.addr = address.Address("tcp", port=self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._stop.set()
        self._thread.join(10)
        self._listener.close()
        address.unlink_socket(self.addr)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                try:
                    self._handle(conn)
                except Exception as exc:  # reported by the test, never lost in the thread
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        peer_pid = None
        if conn.family == socket.AF_UNIX:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            peer_pid = struct.unpack("3i", creds)[0]
        frame = decode(read_frame(conn, time.monotonic() + 5), self.key,
                       replay=self._cache)
        msg = frame.message
        assert frame.type is MsgType.JOB_STARTED and isinstance(msg, JobStarted), frame
        self.requests.append(Request(msg.job_id, msg.task_id, msg.pid, peer_pid, frame.nonce))
        answer = self.answer
        if answer in ("busy_once", "close_once"):
            answer = answer.removesuffix("_once") if len(self.requests) == 1 else "ok"
        if answer == "close":
            return
        if answer == "silent":
            conn.settimeout(30)
            with contextlib.suppress(OSError):
                while conn.recv(64):  # until the client gives up and closes
                    pass
            return
        status = {"refused": AckStatus.REFUSED, "busy": AckStatus.BUSY}.get(answer, AckStatus.OK)
        job = msg.job_id + 1 if answer == "other_job" else msg.job_id
        nonce = secrets.token_bytes(16) if answer == "wrong_nonce" else frame.nonce
        ts_ns = time.time_ns() - 60 * 10**9 if answer == "stale" else None
        version = 2 if answer == "version" else VERSION
        reply = encode(MsgType.ACK, Ack(job, msg.task_id, status, nonce), self.key,
                       ts_ns=ts_ns, version=version)
        if answer == "bad_mac":
            reply = reply[:-1] + bytes([reply[-1] ^ 1])
        conn.sendall(reply)


# ---------------------------------------------------------------------------
# a fake execd node: key, config, job directory, fake gecod
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Dump:
    """What dump_args (the exec'd program) reported."""

    pid: int
    argv: list[bytes]
    envp: list[bytes]


@dataclass(frozen=True)
class Outcome:
    """One run of a test program: its exit, stdout split up, and stderr."""

    returncode: int
    pid: int | None  # the first "pid=" line: the exec'ing process
    ptrs: tuple[str, str] | None  # exec_variant ... ptrs: its argv and envp arrays
    dump: Dump | None  # the exec'd program's report, if it ran
    rest: bytes  # stdout after those ("rc=-1 errno=EAGAIN\n", ...)
    stderr: str


def _take_line(data: bytes, prefix: bytes) -> tuple[bytes | None, bytes]:
    if not data.startswith(prefix):
        return None, data
    line, _, rest = data.partition(b"\n")
    return line[len(prefix):], rest


def _take_int(data: bytes, prefix: bytes) -> tuple[int | None, bytes]:
    value, rest = _take_line(data, prefix)
    return (None if value is None else int(value)), rest


def _take_strings(data: bytes, count: int) -> tuple[list[bytes], bytes]:
    items = []
    for _ in range(count):
        item, _, data = data.partition(b"\0")
        items.append(item)
    return items, data


def parse_output(returncode: int, stdout: bytes, stderr: bytes) -> Outcome:
    """Split exec_variant's stdout: its pid, dump_args' report if it ran, the rest."""
    pid, data = _take_int(stdout, b"pid=")
    ptrs = None
    raw, data = _take_line(data, b"ptrs ")
    if raw is not None:
        found = re.fullmatch(rb"argv=(0x[0-9a-f]+) envp=(0x[0-9a-f]+)", raw)
        assert found, raw
        ptrs = (found[1].decode(), found[2].decode())
    dump = None
    dump_pid, after = _take_int(data, b"pid=")
    if dump_pid is not None:
        argc, after = _take_int(after, b"argc=")
        assert argc is not None, stdout
        argv, after = _take_strings(after, argc)
        envc, after = _take_int(after, b"envc=")
        assert envc is not None, stdout
        envp, data = _take_strings(after, envc)
        dump = Dump(dump_pid, argv, envp)
    return Outcome(returncode, pid, ptrs, dump, data, stderr.decode())


@dataclass
class Node:
    """One test's world: key, config, job directory with ``environment``, gecod address."""

    built: Built
    root: Path
    key: bytes
    key_file: Path
    sock: Path
    job_dir: Path
    bin_dir: Path  # holds sge_shepherd (a copy of dump_args)
    conf_file: Path
    gecods: list[FakeGecod] = field(default_factory=list)

    @property
    def shepherd(self) -> Path:
        """The fake sge_shepherd."""
        return self.bin_dir / "sge_shepherd"

    def write_conf(self, *, policy: str = "refuse", timeout_ms: int = 3000,
                   sock: str | None = None, extra: str = "") -> Path:
        """Write the preload config (root-owned, 0644) and return its path."""
        self.conf_file.write_text(
            f"# test config\n"
            f"socket={sock or 'path:' + str(self.sock)}\n"
            f"key_file={self.key_file}\n"
            f"timeout_ms={timeout_ms}\n"
            f"policy={policy}        # refuse | allow\n"
            f"exec_filter=sge_shepherd\n{extra}")
        self.conf_file.chmod(0o644)
        return self.conf_file

    def environment(self, text: str) -> None:
        """Write the job's ``environment`` file (what sge_execd leaves in active_jobs)."""
        (self.job_dir / "environment").write_text(text)

    def gecod(self, answer: str, addr: address.Address | None = None) -> FakeGecod:
        """Start a fake gecod (stopped at the end of the test)."""
        fake = FakeGecod(addr or address.Address("unix", path=str(self.sock)), self.key, answer)
        self.gecods.append(fake)
        return fake

    def env(self, preload: bool | list[Path] = True, conf: Path | None = None) -> dict[str, str]:
        """The environment of a test program, with or without the preload."""
        env = dict(BASE_ENV)
        if preload:
            libs = [self.built.lib] if preload is True else preload
            env["LD_PRELOAD"] = " ".join(str(p) for p in libs)
            env["GECO_PRELOAD_CONF"] = str(conf or self.conf_file)
        return env

    def run(self, *argv: str | Path, preload: bool | list[Path] = True,
            conf: Path | None = None, cwd: Path | None = None,
            user: int | None = None, groups: tuple[int, ...] = (),
            cgroup: Path | None = None) -> Outcome:
        """Run a test program (in the job directory) and parse what it printed.

        ``user``: run it with that uid/gid (real and effective) and the supplementary
        ``groups`` (none by default) via setpriv, which itself runs without the preload.
        ``cgroup``: a v1 cgroup directory the program is moved into first (by a shell
        running as root, without the preload), as PAM's module moves an ssh session.
        """
        cmd = [str(a) for a in argv]
        env = self.env(preload, conf)
        if user is not None:
            group_opt = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", group_opt,
                   "env", "-i", *[f"{k}={v}" for k, v in env.items()], *cmd]
            env = self.env(False)
        if cgroup is not None:
            cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *cmd]
        proc = subprocess.run(cmd, capture_output=True, env=env, cwd=cwd or self.job_dir,
                              timeout=60, check=False)
        return parse_output(proc.returncode, proc.stdout, proc.stderr)

    def exec_variant(self, variant: str, target: str | Path, **kwargs: Any) -> Outcome:
        """Run exec_variant VARIANT TARGET with PATH = the sge_shepherd directory."""
        return self.run(self.built.prog("exec_variant"), variant, target, self.bin_dir, **kwargs)


@contextlib.contextmanager
def new_node(built: Built) -> Iterator[Node]:
    """A fresh node: root-owned 0600 key, active config (policy refuse), job 42.3; its
    fake gecods stopped (each must have met no error) and its directory removed after."""
    root = Path(tempfile.mkdtemp(prefix="geco-test-preload-node-"))
    root.chmod(0o755)
    key = secrets.token_bytes(32)
    key_file = root / "quarantine.key"
    key_file.write_bytes(key)
    key_file.chmod(0o600)
    os.chown(key_file, 0, 0)
    job_dir = root / "active_jobs" / "42.3"
    job_dir.mkdir(parents=True)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shutil.copy(built.prog("dump_args"), bin_dir / "sge_shepherd")
    for d in (root / "active_jobs", job_dir, bin_dir):
        d.chmod(0o755)
    n = Node(built, root, key, key_file, root / "gecod.sock", job_dir, bin_dir,
             root / "preload.conf")
    n.write_conf()
    n.environment("SGE_O_HOME=/home/u\nJOB_ID=42\nJOB_NAME=sleep\nSGE_TASK_ID=3\n")
    try:
        yield n
    finally:
        for fake in n.gecods:
            fake.close()
            assert not fake.errors, fake.errors
        shutil.rmtree(root, ignore_errors=True)
