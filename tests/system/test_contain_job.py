"""containment.contain_job, the one way a process gets into its job's cgroups (the prolog's
and gecod's), on this machine's real cgroup v1 hierarchies: what it does, and what it says
it did.

Every test works in its own parent ``geco-test-<pid>-<n>`` (tests/cgroup_testkit.py),
removed afterwards with plain syscalls; the job's spool dir and resource file are made
under pytest's tmp_path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco import jobfiles
from geco.cgroup import V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.errors import CgroupError, GecoError
from geco.job.containment import contain_job
from geco.job.undo import undo_job
from geco.jobkey import JobKey
from geco.node import gpus
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.sge.execd import JobRef
from tests.cgroup_testkit import Child, open_verdicts, usable_v1_hierarchies, v1_backend, verdicts
from tests.logkit import RecordingHandler, handler_on

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]
MiB = 1 << 20


@pytest.fixture
def backend() -> Iterator[V1Backend]:
    with v1_backend(HIER, exclusive_cpus=False) as b:
        yield b


def spooled(tmp_path: Path, job: int, *hosts: NodeResources) -> tuple[JobRef, Config]:
    """A job's spool dir (``active_jobs/<job>.1``) and its resource file."""
    cfg = Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool",
                 pids_per_slot=0)
    spool = cfg.execd_spool_dir / short_hostname() / "active_jobs" / f"{job}.1"
    spool.mkdir(parents=True)
    resourcefile.write(cfg.resources_dir, ResourceSet(job, 1, owner="alice", nodes=hosts))
    return JobRef(job, 1, spool), cfg


def test_the_first_process_makes_the_cgroups_and_the_next_joins_them(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a job whose resource file grants 1 slot and 64 MiB here and no cgroups yet,
    then the first contain_job makes them from the file and says so (created, source
    file); a second process joins them without reading any resources (found None), with
    the same limits; both processes are in the job's cgroups."""
    job, cfg = spooled(tmp_path, 31, NodeResources(short_hostname(), slots=1,
                                                   memory_limit=64 * MiB))
    first, second = Child(lambda _: None, children), Child(lambda _: None, children)

    made = contain_job(job, cfg, backend, pid=first.pid)
    joined = contain_job(job, cfg, backend, pid=second.pid)

    assert (made.created, made.found is not None and made.found.source) == (True, "file")
    assert made.found is not None and made.found.resources.owner == "alice"
    assert made.limits.memory == 64 * MiB and len(made.limits.cpus.split(",")) == 1
    assert (joined.created, joined.found, joined.limits) == (False, None, made.limits)
    assert sorted(backend.pids(job.key)) == sorted([first.pid, second.pid])


def test_a_shepherd_already_inside_is_joined_without_a_move(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a job whose cgroups gecod made with its shepherd inside (the preload), when the
    prolog finds it there (backend.contains) and passes no pid, then contain_job joins the
    cgroups with the same limits and the shepherd is still the job's one process."""
    job, cfg = spooled(tmp_path, 33, NodeResources(short_hostname(), slots=1,
                                                   memory_limit=64 * MiB))
    shepherd = Child(lambda _: None, children).pid
    made = contain_job(job, cfg, backend, pid=shepherd)

    assert backend.contains(job.key, shepherd)
    joined = contain_job(job, cfg, backend, pid=None)

    assert (joined.created, joined.limits) == (False, made.limits)
    assert backend.pids(job.key) == [shepherd]
    assert not backend.contains(job.key, Child(lambda _: None, children).pid)


def test_given_the_resources_then_none_are_read_and_the_source_is_kept(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given resources the caller already has (the prolog journals them first), then
    contain_job uses them as they are, not the resource file."""
    job, cfg = spooled(tmp_path, 32, NodeResources(short_hostname(), memory_limit=64 * MiB))
    from geco.sge.lookup import Found

    given = ResourceSet(32, 1, owner="bob",
                        nodes=(NodeResources(short_hostname(), memory_limit=96 * MiB),))
    done = contain_job(job, cfg, backend, pid=Child(lambda _: None, children).pid,
                       found=Found(given, "qstat", 0.5))

    assert done.found == Found(given, "qstat", 0.5)
    assert done.limits.memory == 96 * MiB


def test_a_job_without_slots_here_is_refused_naming_its_hosts_and_nothing_is_made(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a resource set whose hosts are all other nodes, then contain_job raises one
    GecoError naming this host and the job's hosts, and makes no cgroup."""
    job, cfg = spooled(tmp_path, 33, NodeResources("n-other-1"), NodeResources("n-other-2"))

    with pytest.raises(GecoError) as err:
        contain_job(job, cfg, backend,
                    pid=Child(lambda _: None, children).pid)

    assert str(err.value) == (f"job 33.1 has no slots on this host ({short_hostname()}); "
                              "its hosts: n-other-1, n-other-2")
    assert not backend.exists(job.key)


def test_cpus_kept_for_the_nodes_daemons_are_never_given_to_a_job(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given [cgroup] cpus_reserve naming one of the GECO parent's cpus, then a job gets
    another one, and when only reserved cpus are left, the next job is refused (its
    cores unavailable) with nothing of it made."""
    from geco.cpulist import format_cpulist, parse_cpulist
    from geco.errors import CoresUnavailable

    cpus = sorted(parse_cpulist(backend.available_cpus()))
    if len(cpus) < 2:
        pytest.skip("the GECO parent has fewer than 2 cpus")
    kept = format_cpulist(cpus[:-1])
    job, cfg = spooled(tmp_path, 41, NodeResources(short_hostname(), slots=1))
    cfg = cfg._replace(cpus_reserve=kept)
    made = contain_job(job, cfg, backend, pid=Child(lambda _: None, children).pid)
    assert made.limits.cpus == str(cpus[-1])

    other, _ = spooled(tmp_path, 42, NodeResources(short_hostname(), slots=1))
    with pytest.raises(CoresUnavailable):
        contain_job(other, cfg, backend, pid=Child(lambda _: None, children).pid)
    assert not backend.exists(other.key)


def test_a_job_whose_teardown_is_removing_its_cgroups_does_not_stop_another_from_starting(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a job whose cpuset cgroup its teardown has just removed while its other
    hierarchies still list it (teardown removes them one after the other, outside the node
    lock), when another job is contained, then that succeeds: the vanishing job holds no
    cores (before, its half-removed cgroups made the other job's start fail and Grid Engine
    re-queue it)."""
    from geco.cgroup import Limits

    spooled(tmp_path, 50, NodeResources(short_hostname(), slots=1))  # still Grid Engine's
    backend.create(JobKey(50, 1), Limits())
    backend.paths(JobKey(50, 1))["cpuset"].rmdir()
    job, cfg = spooled(tmp_path, 51, NodeResources(short_hostname(), slots=1))
    made = contain_job(job, cfg, backend, pid=Child(lambda _: None, children).pid)
    assert made.created and made.limits.cpus


@pytest.mark.skipif("devices" not in HIER, reason="no v1 devices hierarchy here")
@pytest.mark.skipif(bool(gpus.node_table()), reason="this host has GPUs geco knows of")
def test_on_a_node_without_gpus_a_job_is_denied_every_nvidia_device(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a node where geco knows no GPU (this host: no driver table, no /dev/nvidia<N>,
    no [gpu] devices), when a job is contained, then it gets EPERM on NVIDIA's devices
    (c 195:N, made by mknod as nvidia-modprobe would make them once the driver is there,
    nvidiactl 195:255 too), while ordinary devices and a pty work; it is told of no GPU
    (gpus None). Before, nothing was denied: the open reached the missing driver (ENXIO),
    and with the driver loaded later the job could open every GPU."""
    nodes = {f"nvidia{minor}": minor for minor in (0, 7, 255)}
    for name, minor in nodes.items():
        os.mknod(tmp_path / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    paths = {name: str(tmp_path / name) for name in nodes} | {"null": "/dev/null"}
    job, cfg = spooled(tmp_path, 61, NodeResources(short_hostname(), slots=1))
    child = Child(open_verdicts(paths), children)

    done = contain_job(job, cfg, backend, pid=child.pid)
    child.go()

    assert done.created and done.gpus is None
    assert verdicts(child) == {"nvidia0": "EPERM", "nvidia7": "EPERM", "nvidia255": "EPERM",
                               "null": "open", "pty": "open"}


@pytest.mark.skipif(bool(gpus.node_table()), reason="this host has GPUs geco knows of")
def test_on_a_node_without_gpus_a_job_granted_some_is_refused_with_nothing_made(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a job Grid Engine granted a GPU here and a node where geco knows none, then it
    is refused (it must not start believing it has one) and nothing of it is made."""
    job, cfg = spooled(tmp_path, 62, NodeResources(short_hostname(), slots=1, gpus="0"))

    with pytest.raises(GecoError) as err:
        contain_job(job, cfg, backend, pid=Child(lambda _: None, children).pid)

    assert str(err.value) == (f"job 62.1 was granted GPUs (0) on {short_hostname()}, which "
                              "has none geco knows of: is the driver loaded, or [gpu] "
                              "devices set?")
    assert not backend.exists(job.key)


def refuse_devices(backend: V1Backend, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The backend's deny_devices answers as under gecod.service, whose capabilities lack
    CAP_SYS_ADMIN (the kernel's EPERM); return the lists it was asked to deny."""
    asked: list[object] = []

    def deny_devices(key: str, devices: object) -> None:
        asked.append(devices)
        raise CgroupError("cannot write to devices.deny: Operation not permitted",
                          errno="EPERM", key=key)
    monkeypatch.setattr(backend, "deny_devices", deny_devices)
    return asked


@pytest.mark.skipif(bool(gpus.node_table()), reason="this host has GPUs geco knows of")
def test_on_a_node_without_gpus_a_process_that_cannot_deny_devices_still_contains_the_job(
        backend: V1Backend, children: list[int], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a node without GPUs and a containing process the kernel refuses device rules
    (gecod under its unit has no CAP_SYS_ADMIN), then the job is contained all the same, as
    before NVIDIA's devices were denied there, and a warning says they are not, once per
    process."""
    asked = refuse_devices(backend, monkeypatch)
    monkeypatch.setattr("geco.job.containment._devices_open_said", False)
    records = RecordingHandler()
    with handler_on("geco.job.containment", records):
        for job in (63, 64):
            ref, cfg = spooled(tmp_path, job, NodeResources(short_hostname(), slots=1))
            done = contain_job(ref, cfg, backend, pid=Child(lambda _: None, children).pid)
            assert done.created and backend.exists(ref.key)

    assert asked == [[("c", 195, None)]] * 2
    said = [r for r in records.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in said] == [
        "job 63.1: NVIDIA's devices are not denied to the jobs this process contains on this "
        "node, which has no GPU geco knows of (a driver loaded later would let them open "
        "every GPU): cannot write to devices.deny: Operation not permitted (errno=EPERM "
        "key=63.1); gecod needs CAP_SYS_ADMIN for it (v2: or CAP_BPF)"]
    assert getattr(said[0], "geco_fields", {})["GECO_EVENT"] == "nvidia-devices-open"


def test_on_a_gpu_node_a_process_that_cannot_deny_devices_refuses_the_job(
        backend: V1Backend, children: list[int], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a node with GPUs, then a job whose other GPUs cannot be denied is refused with
    the kernel's reason, and nothing of it is left: it must not start with GPUs it was not
    granted."""
    refuse_devices(backend, monkeypatch)
    for name, minor in (("gpu0", 0), ("gpu1", 1)):
        os.mknod(tmp_path / name, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    ref, cfg = spooled(tmp_path, 65, NodeResources(short_hostname(), slots=1, gpus="0"))
    cfg = cfg._replace(gpu_devices=(str(tmp_path / "gpu0"), str(tmp_path / "gpu1")))

    with pytest.raises(CgroupError) as err:
        contain_job(ref, cfg, backend, pid=Child(lambda _: None, children).pid)

    assert str(err.value) == ("cannot write to devices.deny: Operation not permitted "
                              "(errno=EPERM key=65.1)")
    assert not backend.exists(ref.key)


def test_a_job_undone_leaves_nothing_here_and_a_second_undo_is_nothing_to_do(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a job contained with a process (its resource file, an OOM count and a stuck
    marker beside), when it is undone (a re-queue, a master's ABORT), then its process is
    killed, its cgroups are gone, the release is clean with its kill counted, and none of
    the files its end forgets is left; undoing it again finds nothing."""
    job, cfg = spooled(tmp_path, 33, NodeResources(short_hostname(), slots=1))
    child = Child(lambda _: None, children)
    contain_job(job, cfg, backend, pid=child.pid)
    for path in (jobfiles.oom_count(cfg.state_dir, job.key),
                 jobfiles.stuck_marker(cfg.state_dir, job.key)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")

    done = undo_job(job.key, cfg._replace(kill_timeout=30.0), backend)

    assert (done.clean, done.killed) == (True, 1)
    assert not backend.exists(job.key)
    assert child.wait() == -9
    assert [k.what for k in jobfiles.ENDED if k.path(cfg, job.key).exists()] == []
    assert undo_job(job.key, cfg, backend) == (0, (), {})
