"""gecod at the node's shutdown, and the delegation of ``[cgroup] v1_systemd_base`` at its start.

At a poweroff systemd stops gecod while Grid Engine goes down beside it: a worker's qstat
may then wait out its timeout (and its retries), and gecod waited for every worker, and
for its log thread, before it exited; systemd's stop timeout ended it with SIGKILL. Here
gecod is a real process with a real qstat that never answers; what PID 1 says about the
node (``systemctl is-system-running``) is a script on gecod's PATH, as a fake qstat
stands for Grid Engine elsewhere (the QEMU machine's real poweroff:
tests/vm_sge/test_loose_ends_shutdown_vm.py, last in the Grid Engine boot).

The delegation check runs on this machine's cgroup2 (the hybrid layout's ``unified``),
where a directory named like a unit and marked as systemd marks its units' cgroups
(``user.invocation_id``, ``user.delegate`` for a delegated one) is what gecod reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import cgroup
from geco.cgroup._v1 import find_systemd_hierarchies
from geco.errors import CgroupError, GecoError
from geco.jobkey import JobKey
from geco.sge import resourcefile
from geco.wire import address
from tests.gecodkit import MARKS, REPO, Gecod, Node, new_job
from tests.gecodkit import _clean_jobs as _clean_jobs
from tests.gecodkit import node as node

pytestmark = MARKS

UNIFIED = Path("/sys/fs/cgroup/unified")
NAMED = Path("/sys/fs/cgroup/systemd")  # name=systemd
# a qstat that never answers within gecod's stop: [qstat] timeout far beyond the test
_QSTAT_TIMEOUT = 3600


def _script(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return str(path)


def _wait_for(what: str, ready: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def hanging_qstat(node: Node) -> Iterator[tuple[str, Path]]:
    """A qstat that writes its pid and sleeps; killed afterwards (systemd's KillMode=mixed
    does it for gecod.service)."""
    pidfile = node.base / "qstat-hangs.pid"
    pidfile.unlink(missing_ok=True)
    path = _script(node.base / "qstat-hangs", f"echo $$ > {pidfile}\nexec sleep {_QSTAT_TIMEOUT}")
    yield path, pidfile
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _start(node: Node, tag: str, qstat: str, said: str) -> Gecod:
    """gecod with ``qstat``, its [qstat] timeout long, and a systemctl that says ``said``
    (start_gecod's way, with that timeout in the configuration)."""
    bindir = node.base / f"bin-{tag}"
    _script(bindir / "systemctl", f'[ "$1" = is-system-running ] && echo {said}')
    conf = node.write_config(tag, qstat=qstat)
    conf.write_text(conf.read_text().replace("retries = 0\n",
                                             f"retries = 0\ntimeout = {_QSTAT_TIMEOUT}\n"))
    log = node.base / f"{tag}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "geco.daemon", "--config", str(conf),
                                 "--log-level", "info"], cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out,
                                env={"PYTHONPATH": str(REPO),
                                     "PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    g = Gecod(proc, node.socket_path(tag), log)

    def listening() -> bool:
        assert proc.poll() is None, f"gecod exited {proc.returncode} at start:\n{g.output()}"
        try:
            address.connect(address.parse(g.sock), 1.0).close()
        except GecoError:
            return False
        return True

    _wait_for(f"gecod did not listen:\n{g.output()}", listening)
    return g


def _a_start_asking_qstat(node: Node, g: Any, pidfile: Path) -> Any:
    """A job's shepherd asking gecod to contain it, with no resource file: gecod's worker
    runs qstat (which writes ``pidfile``), and the shepherd waits for the answer."""
    job = new_job()
    node.make_job(job)
    resourcefile.remove(node.state_dir / "resources", JobKey(job, 1))
    p = node.job_process(job, sock=g.sock)
    _wait_for("gecod never ran qstat", pidfile.exists)
    return p


def test_at_the_nodes_shutdown_gecod_exits_without_waiting_for_a_qstat_that_hangs(
        node: Node, journal: Any, hanging_qstat: tuple[str, Path]) -> None:
    """Given a job start whose qstat never answers (Grid Engine going down with the node),
    when gecod gets SIGTERM while systemd says the node is ``stopping``, then gecod exits 0
    without waiting for that worker, and says why in its log and the journal."""
    qstat, pidfile = hanging_qstat
    g = _start(node, "poweroff", qstat, "stopping")
    p = _a_start_asking_qstat(node, g, pidfile)

    g.proc.send_signal(signal.SIGTERM)
    try:
        # before the fix: 10 s of drain, then a wait for the qstat's whole hour
        code = g.proc.wait(60)
    except subprocess.TimeoutExpired:
        g.proc.kill()
        pytest.fail(f"gecod still waits for its qstat after SIGTERM at the node's shutdown:\n"
                    f"{g.output()}")
    p.exit()
    assert code == 0, g.output()
    out = g.output()
    assert "the node is shutting down: gecod exits without waiting for the work in " \
           "progress (its jobs end with the node)" in out, out
    assert "gecod stopped" in out, out
    [entry] = journal.wait_for(GECO_EVENT="gecod-stopping-with-node", _PID=str(g.pid))
    assert entry["PRIORITY"] == "6"


def test_a_plain_stop_still_waits_for_the_answer_in_flight(
        node: Node, journal: Any) -> None:
    """Given systemd saying the node runs on (``running``), when gecod gets SIGTERM while a
    request waits on qstat, then it is answered before gecod exits 0, and nothing says
    the node is going down (`systemctl stop|restart gecod` keeps its guarantees)."""
    pidfile = node.base / "qstat-slow.pid"
    qstat = _script(node.base / "qstat-slow",
                    f"echo $$ > {pidfile}\nsleep 1\necho '<unknown_jobs/>'")
    g = _start(node, "plainstop", qstat, "running")
    p = _a_start_asking_qstat(node, g, pidfile)
    g.proc.send_signal(signal.SIGTERM)
    assert p.answer() == "NO_SUCH_JOB"
    assert g.proc.wait(30) == 0, g.output()
    assert "the node is shutting down" not in g.output()
    assert not journal.entries(GECO_EVENT="gecod-stopping-with-node", _PID=str(g.pid))


# -- [cgroup] v1_systemd_base's delegation, checked at start --------------------------------


@pytest.fixture
def unit_dir(node: Node) -> Iterator[Path]:
    """A unit's cgroup on this machine's cgroup2, marked as systemd marks its units' (and
    beside it in name=systemd, which carries no marks here)."""
    if not (UNIFIED / "cgroup.procs").exists():
        pytest.skip(f"no cgroup2 at {UNIFIED} (the hybrid layout's)")
    tops = [d / node.name for d in (UNIFIED, NAMED) if (d / "cgroup.procs").exists()]
    for top in tops:
        (top / "geco-jobs-test.service").mkdir(parents=True, exist_ok=True)
    unit = UNIFIED / node.name / "geco-jobs-test.service"
    os.setxattr(unit, "user.invocation_id", b"0123456789abcdef0123456789abcdef")
    yield unit
    for top in tops:
        for d in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if d.is_dir():
                d.rmdir()
        top.rmdir()


def _v1_with_systemd_base(base: str) -> cgroup.V1Backend:
    mounts = cgroup.parse_mountinfo(Path("/proc/self/mountinfo").read_bytes())
    systemd = {k: h for k, h in find_systemd_hierarchies(mounts, Path("/sys/fs/cgroup"))
               .items() if k == ""}
    return cgroup.V1Backend(cgroup.find_hierarchies(mounts, Path("/sys/fs/cgroup")),
                            f"geco-test-{os.getpid()}-deleg", systemd=systemd,
                            systemd_base=base)


def test_a_v1_systemd_base_in_a_unit_systemd_does_not_delegate_is_refused(
        node: Node, unit_dir: Path) -> None:
    """Given [cgroup] v1_systemd_base in a unit's cgroup systemd marks as its own but not as
    delegated, then the backend refuses it, naming the unit and Delegate=yes; once
    marked delegated, the base is made."""
    base = f"/{node.name}/{unit_dir.name}/jobs"
    backend = _v1_with_systemd_base(base)
    with pytest.raises(CgroupError) as refused:
        backend.ensure_root()
    assert str(refused.value) == (
        f"[cgroup] v1_systemd_base {base} lies in the cgroup of geco-jobs-test.service, "
        "which systemd does not delegate: a daemon-reload would move job processes out of "
        "their cgroups there; set Delegate=yes in geco-jobs-test.service "
        f"(conf/geco-jobs.service has it) (path={unit_dir})")
    assert not (unit_dir / "jobs").exists()
    os.setxattr(unit_dir, "user.delegate", b"1")
    try:
        backend.ensure_root()
        assert (unit_dir / "jobs").is_dir()
    finally:
        for d in backend.parent_paths().values():
            with contextlib.suppress(OSError):
                d.rmdir()


def test_gecod_refuses_to_start_with_a_v1_systemd_base_systemd_does_not_delegate(
        node: Node, unit_dir: Path) -> None:
    """Given that base in gecod's configuration, then gecod does not start: exit 1, one
    line on stderr saying which unit and what to set, no traceback."""
    base = f"/{node.name}/{unit_dir.name}/jobs"
    conf = node.write_config("undelegated")
    conf.write_text(conf.read_text().replace(
        "[cgroup]\n", f'[cgroup]\nv1_systemd_base = "{base}"\n'))
    ran = subprocess.run([sys.executable, "-m", "geco.daemon", "--config", str(conf)],
                         cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert (ran.returncode, ran.stdout) == (1, ""), ran.stderr
    assert ran.stderr == (
        f"gecod: [cgroup] v1_systemd_base {base} lies in the cgroup of "
        "geco-jobs-test.service, which systemd does not delegate: a daemon-reload would "
        "move job processes out of their cgroups there; set Delegate=yes in "
        f"geco-jobs-test.service (conf/geco-jobs.service has it) (path={unit_dir})\n")
    assert not (unit_dir / "jobs").exists()
