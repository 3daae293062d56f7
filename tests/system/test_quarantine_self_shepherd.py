"""QUARANTINE_SELF trusts only a real shepherd: real uid 0, in this host's spool.

gecod runs with :mod:`tests.gecodkit` (its :class:`Node`, :func:`start_gecod`
and :func:`end_jobs`): a test directory under /tmp with a fake
execd spool tree and the cgroup parent ``geco-test-<pid>-qself``. A job's
"shepherd" is a copy of /bin/sh called ``sge_shepherd`` working in the job's
spool dir; its child asks for itself the way the starter's fallback does
(:func:`geco.wire.client.quarantine_self`, as the job's owner nobody, no key).

The starter's fallback believes the sge_shepherd above it; anyone can call a
program ``sge_shepherd`` and run it in a spool dir they can read. What tells
sge_execd's shepherd apart is what a user cannot fake: its real uid is 0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gecodkit import HOST, MARKS, NOBODY, Gecod, Node, end_jobs, logged, make_node, new_job
from tests.gecodkit import gecod as gecod  # the module's gecod, on this module's node

pytestmark = MARKS

REPO = Path(__file__).resolve().parents[2]
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

# The starter's fallback: QUARANTINE_SELF without the key (the kernel vouches for the uid).
SELF = r"""
import dataclasses, os, sys
from geco import config
from geco.wire import client
where, job = sys.argv[1:3]
cfg = config.Config()._replace(gecod_socket=where)
try:
    status = client.quarantine_self(cfg, int(job), 1, timeout=30).status.name
except client.GecodRefused as exc:
    status = exc.status.name
print(status, os.getpid(), flush=True)
"""


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with make_node(Node, "qself", f"geco-test-{os.getpid()}-qself") as n:
        yield n



@pytest.fixture(autouse=True)
def _clean_jobs(node: Node) -> Iterator[None]:
    yield
    end_jobs(node)


def ask_below_shepherd(node: Node, gecod: Gecod, job: int, cwd: Path, *,
                       shepherd_as_nobody: bool) -> tuple[str, int]:
    """Run a fake sge_shepherd in ``cwd`` (as root, or as nobody) whose child, as nobody,
    sends QUARANTINE_SELF for ``job``; return the ACK status and the child's pid."""
    fake = node.base / "shepherd-bin" / "sge_shepherd"
    fake.parent.mkdir(exist_ok=True)
    if not fake.exists():
        shutil.copy("/bin/sh", fake)
    client = [sys.executable, "-c", SELF, gecod.sock, str(job)]
    # "; exit $?" keeps the shell as the client's parent instead of exec'ing it
    shepherd = [str(fake), "-c", 'run() { "$@"; exit $?; }; run "$@"', "sge_shepherd"]
    argv = ([*AS_NOBODY, *shepherd, *client] if shepherd_as_nobody
            else [*shepherd, *AS_NOBODY, *client])
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    status, pid = proc.stdout.split()
    return status, int(pid)


def refusals(journal: Any, since: float, gecod: Gecod) -> list[str]:
    return [e["MESSAGE"].split(": ", 1)[1] for e in logged(
        journal, since, GECO_EVENT="quarantine-refused", _PID=str(gecod.pid))]


def test_a_shepherd_run_by_a_user_is_not_believed(node: Node, gecod: Gecod,
                                                   journal: Any) -> None:
    """Given a job of nobody, when nobody runs a program called sge_shepherd in the job's
    spool dir and its child asks QUARANTINE_SELF, then REFUSED, no cgroup is made, and the
    journal names the impostor's real uid; the same request below a shepherd root started
    is OK (so the refusal is the uid's doing)."""
    since = time.time()
    fake_job, real_job = new_job(), new_job()
    node.make_job(fake_job, owner="nobody")
    node.make_job(real_job, owner="nobody")

    status, pid = ask_below_shepherd(node, gecod, fake_job, node.job_dir(fake_job),
                                     shepherd_as_nobody=True)
    control, _ = ask_below_shepherd(node, gecod, real_job, node.job_dir(real_job),
                                    shepherd_as_nobody=False)

    assert (status, control) == ("REFUSED", "OK")
    assert not node.cgroup("cpuset", f"{fake_job}.1").exists()
    [reason] = refusals(journal, since, gecod)
    assert reason.startswith(f"process {pid} does not descend from the sge_shepherd of job "
                             f"{fake_job}.1; process ")
    assert reason.endswith(f"named sge_shepherd in its spool dir runs with real uid {NOBODY}, "
                           "not 0")


def test_a_shepherd_in_another_hosts_spool_is_not_believed(node: Node, gecod: Gecod,
                                                            journal: Any) -> None:
    """Given a job spooled under another host's directory of the execd spool
    (``<spool>/other-host/active_jobs/<job>.1``, as on a shared spool), when a root
    sge_shepherd works there and its child asks QUARANTINE_SELF, then REFUSED naming the
    host; the same job in this host's spool dir is OK."""
    since = time.time()
    job = new_job()
    here = node.make_job(job, owner="nobody")
    there = node.spool / f"not-{HOST}" / "active_jobs" / f"{job}.1"
    shutil.copytree(here, there)
    os.chmod(there, 0o755)

    status, pid = ask_below_shepherd(node, gecod, job, there, shepherd_as_nobody=False)
    control, _ = ask_below_shepherd(node, gecod, job, here, shepherd_as_nobody=False)

    assert (status, control) == ("REFUSED", "OK")
    [reason] = refusals(journal, since, gecod)
    assert reason.startswith(f"process {pid} does not descend from the sge_shepherd of job "
                             f"{job}.1; the sge_shepherd ")
    assert reason.endswith(f"works in {there}, which is not this host's ({HOST}) spool")
