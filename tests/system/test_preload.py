"""The exec() preload (``preload/``, built as ``libgeco_preload.so``) in real processes.

The library and the tiny C programs of ``tests/preload/`` are built once per
session by ``tests/preloadkit.py`` (which says what each program does). Each test
runs one of them under ``LD_PRELOAD`` on a fake execd node (:class:`Node`: a test
config, a root-owned 0600 test key, a job directory) against a fake gecod that
speaks the real protocol and answers as the test tells it to -- OK, REFUSED, a
forged MAC, another request's nonce, silence, ...

``geco_client.c`` itself is also built as a cffi extension (:class:`Client`), to
ask listeners forked here (:func:`listener`) as root or as uid 65534.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi
import pytest

from geco import jobfiles
from geco.config import Config
from geco.errors import ProtocolError
from geco.job import privatetmp
from geco.jobkey import JOB_ID_RULE, TASK_ID_RULE, JobKey
from geco.wire import address, preload_config
from geco.wire.frame import PUBLIC_KEY, Frame, decode, encode
from geco.wire.messages import (
    MAX_PAYLOAD,
    REPLY_MAX_TEXT,
    AckStatus,
    Adopt,
    AdoptReply,
    AdoptStage,
    MsgType,
    Starter,
    StarterReply,
)
from geco.wire.reader import read_frame
from tests.cgroup_testkit import parent_name
from tests.ckit import LIBGECO
from tests.preloadkit import (
    BASE_ENV,
    VARIANTS,
    Built,
    Dump,
    Node,
    Outcome,
    new_node,
    parse_output,
)

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test key must be owned by "
                       "root, and some tests switch users with setpriv"),
]

# the variants that take argv (and envp) as arrays, which must reach libc as the same pointers
ARRAY_VARIANTS = ("execve", "execv", "execvp", "execvpe", "fexecve")
NOBODY = 65534

# what exec_variant hands to its target (see tests/preload/exec_variant.c)
TARGET_ARGV = [b"argv0-of-target", b"", b"two words", b"tab\there", b"no=split", b"last"]


def target_env(path_dir: Path | str) -> list[bytes]:
    """The environment exec_variant gives its target, PATH included."""
    return [b"A=1", b"NOEQUALS", b"", b"B==x", b"C=multi\nline",
            b"PATH=" + os.fsencode(path_dir), b"Z="]


@pytest.fixture
def node(built: Built) -> Iterator[Node]:
    """A fresh node: root-owned 0600 key, active config (policy refuse), job 42.3."""
    with new_node(built) as n:
        yield n


def refused_line(node: Node, pid: int | None, why: str, job: str = "42.3") -> str:
    """The one stderr line of a refused shepherd exec."""
    return (f"geco: sge_shepherd (pid {pid}, job {job}): quarantine by gecod at "
            f"path:{node.sock} failed: {why}; exec refused (policy=refuse, errno EAGAIN)\n")


# ---------------------------------------------------------------------------
# the library itself
# ---------------------------------------------------------------------------

def test_only_the_exec_wrappers_are_exported(built: Built) -> None:
    """Given the built library, nm -D lists exactly the eight exec functions and the four
    ways sshd runs a program (for ssh sessions) as defined."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(built.lib)], capture_output=True,
                         text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert names == sorted((*VARIANTS, "popen", "posix_spawn", "posix_spawnp", "system"))


# ---------------------------------------------------------------------------
# non-matching execs: untouched
# ---------------------------------------------------------------------------

def _cases(node: Node) -> dict[str, tuple[Path, str | None]]:
    """Target per case and the errno exec_variant reports (None: the target runs)."""
    missing = node.root / "no" / "such-program"
    no_exec_bit = node.root / "plain-file"
    no_exec_bit.write_text("data\n")
    no_exec_bit.chmod(0o644)
    no_shebang = node.root / "no-shebang"
    no_shebang.write_text("echo ran-by-sh; exit 7\n")
    no_shebang.chmod(0o755)
    return {"runs": (node.built.prog("dump_args"), None), "ENOENT": (missing, "ENOENT"),
            "EACCES": (no_exec_bit, "EACCES"), "ENOEXEC": (no_shebang, "ENOEXEC")}


def _normalize(out: Outcome) -> tuple[int, Dump | None, bytes, str]:
    dump = out.dump and Dump(0, out.dump.argv, out.dump.envp)
    return out.returncode, dump, out.rest, out.stderr


@pytest.mark.parametrize("case", ["runs", "ENOENT", "EACCES", "ENOEXEC"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_non_matching_exec_is_identical_with_and_without_the_preload(
        node: Node, variant: str, case: str) -> None:
    """Given an exec of a program that is not sge_shepherd,
    when it runs with and without the preload,
    then the target gets the same argv and environment byte for byte (empty strings,
    entries without '=', newlines), or the call fails with the same rc and errno,
    and the preload prints nothing (gecod is not even listening)."""
    target, expected_errno = _cases(node)[case]
    without = node.exec_variant(variant, target, preload=False)
    with_preload = node.exec_variant(variant, target)
    assert _normalize(with_preload) == _normalize(without)
    assert with_preload.stderr == ""
    if expected_errno is None:
        assert with_preload.dump is not None
        assert with_preload.dump.pid == with_preload.pid  # exec keeps the pid
        assert with_preload.dump.argv == TARGET_ARGV
        assert with_preload.dump.envp == target_env(node.bin_dir)
    elif case == "ENOEXEC" and variant in ("execvp", "execvpe", "execlp"):
        # glibc's p-variants run a script without #! through /bin/sh instead
        assert with_preload.rest == b"ran-by-sh\n"
        assert with_preload.returncode == 7
    else:
        # fexecve gets the fd of open(target): -1 for a missing file, EINVAL
        errno_name = "EINVAL" if (variant, case) == ("fexecve", "ENOENT") else expected_errno
        assert with_preload.rest == f"rc=-1 errno={errno_name}\n".encode()


@pytest.mark.parametrize("variant", ["execvp", "execvpe", "execlp"])
def test_path_search_is_unchanged(node: Node, variant: str) -> None:
    """Given a bare program name, when a p-variant searches PATH with the preload,
    then it finds the program, or fails with ENOENT, exactly as without it."""
    shutil.copy(node.built.prog("dump_args"), node.bin_dir / "dump_args")
    for name, runs in (("dump_args", True), ("geco-no-such-program", False)):
        without = node.exec_variant(variant, name, preload=False)
        with_preload = node.exec_variant(variant, name)
        assert _normalize(with_preload) == _normalize(without)
        assert (with_preload.dump is not None) is runs
        if not runs:
            assert with_preload.rest == b"rc=-1 errno=ENOENT\n"


@pytest.mark.parametrize("variant", ["execve", "execv"])
def test_null_path_fails_with_efault_not_a_crash(node: Node, variant: str) -> None:
    """Given execve/execv with a NULL path, when the preload is loaded,
    then the call fails with EFAULT as without it (the wrapper does not dereference it)."""
    without = node.exec_variant(variant, "NULL", preload=False)
    with_preload = node.exec_variant(variant, "NULL")
    assert with_preload.rest == without.rest == b"rc=-1 errno=EFAULT\n"
    assert with_preload.returncode == 0



@pytest.mark.parametrize("matching", [False, True], ids=["plain", "sge_shepherd"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_real_function_gets_callers_errno_and_arrays(node: Node, variant: str,
                                                     matching: bool) -> None:
    """Given a caller that set errno=EDOM, when the wrapper calls through to the real
    function (spy_exec.so, loaded under the preload) -- after a full quarantine round
    trip for sge_shepherd --, then that function sees errno EDOM and the caller's own
    argv/envp arrays (execl*: argv is built like glibc does, envp is still the caller's)."""
    if matching:
        node.gecod("ok")
    target = node.shepherd if matching else node.built.prog("dump_args")
    out = node.run(node.built.prog("exec_variant"), variant, target, node.bin_dir, "ptrs",
                   preload=[node.built.lib, node.built.spy])
    assert out.dump is not None and out.ptrs is not None
    argv_p, envp_p = out.ptrs
    called = {"execl": "execve", "execle": "execve", "execlp": "execvpe"}.get(variant, variant)
    envp_seen = "-" if variant in ("execv", "execvp") else envp_p
    if variant in ARRAY_VARIANTS:
        assert out.stderr == f"spy {called} errno=EDOM argv={argv_p} envp={envp_seen}\n"
    else:
        assert re.fullmatch(rf"spy {called} errno=EDOM argv=0x[0-9a-f]+ envp={envp_seen}\n",
                            out.stderr), out.stderr
    assert out.dump.argv == TARGET_ARGV


# ---------------------------------------------------------------------------
# sge_shepherd: quarantine first
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_shepherd_exec_asks_gecod_for_its_own_pid_then_runs(node: Node, variant: str) -> None:
    """Given a cwd whose environment names job 42 task 3 and a gecod that answers OK,
    when the process execs sge_shepherd (by path; p-variants by name through PATH),
    then gecod got JOB_STARTED(42, 3, pid) from that very process (SO_PEERCRED), and the
    shepherd ran with that pid and the untouched argv and environment."""
    fake = node.gecod("ok")
    target = "sge_shepherd" if variant in ("execvp", "execvpe", "execlp") else node.shepherd
    out = node.exec_variant(variant, target)
    assert out.stderr == ""
    assert out.dump is not None, out
    assert out.dump.pid == out.pid
    assert out.dump.argv == TARGET_ARGV
    assert out.dump.envp == target_env(node.bin_dir)
    assert [(r.job, r.task, r.pid, r.peer_pid) for r in fake.requests] == [
        (42, 3, out.pid, out.pid)]


def test_a_shepherd_of_a_job_with_a_private_tmp_runs_inside_it_where_execd_put_it(
        node: Node) -> None:
    """Given job 42.3's namespace pinned (geco-mntns, as gecod makes it with [tmp]
    private) and job_mntns in the config, when a process in the job's spool dir execs
    sge_shepherd, then the shepherd sees the job's own /tmp (not the node's), in the
    same working directory; a job with no pin runs with the node's /tmp; a pin that is
    not a namespace is refused by the policy, in one line."""
    cfg = Config(state_dir=node.root / "state")
    key = JobKey(42, 3)
    where = privatetmp.make(cfg, key, 64 << 20, 0)
    (where.tmp / "mine").write_text("job\n")
    # the job's spool dir and the shepherd where sge_execd's are, outside /tmp (the test
    # node's are in it: gone from sight once the namespace is entered)
    spool = Path(tempfile.mkdtemp(dir="/run", prefix="geco-test-spool-"))
    shutil.copy(node.job_dir / "environment", spool / "environment")
    shepherd = spool / "bin" / "sge_shepherd"
    shepherd.parent.mkdir()
    shepherd.write_text("#!/bin/sh\n/bin/ls -A /tmp; pwd\n")
    shepherd.chmod(0o755)
    node.gecod("ok")
    try:
        node.write_conf(extra=f"job_mntns={jobfiles.pins_dir(cfg.state_dir)}\n")
        inside = node.exec_variant("execv", shepherd, cwd=spool)
        assert inside.stderr == "", inside
        assert inside.rest.decode().split("\n")[:2] == ["mine", str(spool)], inside
        node.write_conf(extra=f"job_mntns={node.root / 'no-pins'}\n")
        outside = node.exec_variant("execv", shepherd, cwd=spool)
        assert "mine" not in outside.rest.decode().split("\n"), outside
    finally:
        privatetmp.remove(cfg, key)
        subprocess.run(["umount", "-l", str(jobfiles.pins_dir(cfg.state_dir))], check=False,
                       capture_output=True)
        shutil.rmtree(spool)
    (node.root / "fake").mkdir()
    (node.root / "fake" / "42.3").write_text("not a namespace\n")
    node.write_conf(extra=f"job_mntns={node.root / 'fake'}\n")
    refused = node.exec_variant("execv", node.shepherd)
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "cannot enter the job's private /tmp (setns " in refused.stderr, refused.stderr


def test_fexecve_of_an_unlinked_shepherd_is_still_a_shepherd(node: Node) -> None:
    """Given an open fd of sge_shepherd whose file was then unlinked (/proc shows
    "sge_shepherd (deleted)"), when it is fexecve()d, then it is quarantined and runs."""
    fake = node.gecod("ok")
    out = node.exec_variant("fexecve-deleted", node.shepherd)
    assert not node.shepherd.exists()
    assert out.dump is not None and out.stderr == ""
    assert [(r.job, r.task, r.pid) for r in fake.requests] == [(42, 3, out.pid)]


def test_request_is_sent_and_acked_before_the_execve(node: Node) -> None:
    """Given a gecod that answers OK, when the shepherd exec runs under strace,
    then the same process connects to gecod's socket, sends the request and receives
    the ack before its execve of sge_shepherd."""
    node.gecod("ok")
    trace = node.root / "strace.out"
    env = node.env()
    argv = ["strace", "-f", "-qq", "-o", str(trace), "-s", "256",
            "-e", "trace=connect,sendto,write,recvfrom,read,execve",
            "-E", f"LD_PRELOAD={env['LD_PRELOAD']}",
            "-E", f"GECO_PRELOAD_CONF={env['GECO_PRELOAD_CONF']}",
            str(node.built.prog("exec_variant")), "execve", str(node.shepherd), str(node.bin_dir)]
    proc = subprocess.run(argv, capture_output=True, env=BASE_ENV, cwd=node.job_dir,
                          timeout=60, check=False)
    out = parse_output(proc.returncode, proc.stdout, proc.stderr)
    assert out.dump is not None and out.dump.pid == out.pid, proc.stderr
    lines = trace.read_text().splitlines()

    def first(pattern: str) -> int:
        for i, line in enumerate(lines):
            if re.match(rf"{out.pid} +{pattern}", line):
                return i
        raise AssertionError(f"no {pattern!r} by pid {out.pid} in:\n" + "\n".join(lines))

    connect = first(rf'connect\(\d+, \{{sa_family=AF_UNIX, sun_path="{re.escape(str(node.sock))}"')
    send = first(r'sendto\(\d+, "GECQ\\1\\1')
    ack = first(r'recvfrom\(\d+, "GECQ\\1\\2')
    execve = first(rf'execve\("{re.escape(str(node.shepherd))}".* = 0$')
    assert connect < send < ack < execve


def test_forked_child_asks_for_itself_not_its_parent(node: Node) -> None:
    """Given a parent that forks, when the child execs sge_shepherd,
    then the request names the child's pid (the process that becomes the shepherd)."""
    fake = node.gecod("ok")
    proc = subprocess.run([str(node.built.prog("fork_exec")), str(node.shepherd)],
                          capture_output=True, env=node.env(), cwd=node.job_dir, timeout=60,
                          check=True)
    parent, _, rest = proc.stdout.partition(b"\n")
    child = re.search(rb"child=(\d+) exit=0\n$", rest)
    assert child is not None, proc.stdout
    assert proc.stderr == b""
    assert [(r.pid, r.peer_pid) for r in fake.requests] == [(int(child[1]), int(child[1]))]
    assert int(child[1]) != int(parent.removeprefix(b"parent="))


def test_threads_forking_and_execing_concurrently(node: Node) -> None:
    """Given 4 threads that fork and exec sge_shepherd or /bin/true 12 times each while
    another thread mallocs and another fails execve() in a loop, when all run under the
    preload, then every child exits 0, every shepherd child asked gecod for itself,
    and every failing execve reported ENOENT."""
    fake = node.gecod("ok")
    shutil.copy("/bin/true", node.shepherd)
    proc = subprocess.run([str(node.built.prog("mt_exec")), str(node.shepherd), "/bin/true",
                           "4", "12"], capture_output=True, env=node.env(), cwd=node.job_dir,
                          timeout=120, check=False)
    summary = re.fullmatch(rb"forks=48 failed=0 enoent=(\d+) bad_errno=0\n", proc.stdout)
    assert summary is not None and proc.returncode == 0, (proc.stdout, proc.stderr)
    assert int(summary[1]) > 0
    assert proc.stderr == b""
    assert len(fake.requests) == 24
    assert all(r.pid == r.peer_pid and (r.job, r.task) == (42, 3) for r in fake.requests)
    assert len({r.pid for r in fake.requests}) == 24


def test_tcp_address(node: Node) -> None:
    """Given gecod on a loopback TCP port (socket=port:N), when sge_shepherd is exec'd,
    then the request goes there and the shepherd runs."""
    fake = node.gecod("ok", address.Address("tcp", port=0))
    node.write_conf(sock=f"port:{fake.addr.port}")
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is not None and out.stderr == ""
    assert [(r.job, r.task, r.pid) for r in fake.requests] == [(42, 3, out.pid)]


def _free_service() -> tuple[str, int]:
    """A TCP service name from /etc/services whose loopback port is free right now."""
    for line in Path("/etc/services").read_text().splitlines():
        found = re.match(r"([a-z][\w-]*)\s+(\d+)/tcp", line)
        if not found or int(found[2]) < 1024:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", int(found[2])))
            except OSError:
                continue
        return found[1], int(found[2])
    pytest.fail("no /etc/services tcp entry >= 1024 with a free port (package netbase)")


def test_service_name_address(node: Node) -> None:
    """Given socket=service:<name>, when the library loads, then it resolves the name
    through /etc/services once, and the request reaches gecod on that loopback port."""
    name, port = _free_service()
    fake = node.gecod("ok", address.Address("tcp", port=port))
    node.write_conf(sock=f"service:{name}")
    out = node.exec_variant("execv", node.shepherd)
    assert out.dump is not None and out.stderr == ""
    assert [r.pid for r in fake.requests] == [out.pid]


@pytest.mark.parametrize("answer", ["busy_once", "close_once"])
def test_busy_or_a_closed_connection_is_retried_with_a_new_request(node: Node,
                                                                   answer: str) -> None:
    """Given a gecod that answers BUSY once, or closes the connection unanswered once (as
    it does when its connection table is full), and OK then, when sge_shepherd is exec'd,
    then the preload asks again (fresh nonce) within its deadline and the shepherd runs."""
    fake = node.gecod(answer)
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is not None and out.stderr == ""
    assert [r.pid for r in fake.requests] == [out.pid, out.pid]
    assert fake.requests[0].nonce != fake.requests[1].nonce


FAILURES = {
    "refused": "gecod answered REFUSED (its journal says why)",
    "bad_mac": "reply rejected: MAC mismatch (forged, corrupted, or another key)",
    "wrong_nonce": "reply rejected: ack does not answer this request (nonce mismatch)",
    "other_job": "the ack names job 43.3",
    "stale": "reply rejected: timestamp outside the allowed clock skew",
    "silent": "no reply within timeout_ms=300 (waiting for reply)",
    "close": "gecod closed the connection without a complete reply (after N attempts)",
    "version": "reply rejected: unsupported protocol version: gecod speaks protocol 1; "
               "upgrade the preload/gecod",
    "no_gecod": "cannot connect: ENOENT (is gecod running?) (after N attempts)",
}


@pytest.mark.parametrize("policy", ["refuse", "allow"])
@pytest.mark.parametrize("answer", FAILURES)
def test_failed_quarantine_follows_the_policy(node: Node, answer: str, policy: str) -> None:
    """Given a gecod that does not acknowledge (refuses, forges, replays, stays silent,
    is not there...), when sge_shepherd is exec'd,
    then with policy=refuse the exec fails with EAGAIN and the shepherd does not run,
    and with policy=allow it runs; either way one "geco:" line says why."""
    # a short deadline where it is what the test waits out; else room for a slow machine
    node.write_conf(policy=policy,
                    timeout_ms=300 if answer in ("silent", "close", "no_gecod") else 5000)
    fake = None if answer == "no_gecod" else node.gecod(answer)
    out = node.exec_variant("execve", node.shepherd)
    stderr = re.sub(r"after \d+ attempts", "after N attempts", out.stderr)
    if policy == "refuse":
        assert out.dump is None
        assert out.rest == b"rc=-1 errno=EAGAIN\n"
        assert stderr == refused_line(node, out.pid, FAILURES[answer])
    else:
        assert out.dump is not None and out.dump.pid == out.pid
        assert stderr == (f"geco: sge_shepherd (pid {out.pid}, job 42.3): quarantine by gecod "
                          f"at path:{node.sock} failed: {FAILURES[answer]}; starting it "
                          f"without quarantine (policy=allow)\n")
    if fake is not None:
        asked = {(r.job, r.task, r.pid) for r in fake.requests}
        assert asked == {(42, 3, out.pid)}
        # one request, or (a hang-up) one per attempt within the deadline
        assert len(fake.requests) == 1 or (answer == "close" and len(fake.requests) > 1)


# ---------------------------------------------------------------------------
# the job's environment file
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "job", "task"), [
    ("JOB_ID=42\nSGE_TASK_ID=undefined\n", 42, 1),
    ("JOB_ID=42\n", 42, 1),
    ("SGE_TASK_ID=7\nJOB_ID=366474", 366474, 7),  # no final newline
    ("JOB_ID=1\nLONG=" + "y" * 100_000 + "\nJOB_ID=42\nSGE_TASK_ID=9\n", 42, 9),  # later wins
    ("JOB_IDX=5\nMY_JOB_ID=6\nJOB_ID=9999999999999999999\n", 10**19 - 1, 1),
    ("JOB_ID=42\nSGE_TASK_ID=\n", 42, 1),
], ids=["undefined-task", "no-task", "no-newline", "long-line-later-wins", "look-alikes",
        "empty-task"])
def test_job_and_task_come_from_the_environment_file(node: Node, text: str, job: int,
                                                     task: int) -> None:
    """Given an environment file in the cwd, when sge_shepherd is exec'd,
    then the request names its JOB_ID and SGE_TASK_ID ("undefined", empty or missing: 1;
    every case of the rule: tests/vectors/job_identity.json)."""
    fake = node.gecod("ok")
    node.environment(text)
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is not None and out.stderr == ""
    assert [(r.job, r.task) for r in fake.requests] == [(job, task)]


@pytest.mark.parametrize(("text", "why"), [
    (None, "cannot open it: ENOENT"),
    ("", "it has no JOB_ID= line"),
    ("SGE_TASK_ID=3\n", "it has no JOB_ID= line"),
    ("JOB_ID=abc\n", JOB_ID_RULE),
    ("JOB_ID=0\n", JOB_ID_RULE),
    ("JOB_ID=18446744073709551616\n", JOB_ID_RULE),
    ("JOB_ID= 42\n", JOB_ID_RULE),
    ("JOB_ID=42\nSGE_TASK_ID=x\n", TASK_ID_RULE),
    ("JOB_ID=42\nSGE_TASK_ID=-1\n", TASK_ID_RULE),
    ("dir", "cannot read it as a regular file: EINVAL"),
], ids=["missing", "empty", "no-job", "letters", "zero", "overflow", "blank", "bad-task",
        "negative-task", "directory"])
def test_unreadable_job_id_follows_the_policy(node: Node, text: str | None, why: str) -> None:
    """Given no usable job id in the cwd's environment file, when sge_shepherd is
    exec'd with policy=refuse, then nothing is sent, the exec fails with EAGAIN, and
    the message names the file and what is wrong with it."""
    fake = node.gecod("ok")
    env_file = node.job_dir / "environment"
    env_file.unlink()
    if text == "dir":
        env_file.mkdir()
    elif text is not None:
        env_file.write_text(text)
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is None and out.rest == b"rc=-1 errno=EAGAIN\n"
    assert out.stderr == (f"geco: sge_shepherd (pid {out.pid}): cannot tell its job: "
                          f"{node.job_dir}/environment: {why}; exec refused (policy=refuse, "
                          f"errno EAGAIN)\n")
    assert fake.requests == []


# ---------------------------------------------------------------------------
# configuration: inert when missing or broken, never breaking the host
# ---------------------------------------------------------------------------

def test_missing_config_passes_everything_and_warns_at_a_job_start(node: Node) -> None:
    """Given no config file, when a program loads the preload, then it says nothing and
    passes execs through; a shepherd exec still runs, with one warning naming the fix."""
    missing = node.root / "absent.conf"
    plain = node.exec_variant("execve", node.built.prog("dump_args"), conf=missing)
    assert plain.dump is not None and plain.stderr == ""
    shepherd = node.exec_variant("execve", node.shepherd, conf=missing)
    assert shepherd.dump is not None
    assert shepherd.stderr == (f"geco: sge_shepherd (pid {shepherd.pid}) starts without "
                               f"quarantine: preload inactive: config {missing}: ENOENT "
                               f"(write it with: geco preload-config)\n")


def _inert_line(reason: str) -> str:
    return f"geco: preload inactive, every exec passes through unchecked: {reason}\n"


# id: (a config line to add, or a change to make; the reason the preload gives)
BROKEN = {
    "bad-policy": ("policy=maybe",
                   "config {conf}: line 7: policy must be refuse or allow, got 'maybe'"),
    "zero-timeout": ("timeout_ms=0", "config {conf}: line 7: timeout_ms must be a number of "
                                     "milliseconds in 1..3600000, got '0'"),
    "bad-socket": ("socket=tcp://localhost",
                   "config {conf}: line 7: socket 'tcp://localhost': expected path:<absolute "
                   "path>, port:<1-65535>, service:<name|port>, a port number or an absolute "
                   "path"),
    "unknown-service": ("socket=service:geco-no-such-service",
                        "config {conf}: line 7: socket 'service:geco-no-such-service': unknown "
                        "TCP service name (not in /etc/services)"),
    "empty-filter-name": ("exec_filter=sge_shepherd,,x",
                          "config {conf}: line 7: exec_filter must be comma-separated program "
                          "basenames (no '/', none empty), got ''"),
    "bad-log": ("log=loud", "config {conf}: line 7: log must be stderr, syslog or none, got "
                            "'loud'"),
    "bad-session-policy": ("session_policy=allow-all", "config {conf}: line 7: session_policy "
                                                       "must be refuse, in-job or allow, got "
                                                       "'allow-all'"),
    "relative-job-cgroup": ("job_cgroups=/GECO,GECO",
                            "config {conf}: line 7: job_cgroups must be 1 to 4 comma-separated "
                            "absolute cgroup paths of at most 255 bytes, got '/GECO,GECO'"),
    "five-job-cgroups": ("job_cgroups=/a,/b,/c,/d,/e",
                         "config {conf}: line 7: job_cgroups must be 1 to 4 comma-separated "
                         "absolute cgroup paths of at most 255 bytes, got '/a,/b,/c,/d,/e'"),
    "bad-admin-uid": ("session_admin_uids=0,4294967295",
                      "config {conf}: line 7: session_admin_uids must be at most 64 "
                      "comma-separated ids in 0..4294967294 (or nothing), got '0,4294967295'"),
    "bad-admin-gid": ("session_admin_gids=10,",
                      "config {conf}: line 7: session_admin_gids must be at most 64 "
                      "comma-separated ids in 0..4294967294 (or nothing), got '10,'"),
    "relative-bypass": ("session_bypass=ssh-bypass", "config {conf}: line 7: session_bypass "
                                                     "must be an absolute path, got "
                                                     "'ssh-bypass'"),
    "relative-mntns": ("job_mntns=mntns", "config {conf}: line 7: job_mntns must be an "
                                          "absolute path, got 'mntns'"),
    "no-equals": ("just words", "config {conf}: line 7: expected key=value, got 'just words'"),
    "relative-key-file": ("key_file=relative.key", "config {conf}: line 7: key_file must be an "
                                                   "absolute path, got 'relative.key'"),
    "conf-mode-666": ("", "config {conf}: must be a regular file owned by root and not "
                          "writable by group or others"),
    "key-mode-644": ("", "key file {key} must be a regular file owned by root with mode 0600 "
                         "or 0400, got uid 0 mode 0644 (fix: chown root:root {key}; chmod 600 "
                         "{key})"),
    "key-owner-nobody": ("", "key file {key} must be a regular file owned by root with mode "
                             "0600 or 0400, got uid 65534 mode 0600 (fix: chown root:root "
                             "{key}; chmod 600 {key})"),
    "key-16-bytes": ("", "key file {key} must hold exactly 32 bytes, got 16 (regenerate it: "
                         "geco keygen --force, then restart gecod and sge_execd)"),
    "key-missing": ("", "key file {key}: ENOENT (create it with: geco keygen)"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_setup_makes_the_preload_inert_and_says_so_once(node: Node, case: str) -> None:
    """Given a broken config or key file, when a program loads the preload,
    then it says so once at load (and again at a job start), passes every exec through,
    and never contacts gecod."""
    fake = node.gecod("ok")
    line, reason = BROKEN[case]
    node.write_conf(extra=line + "\n" if line else "")
    if case == "conf-mode-666":
        node.conf_file.chmod(0o666)
    elif case == "key-mode-644":
        node.key_file.chmod(0o644)
    elif case == "key-owner-nobody":
        os.chown(node.key_file, NOBODY, NOBODY)
    elif case == "key-16-bytes":
        node.key_file.write_bytes(node.key[:16])
    elif case == "key-missing":
        node.key_file.unlink()
    text = reason.format(conf=node.conf_file, key=node.key_file)
    plain = node.exec_variant("execve", node.built.prog("dump_args"))
    assert plain.dump is not None
    assert plain.stderr == _inert_line(text)
    shepherd = node.exec_variant("execve", node.shepherd)
    assert shepherd.dump is not None
    assert shepherd.stderr == _inert_line(text) + (
        f"geco: sge_shepherd (pid {shepherd.pid}) starts without quarantine: preload "
        f"inactive: {text}\n")
    assert fake.requests == []


def test_unknown_keys_are_named_and_ignored(node: Node) -> None:
    """Given a config with keys this preload does not know (a newer renderer), when it
    loads, then it names the first and counts the rest, and still quarantines."""
    fake = node.gecod("ok")
    node.write_conf(extra="colour=blue\nmax_skew_ms=5000\nshape=round\nsize=9\n")
    out = node.exec_variant("execve", node.shepherd)
    assert out.stderr == (f"geco: ignored unknown key 'colour' on line 7 and 2 more unknown "
                          f"key(s) (in {node.conf_file})\n")
    assert out.dump is not None and [r.pid for r in fake.requests] == [out.pid]


def test_unprivileged_process_is_quietly_inert(node: Node) -> None:
    """Given a process of another user (it cannot read the root-only key), when it loads
    the preload, then it says nothing at load, and a shepherd exec runs with a warning
    that names the key file and why."""
    fake = node.gecod("ok")
    plain = node.exec_variant("execve", node.built.prog("dump_args"), user=NOBODY)
    assert plain.dump is not None and plain.stderr == ""
    shepherd = node.exec_variant("execve", node.shepherd, user=NOBODY)
    assert shepherd.dump is not None
    assert shepherd.stderr == (
        f"geco: sge_shepherd (pid {shepherd.pid}) starts without quarantine: preload "
        f"inactive: key file {node.key_file}: EACCES (the preload reads it as root: load it "
        f"into sge_execd started by root)\n")
    assert fake.requests == []


def _fifo_opened(fifo: Path, data: bytes) -> tuple[threading.Thread, list[bool]]:
    """A thread that opens ``fifo`` for writing (it blocks until a reader opens it),
    writes ``data`` and records that it got through."""
    got: list[bool] = []

    def write() -> None:
        fd = os.open(fifo, os.O_WRONLY)
        got.append(True)
        with contextlib.suppress(BrokenPipeError):
            os.write(fd, data)
        os.close(fd)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread, got


def _release(fifo: Path, thread: threading.Thread) -> None:
    """Let a writer still blocked in open() go (a reader of our own), and join it."""
    if thread.is_alive():
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        thread.join(timeout=30)
        os.close(fd)


def test_outside_sge_execd_and_sshd_the_preload_reads_no_config_or_key(node: Node) -> None:
    """Given a program that is not sge_execd or sshd with LD_PRELOAD set, and a config or a
    key file that is a FIFO (opening it would block the program until someone writes),
    when it execs sge_shepherd, then the shepherd runs untouched and unannounced, gecod
    hears nothing, and the program never blocked: it opened neither file. The same
    program as sge_execd does open the key (the FIFO's writer gets through)."""
    fake = node.gecod("ok")
    fifo_conf, fifo_key = node.root / "fifo.conf", node.root / "fifo.key"
    os.mkfifo(fifo_conf, 0o644)
    os.mkfifo(fifo_key, 0o600)
    key_conf = node.root / "key-fifo.conf"
    key_conf.write_text(node.conf_file.read_text().replace(str(node.key_file), str(fifo_key)))
    key_conf.chmod(0o644)
    program = node.built.plain("exec_variant")
    for conf in (fifo_conf, key_conf):
        out = node.run(program, "execve", node.shepherd, node.bin_dir, conf=conf)
        assert out.dump is not None and out.dump.pid == out.pid, out
        assert out.stderr == ""
    assert fake.requests == []

    thread, opened = _fifo_opened(fifo_key, node.key)
    try:
        host = node.exec_variant("execve", node.shepherd, conf=key_conf)
        # a reader that came (and went) lets the writer's open() return: the thread ends
        # at once then, and only stays blocked when nobody opened the FIFO
        thread.join(timeout=30)
        opened_by_the_program = list(opened)
    finally:
        _release(fifo_key, thread)
    assert opened_by_the_program == [True]
    assert host.stderr.startswith(f"geco: preload inactive, every exec passes through "
                                  f"unchecked: key file {fifo_key} must be a regular file")
    assert fake.requests == []


def test_log_none_is_silent(node: Node) -> None:
    """Given log=none, when a quarantine fails with policy=refuse, then the exec still
    fails with EAGAIN, and nothing is written to stderr."""
    node.write_conf(timeout_ms=200, extra="log=none\n")
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is None and out.rest == b"rc=-1 errno=EAGAIN\n"
    assert out.stderr == ""


def test_log_syslog_reaches_the_journal(node: Node, journal: Any) -> None:
    """Given log=syslog, when a quarantine fails, then the message goes to syslog
    (journald here) as geco-preload[pid], not to stderr."""
    node.write_conf(timeout_ms=200, extra="log=syslog\n")
    out = node.exec_variant("execve", node.shepherd)
    assert out.dump is None and out.stderr == ""
    entries = journal.wait_for(SYSLOG_IDENTIFIER="geco-preload", SYSLOG_PID=str(out.pid))
    messages = [re.sub(r"after \d+ attempts", "after N attempts", e["MESSAGE"])
                for e in entries]
    assert messages == [refused_line(node, out.pid, FAILURES["no_gecod"])
                        .removeprefix("geco: ").rstrip("\n")]


# ---------------------------------------------------------------------------
# peer-credentialed requests go only to root's Unix socket
# ---------------------------------------------------------------------------
#
# The sshd preload's ADOPT (stage EXEC) and the C starter's STARTER are MAC'd with the
# public key: their reply's MAC proves nothing, only the kernel's word on who listens
# does. A user who binds gecod's loopback port (port: mode, while gecod is down), or a
# Unix socket a client is pointed at, would otherwise choose other users' session
# environment (LD_PRELOAD lines) and what their jobs exec.

CLIENT_CDEF = """
typedef struct { ...; } geco_address_t;
typedef struct {
    uint64_t job_id, task_id; uint32_t status; uint8_t request_nonce[16];
} geco_ack_t;
typedef struct {
    int result; int sys_errno; int proto_err; uint32_t status; const char *phase;
    unsigned attempts; geco_ack_t ack;
} geco_client_outcome_t;
typedef struct {
    uint64_t job_id, task_id; uint32_t pid, uid, stage; const char *connection; int peercred;
} geco_adopt_t;
typedef struct {
    uint64_t job_id, task_id; uint32_t pid; const char *environ[4]; int argc;
    char *const *argv;
} geco_starter_t;
int geco_proto_init(void);
int geco_address_parse(const char *text, geco_address_t *out, const char **why);
int geco_client_adopt(const geco_address_t *addr, const uint8_t key[32], int timeout_ms,
                      int64_t max_skew_ns, const geco_adopt_t *msg, char *text, size_t cap,
                      geco_client_outcome_t *out);
int geco_client_starter(const geco_address_t *addr, int timeout_ms, int64_t max_skew_ns,
                        const geco_starter_t *msg, char *strings, size_t cap,
                        size_t *strings_len, geco_client_outcome_t *out);
const char *geco_client_strresult(int result);
"""
NOT_GECOD = ("the socket is not gecod's (peer-credentialed requests go only to root's Unix "
             "socket)")
# what an impostor answers: a session environment, a program for the job, of its choosing
IMPOSTOR_TEXT = "\nGECO_IMPOSTOR=1\nLD_PRELOAD=/tmp/impostor.so"
IMPOSTOR_PROGRAM = ("/bin/sh", ("-c", "impostor"), ("LD_PRELOAD=/tmp/impostor.so",))


@dataclass(frozen=True)
class Client:
    """libgeco/geco_client.c (with geco_proto.c), built as a cffi extension."""

    ffi: Any
    lib: Any

    def _addr(self, text: str) -> Any:
        addr = self.ffi.new("geco_address_t *")
        why = self.ffi.new("const char **")
        assert self.lib.geco_address_parse(text.encode(), addr, why) == 0, text
        return addr

    def strresult(self, result: int) -> str:
        return str(self.ffi.string(self.lib.geco_client_strresult(result)).decode())

    def adopt(self, addr: str, key: bytes | None = None) -> tuple[str, int, str]:
        """ADOPT, stage EXEC, job 42.1: peer-credentialed (the sshd preload's) without
        ``key``, else MAC'd with it (pam_geco's). Returns the result's text, the number
        of connections tried and the reply's text."""
        out = self.ffi.new("geco_client_outcome_t *")
        text = self.ffi.new("char[]", REPLY_MAX_TEXT + 1)
        conn = self.ffi.new("char[]", b"")
        msg = self.ffi.new("geco_adopt_t *", {
            "job_id": 42, "task_id": 1, "pid": os.getpid(), "uid": NOBODY,
            "stage": int(AdoptStage.EXEC), "connection": conn,
            "peercred": int(key is None)})
        self.lib.geco_client_adopt(self._addr(addr), key or PUBLIC_KEY, 5000,
                                   30 * 10**9, msg, text, len(text), out)
        return self.strresult(out.result), out.attempts, self.ffi.string(text).decode()

    def starter(self, addr: str) -> tuple[str, int, bytes]:
        """STARTER for job 42.1 (always peer-credentialed, as the C starter sends it).
        Returns the result's text, connections tried and the reply's strings."""
        out = self.ffi.new("geco_client_outcome_t *")
        strings = self.ffi.new("char[]", MAX_PAYLOAD)
        length = self.ffi.new("size_t *")
        words = [self.ffi.new("char[]", w) for w in (b"job.sh", b"arg")]
        argv = self.ffi.new("char *[]", [*words, self.ffi.NULL])
        msg = self.ffi.new("geco_starter_t *", {"job_id": 42, "task_id": 1,
                                                "pid": os.getpid(), "argc": 2, "argv": argv})
        self.lib.geco_client_starter(self._addr(addr), 5000, 30 * 10**9, msg, strings,
                                     len(strings), length, out)
        return (self.strresult(out.result), out.attempts,
                bytes(self.ffi.buffer(strings, length[0])))


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> Client:
    """geco_client.c and geco_proto.c built into a cffi extension in a temporary directory."""
    build = tmp_path_factory.mktemp("geco_client_cffi")
    ffi = cffi.FFI()
    ffi.cdef(CLIENT_CDEF)
    ffi.set_source("_geco_client_test", '#include "geco_client.h"',
                   sources=[str(LIBGECO / "geco_client.c"), str(LIBGECO / "geco_proto.c")],
                   include_dirs=[str(LIBGECO)], libraries=["sodium"],
                   extra_compile_args=["-std=gnu11", "-Wall", "-Werror"])
    so = ffi.compile(tmpdir=str(build))
    spec = importlib.util.spec_from_file_location("_geco_client_test", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.lib.geco_proto_init() == 0
    return Client(module.ffi, module.lib)


def _answer(frame: Frame, key: bytes) -> bytes:
    """OK to an ADOPT or a STARTER, with the impostor's lines or program, in kind (a
    PEERCRED reply to a PEERCRED request, MAC'd with ``key`` otherwise)."""
    message = frame.message
    if isinstance(message, Starter):
        program, argv, environ = IMPOSTOR_PROGRAM
        reply: Any = StarterReply(message.job_id, message.task_id, AckStatus.OK,
                                  frame.nonce, program, argv, environ)
        kind = MsgType.STARTER_REPLY
    else:
        assert isinstance(message, Adopt), frame
        reply = AdoptReply(message.job_id, message.task_id, AckStatus.OK,
                           frame.nonce, IMPOSTOR_TEXT)
        kind = MsgType.ADOPT_REPLY
    return encode(kind, reply, key, flags=frame.flags)


def _serve_one(family: str, uid: int, where: Path, key: bytes, out: int) -> None:
    """The forked listener's life: drop to ``uid`` before listen() (the kernel records the
    listener's credentials there), say the address on ``out``, answer one connection,
    then say whether a request came ("asked") or the client hung up first ("unasked")."""
    if uid != 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if family == "unix":
        path = where / f"listener-{os.getpid()}.sock"
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(str(path))
        path.chmod(0o666)
        text = f"path:{path}"
    else:
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.bind(("127.0.0.1", 0))
        text = f"port:{lst.getsockname()[1]}"
    lst.listen(8)
    os.write(out, text.encode() + b"\n")
    lst.settimeout(30)
    conn, _ = lst.accept()
    with conn:
        try:
            raw = read_frame(conn, time.monotonic() + 10)
        except ProtocolError:
            os.write(out, b"unasked\n")
            return
        conn.sendall(_answer(decode(raw, key), key))
    os.write(out, b"asked\n")


@dataclass(frozen=True)
class Listener:
    """A forked process listening where :attr:`addr` says, and what it heard."""

    addr: str
    _report: Any

    def heard(self) -> str:
        """"asked" (a request came and was answered) or "unasked"."""
        return str(self._report.readline().decode().strip())


@contextlib.contextmanager
def listener(family: str, uid: int, where: Path,
             key: bytes = PUBLIC_KEY) -> Iterator[Listener]:
    """A process of ``uid`` (forked, its ids dropped before it listens) serving one
    connection on a Unix socket in ``where`` or a loopback TCP port, which answers an
    ADOPT or a STARTER with OK and the impostor's session lines or program."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's runs here, whatever happens
        code = 1
        try:
            os.close(ready_r)
            _serve_one(family, uid, where, key, ready_w)
            code = 0
        except BaseException as exc:  # said to the test, which fails with it
            os.write(ready_w, f"listener failed: {exc!r}\n".encode())
        finally:
            os._exit(code)
    os.close(ready_w)
    try:
        with os.fdopen(ready_r, "rb") as report:
            addr = report.readline().decode().strip()
            assert addr.startswith(("path:", "port:")), addr or "the listener did not start"
            yield Listener(addr, report)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.fixture
def listen_dir() -> Iterator[Path]:
    """A directory where uid 65534 may make a socket and everyone may connect to it."""
    where = Path(tempfile.mkdtemp(prefix="geco-test-preload-listen-"))
    os.chown(where, NOBODY, NOBODY)
    where.chmod(0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize(("family", "uid"), [("unix", NOBODY), ("tcp", NOBODY), ("tcp", 0)],
                         ids=["nobodys-unix-socket", "nobodys-tcp-port", "roots-tcp-port"])
def test_a_peercred_request_goes_only_to_roots_unix_socket(
        client: Client, listen_dir: Path, family: str, uid: int) -> None:
    """Given a listener that is not root's Unix socket (uid 65534 on a Unix socket or a
    loopback port, as any user can bind gecod's port while it is down; or TCP at all,
    where the kernel names no listener), and that answers a valid-looking PEERCRED reply
    (a session environment with LD_PRELOAD, a program for the job), when the sshd
    preload's ADOPT or the C starter's STARTER is asked there, then the client refuses
    the listener after connect, before sending anything, once (not retried), and no
    reply line reaches the caller."""
    for ask in ("adopt", "starter"):
        with listener(family, uid, listen_dir) as lst:
            result, attempts, reply = (client.adopt(lst.addr) if ask == "adopt"
                                       else client.starter(lst.addr))
            heard = lst.heard()
        assert (ask, result, attempts, reply, heard) == (
            ask, NOT_GECOD, 1, "" if ask == "adopt" else b"", "unasked")


def test_a_peercred_request_to_roots_unix_socket_is_answered(client: Client,
                                                              listen_dir: Path) -> None:
    """Given root's Unix socket (gecod's), when the same requests are asked there, then
    the client takes the PEERCRED reply: the session lines, the program to start."""
    with listener("unix", 0, listen_dir) as lst:
        assert client.adopt(lst.addr) == ("ok", 1, IMPOSTOR_TEXT)
        assert lst.heard() == "asked"
    with listener("unix", 0, listen_dir) as lst:
        result, attempts, strings = client.starter(lst.addr)
        assert lst.heard() == "asked"
    program, argv, environ = IMPOSTOR_PROGRAM
    assert (result, attempts) == ("ok", 1)
    assert strings == b"\0".join(w.encode() for w in (program, str(len(argv)), *argv,
                                                       *environ)) + b"\0"


def test_a_request_macd_with_the_secret_key_still_goes_over_tcp(client: Client,
                                                                listen_dir: Path) -> None:
    """Given gecod on a loopback port (port: mode), when pam_geco asks ADOPT MAC'd with the
    secret key, then the reply counts as before: its MAC proves it comes from a holder of
    the key, whoever listens."""
    key = secrets.token_bytes(32)
    with listener("tcp", NOBODY, listen_dir, key=key) as lst:
        assert client.adopt(lst.addr, key=key) == ("ok", 1, IMPOSTOR_TEXT)
        assert lst.heard() == "asked"


# ---------------------------------------------------------------------------
# ssh sessions gecod cannot place: the preload in sshd fails closed
# ---------------------------------------------------------------------------
#
# A process of an ssh session (here exec_variant as <dir>/sshd, running as uid 65534)
# asks gecod to place it before its first exec. When gecod cannot (not running, this
# user's share of its public socket full, an address that is not gecod's socket), the
# exec goes on only as session_policy says: allow always; in-job when the kernel shows
# the process in a job's cgroup, for an admin, or while the bypass file exists; refuse
# for an admin or while the bypass file exists.

REFUSED_SESSION = ("geco: your session cannot be placed in its job now; try again, or ask "
                   "your admin\n")


def session_conf(node: Node, *, policy: str = "in-job", sock: str | None = None,
                 job_cgroups: str = "/GECO", uids: str = "", gids: str = "",
                 bypass: Path | None = None) -> None:
    """The sshd preload's settings, as `geco preload-config` renders them; gecod's socket
    is not there unless ``sock`` names one (a short deadline: the tests wait it out)."""
    missing = f"path:{node.root / 'no-gecod.sock'}"
    node.write_conf(timeout_ms=300, extra=(
        f"session_socket={sock or missing}\n"
        f"session_policy={policy}\n"
        f"job_cgroups={job_cgroups}\n"
        f"session_admin_uids={uids}\n"
        f"session_admin_gids={gids}\n"
        f"session_bypass={bypass or node.root / 'no-bypass'}\n"))


def session(node: Node, **kwargs: Any) -> Outcome:
    """A process of an ssh session (uid 65534, in a program called sshd) execs dump_args."""
    return node.run(node.built.sshd("exec_variant"), "execve", node.built.plain("dump_args"),
                    node.bin_dir, user=NOBODY, **kwargs)


def unplaced(node: Node, pid: int | None, rule: str,
             why: str = "cannot connect: ENOENT") -> str:
    """The preload's line for a session gecod did not place, and the rule that decided."""
    return (f"geco: ssh session (pid {pid}, uid {NOBODY}): gecod at path:{node.root}/"
            f"no-gecod.sock did not place it: {why}; {rule}\n")


@pytest.fixture
def cgroup_top() -> Iterator[Path]:
    """A geco-test-<pid>-<n> cgroup in the v1 pids hierarchy, standing for geco's job
    parent; removed afterwards, with whatever still runs in it killed."""
    mount = Path("/sys/fs/cgroup/pids")
    if not (mount / "cgroup.procs").is_file():
        pytest.fail("these tests need the cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    with parent_name([mount]) as name:
        top = mount / name
        top.mkdir()
        yield top


def _cgroup(top: Path, below: str) -> Path:
    where = top / below
    where.mkdir(parents=True)
    return where


def test_an_unplaced_session_outside_every_job_is_refused(node: Node) -> None:
    """Given gecod not there and session_policy=in-job (the default), when a session's
    process that is in no job's cgroup, of a user who is no admin, execs without a bypass
    file, then the exec fails with EACCES, nothing runs, the session is told so in geco's
    line and the log says which rule refused it."""
    session_conf(node)
    out = session(node)
    assert (out.dump, out.rest) == (None, b"rc=-1 errno=EACCES\n")
    assert out.stderr == unplaced(node, out.pid, "refused: not in a job's cgroup, not an "
                                  "admin, no bypass file (session_policy=in-job)") + \
        REFUSED_SESSION


@pytest.mark.parametrize(("below", "runs"), [
    ("42.1", True), ("42.1/leaf", True), ("42.x", False), ("leaf/42.1", False), ("42", False),
    (".1", False)], ids=["job", "below-a-job", "not-a-task", "deeper", "no-task", "no-job"])
def test_an_unplaced_session_runs_only_inside_a_job_cgroup(node: Node, cgroup_top: Path,
                                                           below: str, runs: bool) -> None:
    """Given gecod not there and session_policy=in-job, when the session's process is in a
    cgroup below one of job_cgroups (moved there by root, as PAM's helper moves a session),
    then it runs where it is when the component right below the prefix is <job>.<task>
    (the kernel's word: a user cannot move itself into a job's cgroup), else it is
    refused."""
    session_conf(node, job_cgroups=f"/GECO,/{cgroup_top.name}")
    out = session(node, cgroup=_cgroup(cgroup_top, below))
    if runs:
        assert out.dump is not None and out.dump.pid == out.pid
        assert out.dump.envp == target_env(node.bin_dir)
        assert out.stderr == unplaced(node, out.pid, f"it runs where PAM put it, in job cgroup "
                                      f"/{cgroup_top.name}/42.1 (session_policy=in-job)")
    else:
        assert (out.dump, out.rest) == (None, b"rc=-1 errno=EACCES\n")
        assert out.stderr.endswith(REFUSED_SESSION)


@pytest.mark.parametrize("prefix", ["look-alike", "longer"])
def test_a_job_cgroup_counts_only_right_below_a_whole_prefix(node: Node, cgroup_top: Path,
                                                             prefix: str) -> None:
    """Given job_cgroups naming /<top> minus its last character, or /<top>x, when the
    session's process is in /<top>/42.1, then it is refused: a prefix is a whole path."""
    other = cgroup_top.name[:-1] if prefix == "look-alike" else cgroup_top.name + "x"
    session_conf(node, job_cgroups=f"/{other}")
    out = session(node, cgroup=_cgroup(cgroup_top, "42.1"))
    assert (out.dump, out.rest) == (None, b"rc=-1 errno=EACCES\n")


@pytest.mark.parametrize("policy", ["in-job", "refuse"])
@pytest.mark.parametrize(("uids", "gids", "groups"), [
    ("0,65534", "", ()), ("", "65534", ()), ("", "7,4242", (4242,))],
    ids=["uid", "primary-gid", "supplementary-gid"])
def test_an_unplaced_admins_session_runs_where_it_is(node: Node, policy: str, uids: str,
                                                     gids: str, groups: tuple[int, ...]) -> None:
    """Given gecod not there, when the session is an admin's (its uid in
    session_admin_uids, or its primary or a supplementary gid in session_admin_gids), then
    it runs where it is, under in-job and refuse alike (PAM's helper lets admins in while
    gecod is down)."""
    session_conf(node, policy=policy, uids=uids, gids=gids)
    out = session(node, groups=groups)
    assert out.dump is not None and out.dump.pid == out.pid
    assert out.stderr == unplaced(node, out.pid, f"it runs where it is, an admin's session "
                                  f"(session_policy={policy})")


@pytest.mark.parametrize("policy", ["in-job", "refuse"])
def test_an_unplaced_session_runs_while_the_bypass_file_exists(node: Node, policy: str) -> None:
    """Given gecod not there and the bypass file (session_bypass), when a session outside
    every job execs, then it runs where it is and the log names the file; without the
    file it is refused."""
    bypass = node.root / "ssh-bypass"
    session_conf(node, policy=policy, bypass=bypass)
    assert session(node).dump is None
    bypass.write_text("")
    out = session(node)
    assert out.dump is not None
    assert out.stderr == unplaced(node, out.pid, f"it runs where it is: the bypass file "
                                  f"{bypass} exists (session_policy={policy})")


def test_session_policy_refuse_refuses_even_inside_a_job_cgroup(node: Node,
                                                                 cgroup_top: Path) -> None:
    """Given gecod not there and session_policy=refuse ([ssh] gecod_unreachable = "refuse":
    only root and the admins), when the session's process is in a job's cgroup, then it is
    refused all the same."""
    session_conf(node, policy="refuse", job_cgroups=f"/{cgroup_top.name}")
    out = session(node, cgroup=_cgroup(cgroup_top, "42.1"))
    assert (out.dump, out.rest) == (None, b"rc=-1 errno=EACCES\n")
    assert out.stderr == unplaced(node, out.pid, "refused: not an admin, no bypass file "
                                  "(session_policy=refuse)") + REFUSED_SESSION


def test_session_policy_allow_runs_an_unplaced_session_where_it_is(node: Node) -> None:
    """Given gecod not there and session_policy=allow ([ssh] gecod_unreachable = "allow"),
    then the session runs where it is, with a warning."""
    session_conf(node, policy="allow")
    out = session(node)
    assert out.dump is not None
    assert out.stderr == unplaced(node, out.pid, "it runs where it is (session_policy=allow)")


@pytest.mark.parametrize("policy", ["in-job", "allow"])
def test_an_impostors_answer_never_reaches_a_session(node: Node, listen_dir: Path,
                                                     policy: str) -> None:
    """Given session_socket naming a Unix socket uid 65534 listens on, answering OK with a
    session environment of its choosing, then the session's process asks nothing there:
    under in-job it is refused (in no job), under allow it runs without the impostor's
    lines. The same answer from root's socket (gecod's) is taken: the lines arrive."""
    with listener("unix", NOBODY, listen_dir) as lst:
        session_conf(node, policy=policy, sock=lst.addr)
        out = session(node)
        assert lst.heard() == "unasked"
    why = f"gecod at {lst.addr} did not place it: {NOT_GECOD}; "
    if policy == "in-job":
        assert (out.dump, out.rest) == (None, b"rc=-1 errno=EACCES\n")
        assert why + "refused: not in a job's cgroup" in out.stderr
    else:
        assert out.dump is not None and out.dump.envp == target_env(node.bin_dir)
        assert why + "it runs where it is (session_policy=allow)" in out.stderr
    with listener("unix", 0, listen_dir) as lst:
        session_conf(node, policy=policy, sock=lst.addr)
        out = session(node)
        assert lst.heard() == "asked"
    # (ld.so says it cannot find the LD_PRELOAD named: the line did arrive)
    assert out.dump is not None and "geco:" not in out.stderr
    assert out.dump.envp[-2:] == [b"GECO_IMPOSTOR=1", b"LD_PRELOAD=/tmp/impostor.so"]


def test_the_rendered_config_is_what_the_preload_in_sshd_reads(node: Node,
                                                               cgroup_top: Path) -> None:
    """Given preload.conf rendered by `geco preload-config` (admins, an admin group, geco's
    cgroup name), then the preload in sshd reads every session key: a session inside
    /<name>/<job>.<task> runs there; outside it, a member of the admin group runs."""
    cfg = Config()._replace(gecod_socket=f"path:{node.root / 'no-gecod.sock'}",
                            gecod_key_file=node.key_file, gecod_request_timeout=0.3,
                            gecod_preload_log="stderr", cgroup_name=cgroup_top.name,
                            cgroup_version="1", ssh_admins=("root",),
                            ssh_admin_groups=("nogroup",),
                            ssh_bypass_file=node.root / "no-bypass")
    node.conf_file.write_text(preload_config.render(cfg))
    node.conf_file.chmod(0o644)
    inside = session(node, cgroup=_cgroup(cgroup_top, "7.3"))
    assert inside.dump is not None
    assert inside.stderr == unplaced(node, inside.pid, f"it runs where PAM put it, in job "
                                     f"cgroup /{cgroup_top.name}/7.3 (session_policy=in-job)")
    outside = session(node)
    assert outside.dump is not None
    assert outside.stderr == unplaced(node, outside.pid, "it runs where it is, an admin's "
                                      "session (session_policy=in-job)")
