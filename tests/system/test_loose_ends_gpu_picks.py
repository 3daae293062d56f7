"""Issue 37, point 3: the reaper keeps what it did not read -- the GPUs geco picked for a job.

Son of Grid Engine only counts a job's GPUs (``-l gpu=1`` -> ``count:1``); geco picks which
one at the job's containment and saves the id in the job's resource file on the node
(``count:1=<id>``). When gecod's reaper finds that file unusable it writes it anew from qstat,
which knows the count only: the pick must survive that, or the next job may be given the same
GPU. The picks are also recorded beside the file (``resources/gpu-picks/<job>.<task>``).

Real parts: this machine's cgroup v1 hierarchies (a parent of the test's own), two GPUs made
with mknod with the NVIDIA driver's numbers (id 0 = ``c 195:1``, id 1 = ``c 195:0``: ids and
minors crossed, named in ``[gpu] devices``), the real containment and the real
:class:`geco.daemon.reaper.Reaper` round. Only qstat is a stand-in (``fetch``), answering
what qstat answers for such a job: its count, no ids. With no driver loaded, the kernel
answers ``open()`` of a GPU the job's cgroup allows with ENXIO, of one it denies with EPERM.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import jobfiles
from geco.cgroup import V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.daemon.reaper import Reaper, Verdict
from geco.job import teardown
from geco.job.containment import contain_job
from geco.jobkey import JobKey
from geco.node import gpus
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.sge.execd import JobRef
from geco.sge.lookup import Found
from tests.cgroup_testkit import Child, open_verdicts, usable_v1_hierarchies, v1_backend, verdicts
from tests.logkit import RecordingHandler, handler_on

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]
HOST = short_hostname()
SUBMITTED = 1795303085.311469
GARBAGE = b"GECOResourceSet_v1{li\xff\xfe garbage"


class Loop:
    """gecod's runloop as the reaper sees it; the test runs rounds itself, so it is unused."""

    def add_timer(self, delay: float, callback: Callable[[], None],
                  repeat: float | None = None) -> Any:
        raise AssertionError("the test runs the rounds")

    def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
        callback()


class Node:
    """The node: two GPUs, a state dir, a spool, real job cgroups, and the reaper over them."""

    def __init__(self, tmp: Path, backend: V1Backend, children: list[int]) -> None:
        self.devices = {"gpu0": str(tmp / "gpu0"), "gpu1": str(tmp / "gpu1")}
        for name, minor in (("gpu0", 1), ("gpu1", 0)):
            os.mknod(self.devices[name], 0o600 | stat.S_IFCHR, os.makedev(195, minor))
        self.cfg = Config(state_dir=tmp / "state", execd_spool_dir=tmp / "spool",
                          pids_per_slot=0, gpu_devices=tuple(self.devices.values()),
                          gecod_reaper_interval=300.0)
        self.backend, self.children = backend, children
        self.asked: list[tuple[int, int]] = []
        self.reaper = Reaper(Loop(), backend, self.cfg, concurrent.futures.ThreadPoolExecutor(1),
                             node=HOST, fetch=self.qstat)

    def qstat(self, job: int, task: int, cfg: Config, pe_hostfile: Path | None) -> ResourceSet:
        """What qstat answers for a running job that asked -l gpu=1: the count only."""
        self.asked.append((job, task))
        return self.granted(job)

    @staticmethod
    def granted(job: int) -> ResourceSet:
        return ResourceSet(job, 1, owner="alice", submitted=SUBMITTED,
                           nodes=(NodeResources(HOST, slots=1, memory_limit=256 << 20,
                                                gpus="count:1"),))

    def start(self, job: int) -> tuple[Child, int]:
        """Contain job ``<job>.1`` (spooled here, so the reaper finds it running) with its
        first process, as the prolog or gecod does; its GPU id."""
        spool = self.cfg.execd_spool_dir / HOST / "active_jobs" / f"{job}.1"
        spool.mkdir(parents=True)
        rs = self.granted(job)
        resourcefile.write(self.cfg.resources_dir, rs)  # as qstat's lookup saves it
        child = Child(open_verdicts(self.devices), self.children)
        done = contain_job(JobRef(job, 1, spool), self.cfg, self.backend, pid=child.pid,
                           found=Found(rs, "qstat", 0.0))
        assert done.created and done.gpus is not None and len(done.gpus) == 1
        return child, done.gpus[0]

    def on_record(self, job: int) -> str:
        """The job's GPU list in its resource file."""
        rs = resourcefile.read(self.cfg.resources_dir, JobKey(job, 1))
        assert rs is not None
        return rs.nodes[0].gpus

    def corrupt(self, job: int) -> Path:
        path = jobfiles.resource_file(self.cfg.resources_dir, JobKey(job, 1))
        path.write_bytes(GARBAGE)
        return path


@pytest.fixture
def node(tmp_path: Path, children: list[int]) -> Iterator[Node]:
    with v1_backend(HIER, exclusive_cpus=False) as backend:
        yield Node(tmp_path, backend, children)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    handler = RecordingHandler()
    with handler_on("geco", handler):
        yield handler.records


def events(records: list[logging.LogRecord], event: str) -> list[dict[str, str]]:
    return [dict(f) for r in records
            if (f := getattr(r, "geco_fields", {})).get("GECO_EVENT") == event]


def other(gpu: int) -> int:
    return 1 - gpu


def test_a_resource_file_rewritten_from_qstat_keeps_the_gpu_geco_picked(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given a job contained with count:1 that got GPU X, when its resource file turns to
    garbage and a reaper round writes it anew from qstat (which says count:1 only), then the
    file says count:1=X again (journaled gpu-picks-kept and resource-file-rewritten), the job
    is still told X, the kernel still lets it open X only, and a second job asking one GPU
    is given the other one."""
    first, x = node.start(701)
    assert node.on_record(701) == f"count:1={x}"
    path = node.corrupt(701)

    report = node.reaper.run_round()

    assert report.verdicts == {"701.1": Verdict.ALIVE}
    assert node.asked == [(701, 1)]
    assert node.on_record(701) == f"count:1={x}"
    assert gpus.job_environment(node.cfg, JobKey(701, 1))["GECO_GPUS"] == str(x)
    [kept] = events(records, "gpu-picks-kept")
    assert (kept["PATH"], kept["GPUS"]) == (str(path), f"count:1={x}")
    assert [e["PATH"] for e in events(records, "resource-file-rewritten")] == [str(path)]
    assert events(records, "gpu-picks-unknown") == []

    second, y = node.start(702)
    assert y == other(x)
    first.go()
    second.go()
    assert verdicts(first) == {f"gpu{x}": "ENXIO", f"gpu{y}": "EPERM", "pty": "open"}
    assert verdicts(second) == {f"gpu{x}": "EPERM", f"gpu{y}": "ENXIO", "pty": "open"}


def test_while_the_file_is_garbage_the_next_pick_still_sees_the_gpu_taken(
        node: Node, records: list[logging.LogRecord]) -> None:
    """Given a job holding GPU X whose resource file is garbage, not yet written anew, then
    a second job asking one GPU is given the other one: the record of the picks tells."""
    _, x = node.start(711)
    node.corrupt(711)

    _, y = node.start(712)

    assert y == other(x)
    assert not [r for r in records if "cannot tell which GPUs" in r.getMessage()]


@pytest.mark.parametrize("record", ["missing", "garbage"])
def test_with_the_file_and_the_record_of_the_picks_both_gone_no_id_is_made_up(
        node: Node, records: list[logging.LogRecord], record: str) -> None:
    """Given a job holding GPU X whose resource file is garbage and whose record of the picks
    is missing or garbage too, when a reaper round writes the file anew from qstat, then it
    says count:1 with no id (none is made up), a warning names the job, the file and why
    (gpu-picks-unknown), and the kernel still lets the job open X only."""
    child, x = node.start(721)
    path = node.corrupt(721)
    picks = jobfiles.gpu_picks(node.cfg.resources_dir, JobKey(721, 1))
    if record == "missing":
        picks.unlink()
    else:
        picks.write_bytes(b"geco-gpu-picks-v1 host=" + HOST.encode() + b" gpus=count:1=x\n")

    node.reaper.run_round()

    assert node.on_record(721) == "count:1"
    assert gpus.job_environment(node.cfg, JobKey(721, 1))["GECO_GPUS"] == ""
    [unknown] = events(records, "gpu-picks-unknown")
    assert (unknown["PATH"], unknown["GPUS"], unknown["SGE_TASK_ID"]) == (str(path), "count:1",
                                                                         "1")
    reason = {"missing": f"no record of them ({picks})",
              "garbage": f"the record of the GPUs picked for job 721.1 is not "
                         f"'geco-gpu-picks-v1 host=<name> gpus=count:<n>=<ids> "
                         f"submitted=<seconds>' (path={picks})"}[record]
    assert unknown["REASON"] == reason
    assert events(records, "gpu-picks-kept") == []
    child.go()
    assert verdicts(child) == {f"gpu{x}": "ENXIO", f"gpu{other(x)}": "EPERM", "pty": "open"}


def test_the_record_of_the_picks_goes_with_the_resource_file(node: Node) -> None:
    """Given a job holding a GPU, when its files are forgotten as a job's end forgets them,
    then the record of its picks is gone too; one left without its file and cgroups (removed
    by hand) is pruned by a reaper round."""
    _, _ = node.start(731)
    picks = jobfiles.gpu_picks(node.cfg.resources_dir, JobKey(731, 1))
    assert picks.exists()
    jobfiles.forget(node.cfg, JobKey(731, 1))
    assert not picks.exists()

    _, _ = node.start(732)
    picks = jobfiles.gpu_picks(node.cfg.resources_dir, JobKey(732, 1))
    jobfiles.resource_file(node.cfg.resources_dir, JobKey(732, 1)).unlink()
    assert teardown.release(JobKey(732, 1), node.backend, timeout=30).clean
    then = os.stat(picks).st_mtime - 3600
    os.utime(picks, (then, then))

    node.reaper.run_round()

    assert not picks.exists()
