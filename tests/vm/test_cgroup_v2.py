"""The cgroup v2 backend against a real cgroup2 with cpuset and memory.

Runs INSIDE the QEMU machine (systemd as PID 1, pure cgroup v2): the host's
``tests/system/test_gecod_systemd_vm.py`` boots it with ``run-in-vm.sh`` and runs
``python3 -m pytest ... tests/vm tests/vm_systemd`` there. The guest has
no venv: the standard library, pytest and geco (with Debian's python3-lxml
for geco.job.teardown's qstat import) are what is used.
The helpers shared with tests/system/test_cgroup_v1.py are in
``tests/cgroup_testkit.py``, standard library only as well.

Each test works below its own base ``/sys/fs/cgroup/geco-test-<pid>-<n>``,
removed afterwards with plain syscalls (SIGKILL, rmdir), not with the code
under test. What is checked is what the kernel does: the affinity a moved
process sees, the OOM kill, processes that stop counting while frozen,
``cgroup.kill`` catching a forking job, "no internal processes", the CPU
time ``cpu.stat`` charges, and a teardown through a frozen sub-cgroup.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco.cgroup import Limits, V2Backend, detect, parse_mountinfo
from geco.config import Config
from geco.errors import CgroupError
from geco.job.teardown import tear_down
from tests.cgroup_testkit import (
    Child,
    count,
    counter_body,
    cpu_list,
    eventually,
    fork_forever,
    forked_children,
    gpu_story,
    kill_from_inside_story,
    move_story,
    parent_name,
    parse_list,
    read,
    report_affinity,
    small_lives_big_dies,
    spin,
    start_in,
    usage_after_kill,
)

MiB = 1 << 20
MOUNT = Path("/sys/fs/cgroup")


def _usable_cgroup2() -> str:
    """Why this machine cannot run these tests, or "" when it can."""
    if os.geteuid() != 0:
        return "writing cgroups needs root"
    mounts = [m for m in parse_mountinfo(Path("/proc/self/mountinfo").read_bytes())
              if m.mount_point == MOUNT]
    if not mounts or mounts[-1].fstype != "cgroup2":
        return (f"{MOUNT} is not a cgroup2 mount here; these tests run in the QEMU machine "
                "(tests/system/test_gecod_systemd_vm.py)")
    have = (MOUNT / "cgroup.controllers").read_text().split()
    if not {"cpuset", "memory"} <= set(have):
        return f"the cgroup2 at {MOUNT} lacks cpuset or memory (it has: {' '.join(have)})"
    return ""


WHY_NOT = _usable_cgroup2()
pytestmark = [pytest.mark.vm, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]
needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                    reason="this machine has fewer than 2 cpus")


# -- helpers (the shared ones are in tests/cgroup_testkit.py) -----------------


def sleeper(out: int) -> None:
    os.close(out)
    os.execvp("sleep", ["sleep", "300"])


@pytest.fixture
def children() -> Iterator[list[int]]:
    with forked_children() as pids:
        yield pids


@pytest.fixture
def name(children: list[int]) -> Iterator[str]:
    with parent_name([MOUNT]) as n:
        yield n


@pytest.fixture
def backend(name: str) -> V2Backend:
    b = V2Backend(MOUNT, name)
    b.ensure_root()
    return b


# -- detection and the base ---------------------------------------------------


def test_given_a_pure_cgroup2_when_detecting_then_v2_is_chosen() -> None:
    b = detect(name="geco-test-detect")
    assert isinstance(b, V2Backend)
    assert (b.version, b.base) == (2, MOUNT / "geco-test-detect")
    assert {"cpuset", "memory"} <= set(b.controllers)
    assert not b.base.exists()  # detect() itself creates nothing


def _remount(options: str) -> None:
    """mount(2) with MS_REMOUNT and exactly ``options`` for the cgroup2 at MOUNT."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"cgroup2", bytes(MOUNT), b"cgroup2", 32, options.encode()) != 0:  # MS_REMOUNT
        raise OSError(ctypes.get_errno(), f"remount {MOUNT} with {options}")


def test_given_the_readmes_remount_then_geco_check_says_the_kernel_moves_at_once() -> None:
    """README, Busy nodes: on cgroup v2, ``mount -o remount,favordynmods /sys/fs/cgroup``
    puts the kernel's moves in favordynmods mode and ``geco check`` says so; a remount with
    the boot's own options (mount(2): mount(8) would keep the options it finds) puts the
    kernel's default back, and the line follows."""
    from geco.reports import nodeview

    def moves() -> str:
        return dict(nodeview.lines(Config(), detect(name="geco-test-moves")))["moves"]

    boot = [m for m in parse_mountinfo(Path("/proc/self/mountinfo").read_bytes())
            if m.mount_point == MOUNT][-1].super_options
    assert "favordynmods" not in boot, boot  # a stock kernel and systemd leave it off
    before = moves()
    subprocess.run(["mount", "-o", "remount,favordynmods", str(MOUNT)], check=True)
    try:
        during = moves()
    finally:
        _remount(",".join(boot))
    assert before.startswith("the kernel's default: "), before
    assert during.startswith("favordynmods: the kernel moves a process into its job at once")
    assert moves() == before


def test_given_a_nested_base_when_ensure_root_then_controllers_are_enabled_down_to_it(
        name: str) -> None:
    """Like a systemd-delegated subtree: every level passes the controllers down."""
    base = MOUNT / name / "deleg" / "jobs"
    b = V2Backend(MOUNT, "GECO", base=base)
    b.ensure_root()
    b.ensure_root()  # idempotent
    for d in (MOUNT, MOUNT / name, MOUNT / name / "deleg", base):
        assert set(b.controllers) <= set(read(d / "cgroup.subtree_control").split()), d
    b.create("1.1", Limits(cpus="0"))
    assert read(base / "1.1" / "cpuset.cpus.effective") == "0"
    assert b.available_cpus() == read(MOUNT / "cpuset.cpus.effective")


def test_given_a_base_whose_parent_holds_a_process_when_ensure_root_then_no_internal_processes(
        name: str, children: list[int]) -> None:
    outer = V2Backend(MOUNT, name)
    outer.ensure_root()
    outer.create("1.1", Limits())
    start_in(outer, "1.1", sleeper, children)
    inner = V2Backend(MOUNT, "GECO", base=MOUNT / name / "1.1" / "jobs")
    with pytest.raises(CgroupError) as err:
        inner.ensure_root()
    d = MOUNT / name / "1.1"
    assert str(err.value) == (
        f"cannot write +{' +'.join(inner.controllers)} to cgroup.subtree_control: Device or "
        f"resource busy; {d} holds processes itself, and cgroup v2 passes controllers only "
        "through cgroups without processes ('no internal processes'): move them into a leaf "
        f"cgroup, or choose another base (errno=EBUSY path={d}/cgroup.subtree_control)")


# -- cpus ---------------------------------------------------------------------


@needs_two_cpus
def test_given_jobs_on_cpu_1_and_cpu_0_when_a_process_joins_then_its_affinity_is_that_cpu(
        backend: V2Backend, children: list[int]) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    for task, cpu in enumerate(reversed(cpus), start=1):
        key = f"5.{task}"
        backend.create(key, Limits(cpus=str(cpu)))
        child = Child(report_affinity, children)
        backend.add_pid(key, child.pid)
        assert backend.contains(key, child.pid)
        child.go()
        assert child.output() == str(cpu).encode()
        assert child.wait() == 0
    assert backend.job_keys() == ["5.1", "5.2"]
    assert backend.read_limits("5.1").cpus == str(cpus[1])


def test_given_no_cpus_when_created_then_the_job_inherits_the_base(
        backend: V2Backend, children: list[int]) -> None:
    backend.create("5.3", Limits(cpus="0"))
    backend.create("5.3", Limits())  # re-applying "" empties cpuset.cpus again
    assert read(backend.paths("5.3")["cpuset"] / "cpuset.cpus") == ""
    child = start_in(backend, "5.3", report_affinity, children)
    inherited = parse_list(read(backend.base / "cpuset.cpus.effective"))
    assert child.output().decode() == cpu_list(inherited)
    assert child.wait() == 0


# -- memory -------------------------------------------------------------------


@pytest.mark.parametrize("limits", [Limits(memory=64 * MiB), Limits(memory_swap=64 * MiB)],
                         ids=["memory", "memory_swap-only"])
def test_given_a_64mib_limit_when_a_child_touches_200mib_then_the_kernel_kills_only_it(
        backend: V2Backend, children: list[int], limits: Limits) -> None:
    backend.create("7.1", limits)
    d = backend.paths("7.1")["memory"]
    assert read(d / "memory.max") == str(64 * MiB)
    assert read(d / "memory.swap.max") == ("0" if limits.memory_swap else "max")
    small_lives_big_dies(backend, "7.1", children, 16 * MiB, 200 * MiB)
    usage = backend.usage("7.1")
    assert usage["oom_kill"] >= 1
    assert usage["memory_max_events"] > 0
    assert 16 * MiB < usage["memory_peak"] <= 64 * MiB
    assert backend.read_limits("7.1") == Limits(memory=64 * MiB,
                                                memory_swap=limits.memory_swap)


def test_given_ram_and_ram_plus_swap_when_created_then_swap_max_is_the_difference(
        backend: V2Backend) -> None:
    for memory, memory_swap in [(64 * MiB, 96 * MiB), (128 * MiB, 64 * MiB), (32 * MiB, 0)]:
        backend.create("8.1", Limits(memory=memory, memory_swap=memory_swap))
        d = backend.paths("8.1")["memory"]
        ram = min(v for v in (memory, memory_swap) if v)
        assert read(d / "memory.max") == str(ram)
        assert read(d / "memory.swap.max") == (str(memory_swap - ram) if memory_swap else "max")
        assert backend.read_limits("8.1") == Limits(memory=ram, memory_swap=memory_swap)


# -- pids, freeze, kill, destroy ----------------------------------------------


def test_given_a_running_job_when_frozen_then_it_stops_and_when_thawed_it_runs_again(
        backend: V2Backend, children: list[int]) -> None:
    counter = mmap.mmap(-1, 8)
    backend.create("9.1", Limits())
    child = start_in(backend, "9.1", counter_body(counter), children)
    assert eventually(lambda: count(counter) > 0)
    backend.freeze("9.1")
    assert "frozen 1" in read(backend.paths("9.1")["memory"] / "cgroup.events").splitlines()
    frozen_at = count(counter)
    time.sleep(0.5)
    assert count(counter) == frozen_at
    backend.thaw("9.1")
    assert eventually(lambda: count(counter) > frozen_at)
    backend.freeze("9.1")
    assert backend.kill("9.1") == 1  # a frozen process still dies of SIGKILL on v2
    assert child.wait() == -signal.SIGKILL


def test_given_a_forking_job_with_a_pids_limit_when_killed_then_nothing_is_left(
        backend: V2Backend, children: list[int]) -> None:
    if "pids" not in backend.controllers:
        pytest.skip("the pids controller is not available on this machine")
    backend.create("10.1", Limits(pids=32))
    child = start_in(backend, "10.1", fork_forever, children)
    assert eventually(lambda: len(backend.pids("10.1")) == 32)
    time.sleep(0.2)
    assert len(backend.pids("10.1")) == 32
    assert (backend.paths("10.1")["pids"] / "cgroup.kill").exists()
    assert backend.kill("10.1") == 32
    assert backend.wait_empty("10.1", 30)
    assert child.wait() == -signal.SIGKILL
    backend.destroy("10.1")
    assert not backend.paths("10.1")["pids"].exists()
    assert backend.job_keys() == []


def test_given_processes_left_when_destroyed_then_the_error_lists_them(
        backend: V2Backend, children: list[int]) -> None:
    backend.create("11.1", Limits())
    child = start_in(backend, "11.1", sleeper, children)
    assert eventually(lambda: backend.pids("11.1") == [child.pid])
    assert not backend.wait_empty("11.1", 0.1)
    with pytest.raises(CgroupError) as err:
        backend.destroy("11.1")
    d = backend.paths("11.1")["memory"]
    assert str(err.value) == (f"cannot remove the cgroup of job 11.1: processes {child.pid} "
                              f"are still in it (key=11.1 pids={child.pid} path={d})")
    assert backend.kill("11.1") == 1
    assert backend.wait_empty("11.1", 30)
    backend.destroy("11.1")
    backend.destroy("11.1")  # already gone is fine
    assert not d.exists()


def test_given_a_process_in_a_job_when_moved_to_another_process_cgroup_then_it_leaves(
        backend: V2Backend, children: list[int]) -> None:
    """The epilog steps out to sge_execd's cgroups."""
    move_story(backend, children, sleeper)


def test_given_the_caller_inside_the_job_when_it_kills_the_job_then_it_is_refused(
        backend: V2Backend, children: list[int]) -> None:
    """The epilog runs inside the job; killing from there would kill the epilog itself."""
    kill_from_inside_story(backend, children)


@pytest.mark.parametrize("bad", ["../x", "1/2", ".", ""])
def test_given_a_bad_key_when_used_then_it_is_refused_and_nothing_is_created(
        backend: V2Backend, bad: str) -> None:
    before = sorted(os.listdir(backend.base))
    with pytest.raises(CgroupError) as err:
        backend.create(bad, Limits())
    assert str(err.value) == ("a job cgroup key must be <job>.<task> in decimal digits without "
                              f"leading zeros (e.g. 42.1), got {bad!r}")
    assert sorted(os.listdir(backend.base)) == before


# -- nested cgroups and CPU time ----------------------------------------------


def test_given_a_process_in_a_sub_cgroup_when_the_job_is_killed_then_it_dies_and_all_goes(
        backend: V2Backend, children: list[int]) -> None:
    """pids, kill (cgroup.kill), wait_empty and destroy cover the job's whole subtree."""
    backend.create("16.1", Limits())
    child = start_in(backend, "16.1", sleeper, children)
    inner = backend.paths("16.1")["memory"] / "inner"
    inner.mkdir()
    (inner / "cgroup.procs").write_text(str(child.pid))
    assert backend.pids("16.1") == [child.pid]
    assert backend.relative_cgroup("16.1", child.pid) == "inner"
    assert backend.kill("16.1") == 1
    assert child.wait() == -signal.SIGKILL
    assert backend.wait_empty("16.1", 30)
    backend.destroy("16.1")
    assert not inner.exists()
    assert not backend.paths("16.1")["memory"].exists()


def test_given_cpu_stat_when_a_child_spins_then_the_job_is_charged_and_keeps_it_after_exit(
        backend: V2Backend, children: list[int]) -> None:
    """cpu.stat is there without the cpu controller enabled, and outlives the process."""
    backend.create("17.1", Limits())
    idle = backend.usage("17.1")
    assert (idle["cpu_user_usec"], idle["cpu_system_usec"]) == (0, 0)
    child = start_in(backend, "17.1", spin(0.3), children)
    assert child.output() == b"spun"
    running = backend.usage("17.1")
    assert running["cpu_user_usec"] > 200_000
    gone = usage_after_kill(backend, "17.1", child, 30)
    assert gone["cpu_user_usec"] >= running["cpu_user_usec"]
    assert gone["cpu_system_usec"] >= running["cpu_system_usec"]


def test_given_a_process_in_a_frozen_sub_cgroup_when_torn_down_then_v2_still_kills_it(
        backend: V2Backend, children: list[int], tmp_path: Path) -> None:
    """Unlike v1, a frozen v2 task dies of SIGKILL: the teardown ends clean, subtree and all."""
    backend.create("18.1", Limits())
    child = start_in(backend, "18.1", sleeper, children)
    inner = backend.paths("18.1")["memory"] / "stuck"
    inner.mkdir()
    (inner / "cgroup.procs").write_text(str(child.pid))
    (inner / "cgroup.freeze").write_text("1")
    assert eventually(lambda: "frozen 1" in read(inner / "cgroup.events").splitlines())
    cfg = Config()._replace(kill_timeout=30.0, state_dir=tmp_path)
    result = tear_down("18.1", backend, cfg, queue_instance=None, cleaned_by="epilog",
                       qmod="/bin/false")
    assert (result.clean, result.killed, result.stuck, result.queue_disabled) == \
        (True, 1, (), None)
    assert result.accounting.cpu_user is not None
    assert child.wait() == -signal.SIGKILL
    assert not backend.paths("18.1")["memory"].exists()


# -- devices: the GPUs a job was not granted ---------------------------------------


def test_given_two_gpus_when_jobs_are_granted_one_each_then_each_opens_only_its_own(
        backend: V2Backend, children: list[int], tmp_path: Path) -> None:
    """Through contain_job, with a BPF device program per job (cgroup_testkit.gpu_story)."""
    gpu_story(backend, children, tmp_path)


# -- the node's reserve ---------------------------------------------------------------


def test_given_a_reserve_when_a_job_without_a_limit_touches_more_than_the_rest_then_it_is_killed(
        backend: V2Backend, children: list[int]) -> None:
    """Given the base held to 64 MiB (the node's RAM less the reserve, made small), when a
    job with no limit of its own touches 200 MiB, then the kernel kills it at the base's
    limit, while one that touches 16 MiB lives: the reserve covers every job below."""
    backend.set_parent_memory(64 * MiB)
    assert read(backend.base / "memory.max") == str(64 * MiB)
    backend.create("9.1", Limits())
    small_lives_big_dies(backend, "9.1", children, 16 * MiB, 200 * MiB)
    assert backend.read_limits("9.1").memory == 0


def test_given_memory_reserve_in_the_config_then_contain_job_holds_the_base_to_ram_less_it(
        backend: V2Backend, children: list[int], tmp_path: Path) -> None:
    """Through contain_job, as the prolog and gecod set it: the base's memory.max is the
    node's RAM less [cgroup] memory_reserve, in whole pages."""
    from geco.job.containment import contain_job
    from geco.resourceset import NodeResources, ResourceSet
    from geco.sge.execd import JobRef
    from geco.sge.lookup import Found

    reserve = 256 * MiB
    cfg = Config(state_dir=tmp_path / "state", memory_reserve=reserve, pids_per_slot=0)
    rs = ResourceSet(10, 1, owner="root", nodes=(NodeResources("here"),))
    contain_job(JobRef(10, 1, None), cfg, backend, pid=Child(lambda _: None, children).pid,
                found=Found(rs, "file", 0.0), hostname="here")
    page = os.sysconf("SC_PAGE_SIZE")
    ram = os.sysconf("SC_PHYS_PAGES") * page
    assert int(read(backend.base / "memory.max")) == (ram - reserve) // page * page
