"""ssh logins a user can turn against gecod: during a job's end, with a long refusal, from a
helper whose parent is gone.

A real gecod on its own node (:mod:`tests.gecodkit`: fake spool, real cgroups, real
sockets). Each test is one finding of issue 32:

* a session adopted while its job ends once outlived the job: the teardown found it
  stuck and disabled the queue (item 4: 50 races, each ends clean);
* ``several_jobs = "refuse"`` naming ~160 jobs made a reply too long for its frame: the
  connection stayed open for good (item 7);
* the PAM helper, deciding while gecod is down, moved its parent without checking it is
  sshd's (item 8).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.wire.messages import REPLY_MAX_TEXT, AckStatus
from geco.wire.replay import ReplayCache
from tests.gecodkit import (
    MARKS,
    REPO,
    Gecod,
    Node,
    adopt,
    assert_serving,
    end_jobs,
    logged,
    make_node,
    new_job,
    root_socket,
    start_gecod,
    wait_gone,
)
from tests.servicekit import JobOwner, ensure_user

pytestmark = MARKS

TRIES = 50
OWNER = "gecotest-stall"


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with make_node(Node, "stall", f"geco-test-{os.getpid()}-stall") as n:
        yield n


@pytest.fixture(autouse=True)
def _clean_jobs(node: Node) -> Iterator[None]:
    yield
    end_jobs(node)


@pytest.fixture(scope="module")
def owner() -> JobOwner:
    return ensure_user(OWNER)


# sshd's root process for a connection, as pam_geco asks at the session stage: ADOPT for
# itself, then it waits (what the session runs is in its job, or nowhere)
SSHD_STANDIN = textwrap.dedent("""
    import os, sys, time
    from geco.wire import client, address
    from geco.wire.frame import decode, encode
    from geco.wire.messages import Adopt, AdoptReply, AdoptStage, MsgType
    sock, key_file, uid, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    key = open(key_file, "rb").read()
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(delay)
    msg = Adopt(0, 0, os.getpid(), uid, AdoptStage.SESSION, "")
    frame = encode(MsgType.ADOPT, msg, key)
    reply = decode(client.request(address.parse("path:" + sock), frame, 30), key)
    print(AdoptReply.unpack(reply.payload).status.name, flush=True)
    sys.stdin.read()
""")


def _standin(node: Node, g: Gecod, uid: int, delay: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SSHD_STANDIN, root_socket(g),
                             str(node.key_file), str(uid), f"{delay:.4f}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    node.processes.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _in_job(pid: int, node: Node, key: str) -> bool:
    try:
        return f"/{node.name}/{key}\n" in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


def test_a_session_moved_in_while_its_job_ends_never_outlives_it(
        node: Node, owner: JobOwner, journal: Any, figures: list[str]) -> None:
    """Given a user's job whose master shepherd exits (gecod ends the job) while sshd's
    process for a login of that user asks to be moved into it, 50 times with the two a
    little apart either way, then every job ends clean (its cgroups removed, no
    cleanup-stuck), and the process is either refused and in no job, or was moved in and
    ended with the job: never alive in a job that is gone."""
    since = time.time()
    g = start_gecod(node, "stall-end", kill_timeout=5)
    rng = random.Random(32)
    outcomes: list[str] = []
    try:
        for _ in range(TRIES):
            job = new_job()
            node.make_job(job, owner=owner.name)
            shepherd = node.job_process(job, named_shepherd=True, sock=g.sock)
            assert shepherd.answer() == "OK", g.output()
            key = f"{job}.1"
            standin = _standin(node, g, owner.uid, rng.uniform(0, 0.03))
            assert standin.stdin is not None and standin.stdout is not None
            standin.stdin.write("go\n")
            standin.stdin.flush()
            time.sleep(rng.uniform(0, 0.03))
            shepherd.exit()
            # "": it went in and the job's end killed it before it read the reply
            answer = standin.stdout.readline().strip() or "killed"
            wait_gone(node, key, timeout=30)
            alive = standin.poll() is None
            outcomes.append(answer if not alive else f"{answer}, alive")
            assert not (alive and _in_job(standin.pid, node, key)), (answer, key)
            assert answer in ("OK", "REFUSED", "killed"), answer
            if answer != "REFUSED":  # it went in: the job's end took it
                assert standin.wait(timeout=30) == -9, answer
        assert not logged(journal, since, GECO_EVENT="cleanup-stuck", _PID=str(g.pid))
    finally:
        assert g.stop() == 0, g.output()
    figures.append(f"ssh during a job's end, {TRIES} races: " + ", ".join(
        f"{n} {what}" for what, n in sorted(Counter(outcomes).items())) + "; every job clean")
    # both sides of the race were met
    assert {"OK", "killed"} & set(outcomes) and any(o.startswith("REFUSED") for o in outcomes), \
        outcomes


def test_a_refusal_naming_160_jobs_fits_its_reply_and_nothing_is_left_open(
        node: Node, owner: JobOwner) -> None:
    """Given several_jobs = "refuse" and a user with 160 jobs on the node, when sshd's PAM
    module asks about that user's login (ADOPT, account stage), then gecod answers REFUSED
    with one line naming 8 of the jobs and how many more, and gecod serves the next
    request: no reply too long for its frame, no connection left open."""
    g = start_gecod(node, "stall-refuse", sections='[ssh]\nseveral_jobs = "refuse"\n')
    try:
        jobs = [new_job() for _ in range(160)]
        for job in jobs:
            node.make_job(job, owner=owner.name)
            for parent in node.parents():  # the job's cgroups, as if it had started
                if parent.is_dir():
                    (parent / f"{job}.1").mkdir()
        reply = adopt(root_socket(g), node.key, os.getpid(),
                                   owner.uid)
        assert reply.status is AckStatus.REFUSED
        line = reply.text.splitlines()[0]
        assert line.startswith("geco: you have 160 jobs running on ") and \
            line.count(".1,") == 7 and "and 152 more" in line, line
        assert len(reply.text.encode()) <= REPLY_MAX_TEXT
        assert_serving(node, g)
    finally:
        assert g.stop() == 0, g.output()


HELPER = "/usr/libexec/geco/geco-pam"


def test_the_helper_moves_no_parent_that_is_not_sshds(tmp_path: Path, owner: JobOwner) -> None:
    """Given the PAM helper run at the session stage by a process that is not sshd (as after
    sshd died and the helper was re-parented), then it refuses the login, saying its parent
    is not sshd's root process, and its parent is in no job afterwards."""
    if not Path(HELPER).exists():
        pytest.fail(f"{HELPER} is missing: run scripts/install.sh")
    parent = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import subprocess, sys
            done = subprocess.run([{HELPER!r}], capture_output=True, text=True,
                                  env={{"PAM_TYPE": "open_session", "PAM_USER": {OWNER!r},
                                       "PATH": "/usr/bin:/bin"}})
            print(done.returncode, done.stdout.strip())
            print(open("/proc/self/cgroup").read())
        """)], capture_output=True, text=True, timeout=60, check=True)
    code, _, said = parent.stdout.partition(" ")
    assert code == "1", parent.stdout + parent.stderr
    assert "is not sshd's root process" in said, said
    assert "/GECO/" not in parent.stdout.split("\n", 1)[1], parent.stdout


def test_the_cluster_channels_replay_cache_takes_thousands_of_requests_a_second() -> None:
    """Given the cluster channel's replay cache, when authentic requests come at 5,000 a
    second for a whole window (logins asking other hosts, slaves' OOM words), then none is
    refused as a replay or for a full cache (65,536 nonces refused every one past 1,100 a
    second)."""
    from geco.daemon.clusterserve import REPLAY_CAPACITY

    cache = ReplayCache.for_skew(30.0, capacity=REPLAY_CAPACITY)
    start = time.time_ns()
    rate, seconds = 5000, 61
    for n in range(rate * seconds):
        cache.check(n.to_bytes(16, "little"), start + n * 1_000_000_000 // rate)
