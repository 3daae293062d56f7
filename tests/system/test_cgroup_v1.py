"""The cgroup v1 backend against this machine's real v1 hierarchies.

Every test works in its own parent named ``geco-test-<pid>-<n>`` (never
``GECO``) in each controller; the ``name`` fixture removes it afterwards
with plain syscalls (thaw, SIGKILL, rmdir), not with the code under test,
so a broken backend cannot leak cgroups or processes. When an idle
cpu_exclusive cpuset holds the machine's cpus (the GECO that geco's prolog
leaves after tests/integration), the test cpuset parents go inside it: see
:func:`usable_hierarchies`.

What is checked is what the kernel does: the affinity a moved process sees,
the OOM kill, processes that stop counting while frozen, and the kernel's
refusal of overlapping exclusive cpusets.
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.cgroup import (
    Hierarchy,
    Limits,
    V1Backend,
    detect,
    find_hierarchies,
    parse_mountinfo,
)
from geco.cgroup._v1 import find_systemd_hierarchies
from geco.errors import CgroupError, JobKeyError
from geco.jobkey import JobKey
from tests.cgroup_testkit import (
    count,
    counter_body,
    cpu_list,
    eventually,
    fork_forever,
    gpu_story,
    kill_from_inside_story,
    mig_story,
    move_story,
    parent_name,
    parse_list,
    read,
    report_affinity,
    small_lives_big_dies,
    spin,
    start_in,
    usable_v1_hierarchies,
    usage_after_kill,
)

MiB = 1 << 20
MOUNTINFO = Path("/proc/self/mountinfo").read_bytes()
MOUNTED = find_hierarchies(parse_mountinfo(MOUNTINFO), Path("/sys/fs/cgroup"))
# systemd's own hierarchies on this hybrid host: name=systemd and the cgroup2 "unified"
SYSTEMD = find_systemd_hierarchies(parse_mountinfo(MOUNTINFO), Path("/sys/fs/cgroup"))


def remove_idle_geco() -> str:
    """Remove geco's own top-level GECO cgroups when no job is in them; say why not otherwise.

    Its cpuset overlaps every cpu, so while it exists no top-level test cpuset can be
    cpu_exclusive. An empty GECO holds no state (geco rebuilds it from the job
    cgroups, and the next prolog recreates it), so removing it loses nothing.
    """
    dirs = [h.mount_point / "GECO" for h in MOUNTED.values() if (h.mount_point / "GECO").is_dir()]
    jobs = sorted({d.name for g in dirs for d in g.iterdir() if d.is_dir()})
    if jobs:
        return f"geco's GECO cgroups hold jobs ({', '.join(jobs)}); run this module when idle"
    for geco in dirs:
        geco.rmdir()
    return ""


HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)]
needs_two_cpus = pytest.mark.skipif(
    bool(HIER) and len(parse_list((HIER["cpuset"].mount_point / "cpuset.cpus").read_text())) < 2,
    reason="this machine has fewer than 2 cpus")


@pytest.fixture(autouse=True, scope="module")
def _idle_geco() -> None:
    """Run after collection (the integration tests may have made GECO meanwhile)."""
    busy = remove_idle_geco()
    if busy:
        pytest.skip(busy)


# -- helpers (the shared ones are in tests/cgroup_testkit.py) -----------------


def exec_shell(script: str) -> Callable[[int], None]:
    def body(out: int) -> None:
        os.close(out)
        os.execvp("sh", ["sh", "-c", script])
    return body


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh parent name; whatever is created under it in any controller is removed after."""
    with parent_name(h.mount_point for h in HIER.values()) as n:
        yield n


# children: tests/system/conftest.py


@pytest.fixture
def backend(name: str, children: list[int]) -> V1Backend:
    b = V1Backend(HIER, name)
    b.ensure_root()
    return b


# -- detection ----------------------------------------------------------------


def test_given_this_hybrid_host_when_detecting_then_v1_is_chosen() -> None:
    """Given v1 controllers plus a near-empty cgroup2 at /sys/fs/cgroup/unified, detect() is v1."""
    b = detect(name="geco-test-detect")
    assert isinstance(b, V1Backend)
    assert b.version == 1
    # cross-check every hierarchy with mountinfo read independently of geco's parser
    for ctrl, h in b.hierarchies.items():
        lines = [line for line in MOUNTINFO.decode().splitlines()
                 if " - cgroup " in line and ctrl in line.split(" - ")[1].split()[2].split(",")]
        assert str(h.mount_point) in [line.split()[4] for line in lines]
    assert {"cpuset", "memory"} <= set(b.controllers)


def test_given_no_cgroup2_at_the_mount_when_v2_is_forced_then_the_error_says_why() -> None:
    fstype = [line.split(" - ")[1].split()[0] for line in MOUNTINFO.decode().splitlines()
              if line.split()[4] == "/sys/fs/cgroup"][-1]
    with pytest.raises(CgroupError) as err:
        detect(version="2")
    assert str(err.value) == (f"cgroup version 2 is configured, but /sys/fs/cgroup is a "
                              f"{fstype} mount, not cgroup2 (path=/sys/fs/cgroup)")


def test_given_the_unified_mount_lacks_cpuset_when_auto_then_v1_is_still_found() -> None:
    unified = Path("/sys/fs/cgroup/unified")
    if not (unified / "cgroup.controllers").exists():
        pytest.skip("this machine has no cgroup2 at /sys/fs/cgroup/unified")
    have = read(unified / "cgroup.controllers")
    if "cpuset" in have.split():
        pytest.skip("the cgroup2 at /sys/fs/cgroup/unified has cpuset here")
    assert detect(unified, "geco-test-detect").version == 1
    with pytest.raises(CgroupError) as err:
        detect(unified, "geco-test-detect", "2")
    missing = " and ".join(c for c in ("cpuset", "memory") if c not in have.split())
    assert str(err.value) == (f"cgroup version 2 is configured, but {unified}/cgroup.controllers "
                              f"lacks {missing} (it has: {have or 'nothing'}; cgroup v1 may "
                              f"hold them) (path={unified})")


# -- the GECO parent ----------------------------------------------------------


def test_given_no_parent_when_ensure_root_then_it_copies_the_root_cpuset_and_is_exclusive(
        name: str) -> None:
    b = V1Backend(HIER, name)
    b.ensure_root()
    b.ensure_root()  # idempotent
    parents = b.parent_paths()
    assert all(p.is_dir() for p in parents.values())
    top = HIER["cpuset"].mount_point
    assert read(parents["cpuset"] / "cpuset.cpus") == read(top / "cpuset.cpus")
    assert read(parents["cpuset"] / "cpuset.mems") == read(top / "cpuset.mems")
    assert read(parents["cpuset"] / "cpuset.cpu_exclusive") == "1"
    assert b.available_cpus() == read(top / "cpuset.cpus")
    assert b.available_mems() == read(top / "cpuset.mems")


def test_given_exclusive_cpus_off_when_ensure_root_then_the_parent_is_not_exclusive(
        name: str) -> None:
    b = V1Backend(HIER, name, exclusive_cpus=False)
    b.ensure_root()
    assert read(b.parent_paths()["cpuset"] / "cpuset.cpu_exclusive") == "0"


def test_given_an_admin_made_parent_with_fewer_cpus_when_ensure_root_then_it_is_untouched(
        name: str, children: list[int]) -> None:
    """An admin may pre-create GECO with fewer cpus to reserve cores; geco must keep that."""
    parent = HIER["cpuset"].mount_point / name
    reserved = max(parse_list(read(HIER["cpuset"].mount_point / "cpuset.cpus")))
    os.mkdir(parent)
    (parent / "cpuset.cpus").write_text(str(reserved))
    (parent / "cpuset.mems").write_text(read(HIER["cpuset"].mount_point / "cpuset.mems"))
    b = V1Backend(HIER, name)
    b.ensure_root()
    assert read(parent / "cpuset.cpus") == str(reserved)
    assert read(parent / "cpuset.cpu_exclusive") == "0"
    assert b.available_cpus() == str(reserved)
    # job cpusets under a non-exclusive parent cannot be exclusive; the job still works
    b.create("1.1", Limits(cpus=str(reserved)))
    assert read(b.paths("1.1")["cpuset"] / "cpuset.cpu_exclusive") == "0"
    child = start_in(b, "1.1", report_affinity, children)
    assert child.output() == str(reserved).encode()
    assert child.wait() == 0


def test_given_an_admin_made_parent_without_cpus_when_ensure_root_then_it_says_so(
        name: str) -> None:
    parent = HIER["cpuset"].mount_point / name
    os.mkdir(parent)
    with pytest.raises(CgroupError) as err:
        V1Backend(HIER, name).ensure_root()
    assert str(err.value) == (f"the cpuset {parent} has an empty cpuset.cpus, so no job could "
                              f"run in it; write what geco may use into it "
                              f"(path={parent}/cpuset.cpus)")


# -- keys ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "1/2", ".", "..", "", "042.1", "1.1\n", "1", "a.b",
                                 "1.1/../../x"])
def test_given_a_bad_key_when_used_then_it_is_refused_and_nothing_is_created(
        backend: V1Backend, bad: str) -> None:
    before = {c: sorted(os.listdir(p)) for c, p in backend.parent_paths().items()}
    expected = ("a job cgroup key must be <job>.<task> in decimal digits without leading "
                f"zeros (e.g. 42.1), got {bad!r}")
    for call in (lambda: backend.create(bad, Limits()), lambda: backend.add_pid(bad, 1),
                 lambda: backend.destroy(bad), lambda: backend.paths(bad),
                 lambda: backend.kill(bad), lambda: backend.pids(bad)):
        with pytest.raises(CgroupError) as err:
            call()
        assert str(err.value) == expected
    assert {c: sorted(os.listdir(p)) for c, p in backend.parent_paths().items()} == before


def test_job_key_builds_the_canonical_key() -> None:
    assert JobKey(42, 1) == "42.1"
    with pytest.raises(JobKeyError) as err:
        JobKey(-1, 1)
    assert str(err.value) == ("a job cgroup key must be <job>.<task> in decimal digits without "
                              "leading zeros (e.g. 42.1), got '-1.1'")


# -- cpus ---------------------------------------------------------------------


@needs_two_cpus
def test_given_jobs_on_cpu_1_and_cpu_0_when_a_process_joins_then_its_affinity_is_that_cpu(
        backend: V1Backend, children: list[int]) -> None:
    cpus = sorted(parse_list(backend.available_cpus()))[:2]
    for task, cpu in enumerate(reversed(cpus), start=1):
        key = f"5.{task}"
        backend.create(key, Limits(cpus=str(cpu)))
        child = start_in(backend, key, report_affinity, children)
        assert child.output() == str(cpu).encode()
        assert child.wait() == 0
        assert read(backend.paths(key)["cpuset"] / "cpuset.cpu_exclusive") == "1"
    assert backend.job_keys() == ["5.1", "5.2"]


@needs_two_cpus
def test_given_an_exclusive_job_cpuset_when_a_sibling_overlaps_then_the_kernel_refuses(
        backend: V1Backend) -> None:
    available = parse_list(backend.available_cpus())
    cpu = min(available)
    backend.create("6.1", Limits(cpus=str(cpu)))
    with pytest.raises(CgroupError) as err:
        backend.create("6.2", Limits(cpus=str(cpu)))
    path = backend.paths("6.2")["cpuset"] / "cpuset.cpus"
    assert str(err.value) == (f"cannot write {cpu} to cpuset.cpus: Invalid argument; the cpus "
                              "must lie within the GECO cpuset's and must not overlap another "
                              f"job's exclusive cpuset (errno=EINVAL path={path} key=6.2)")
    assert err.value.__cause__ is not None
    assert not any(p.exists() for p in backend.paths("6.2").values())  # rolled back
    other = cpu_list(available - {cpu})
    backend.create("6.2", Limits(cpus=other))
    assert backend.read_limits("6.2").cpus == read(backend.paths("6.2")["cpuset"] / "cpuset.cpus")


# -- memory -------------------------------------------------------------------


@pytest.mark.parametrize("limits", [Limits(memory=64 * MiB), Limits(memory_swap=64 * MiB)],
                         ids=["memory", "memory_swap-only"])
def test_given_a_64mib_limit_when_a_child_touches_200mib_then_the_kernel_kills_only_it(
        backend: V1Backend, children: list[int], limits: Limits) -> None:
    backend.create("7.1", limits)
    small_lives_big_dies(backend, "7.1", children, 16 * MiB, 200 * MiB)
    usage = backend.usage("7.1")
    assert usage["oom_kill"] >= 1
    assert 16 * MiB < usage["memory_peak"] <= 64 * MiB
    if limits.memory:
        # (Linux 6.18 was seen to leave memsw.failcnt at 0 when the memsw limit
        # is what was hit, so only the RAM case can promise a count here)
        assert usage["memory_max_events"] > 0
    # RAM can never exceed RAM+swap: a RAM+swap-only request caps RAM as well
    assert backend.read_limits("7.1") == Limits(
        cpus=backend.available_cpus(), mems=backend.available_mems(), memory=64 * MiB,
        memory_swap=limits.memory_swap if _has_memsw(backend) else 0)


def test_given_a_reserve_when_a_job_without_a_limit_touches_more_than_the_rest_then_it_is_killed(
        backend: V1Backend, children: list[int]) -> None:
    """Given the parent held to 64 MiB (the node's RAM less the reserve, made small), when
    a job with no limit of its own touches 200 MiB, then the kernel kills it at the parent's
    limit, while one that touches 16 MiB lives: the reserve covers every job below."""
    backend.set_parent_memory(64 * MiB)
    assert read(backend.parent_paths()["memory"] / "memory.limit_in_bytes") == str(64 * MiB)
    backend.create("9.1", Limits())
    small_lives_big_dies(backend, "9.1", children, 16 * MiB, 200 * MiB)
    assert backend.read_limits("9.1").memory == 0


def _has_memsw(backend: V1Backend) -> bool:
    return (backend.parent_paths()["memory"] / "memory.memsw.limit_in_bytes").exists()


def test_given_limits_when_raised_and_lowered_then_the_writes_are_ordered_for_the_kernel(
        backend: V1Backend) -> None:
    """v1 refuses limit_in_bytes > memsw at every step; each change must still go through."""
    if not _has_memsw(backend):
        pytest.skip("swap accounting is off on this kernel (no memory.memsw.*)")
    steps = [(256 * MiB, 512 * MiB), (64 * MiB, 96 * MiB), (1024 * MiB, 2048 * MiB),
             (512 * MiB, 0), (0, 128 * MiB), (0, 0)]
    for memory, memory_swap in steps:
        backend.create("8.1", Limits(memory=memory, memory_swap=memory_swap))
        got = backend.read_limits("8.1")
        ram = min(v for v in (memory, memory_swap) if v) if memory or memory_swap else 0
        assert (got.memory, got.memory_swap) == (ram, memory_swap)


def test_given_memory_above_memory_swap_when_created_then_ram_is_capped_at_memory_swap(
        backend: V1Backend) -> None:
    backend.create("8.2", Limits(memory=128 * MiB, memory_swap=64 * MiB))
    got = backend.read_limits("8.2")
    assert (got.memory, got.memory_swap) == (64 * MiB, 64 * MiB if _has_memsw(backend) else 0)


# -- pids, freeze, kill, destroy ----------------------------------------------


def proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def test_given_a_running_job_when_frozen_then_it_stops_and_when_thawed_it_runs_again(
        backend: V1Backend, children: list[int]) -> None:
    counter = mmap.mmap(-1, 8)
    backend.create("9.1", Limits())
    child = start_in(backend, "9.1", counter_body(counter), children)
    assert eventually(lambda: count(counter) > 0)
    backend.freeze("9.1")
    assert read(backend.paths("9.1")["freezer"] / "freezer.state") == "FROZEN"
    assert proc_state(child.pid) == "D"
    frozen_at = count(counter)
    time.sleep(0.3)
    assert count(counter) == frozen_at
    backend.thaw("9.1")
    assert eventually(lambda: count(counter) > frozen_at)
    assert backend.kill("9.1") == 1
    assert child.wait() == -signal.SIGKILL


def test_given_a_frozen_job_when_killed_then_it_is_left_thawed_so_the_processes_exit(
        backend: V1Backend, children: list[int]) -> None:
    backend.create("9.2", Limits())
    child = start_in(backend, "9.2", exec_shell("exec sleep 300"), children)
    assert eventually(lambda: backend.pids("9.2") == [child.pid])
    backend.freeze("9.2")
    assert backend.kill("9.2") == 1
    assert child.wait() == -signal.SIGKILL
    assert backend.wait_empty("9.2", 10)
    assert read(backend.paths("9.2")["freezer"] / "freezer.state") == "THAWED"


class EndedWhileThawing(V1Backend):
    """The job's end (its epilog, or gecod on its shepherd's exit) removing its cgroups
    between the thaw's write and its read of the state, the last step of a kill: here at
    once after the write, once the killed member has been reaped."""

    ended: Any = None  # the member whose death lets the job end

    def _set_frozen(self, key: JobKey, frozen: bool, timeout: float) -> None:
        if not frozen and self.ended is not None:
            (self.paths(key)["freezer"] / "freezer.state").write_text("THAWED")
            self.ended.wait()
            assert self.wait_empty(key, 10)
            self.destroy(key)
        super()._set_frozen(key, frozen, timeout)


def test_given_a_killed_job_whose_cgroups_go_while_it_thaws_then_the_kill_is_counted(
        name: str, children: list[int]) -> None:
    """Given a job whose end removes its cgroups while the kill thaws it (the race the
    reaper's walltime kill met under load), when its processes are killed, then the kill is
    counted, not an error: a freezer cgroup gone is thawed, and the caller journals it."""
    backend = EndedWhileThawing(HIER, name)
    backend.ensure_root()
    backend.create("9.3", Limits())
    child = start_in(backend, "9.3", exec_shell("exec sleep 300"), children)
    assert eventually(lambda: backend.pids("9.3") == [child.pid])
    backend.ended = child
    assert backend.kill_except("9.3", spare=lambda pid: False) == 1
    assert child.wait() == -signal.SIGKILL
    assert not backend.exists("9.3")


def test_given_a_forking_job_with_a_pids_limit_when_killed_then_nothing_is_left(
        backend: V1Backend, children: list[int]) -> None:
    if "pids" not in backend.controllers:
        pytest.skip("the pids controller is not mounted on this machine")
    backend.create("10.1", Limits(pids=32))
    child = start_in(backend, "10.1", fork_forever, children)
    # the fork loop runs into pids.max and keeps trying; the kernel holds it at the limit
    assert eventually(lambda: len(backend.pids("10.1")) == 32)
    time.sleep(0.2)
    assert len(backend.pids("10.1")) == 32
    killed = backend.kill("10.1")
    assert killed >= 32
    assert backend.wait_empty("10.1", 10)
    assert child.wait() == -signal.SIGKILL
    backend.destroy("10.1")
    assert not any(p.exists() for p in backend.paths("10.1").values())
    assert backend.job_keys() == []


def test_given_processes_left_when_destroyed_then_the_error_lists_them(
        backend: V1Backend, children: list[int]) -> None:
    backend.create("11.1", Limits())
    child = start_in(backend, "11.1", exec_shell("sleep 300 & sleep 300 & exec sleep 300"),
                     children)
    assert eventually(lambda: len(backend.pids("11.1")) == 3)
    pids = backend.pids("11.1")
    assert child.pid in pids
    assert not backend.wait_empty("11.1", 0.1)
    with pytest.raises(CgroupError) as err:
        backend.destroy("11.1")
    shown = " ".join(map(str, pids))
    assert str(err.value) == (f"cannot remove the cgroup of job 11.1: processes {shown} are "
                              f"still in it (key=11.1 pids={','.join(map(str, pids))} "
                              f"path={backend.paths('11.1')['cpuset']})")
    assert backend.kill("11.1") == 3
    assert backend.wait_empty("11.1", 10)
    backend.destroy("11.1")
    backend.destroy("11.1")  # already gone is fine
    assert not any(p.exists() for p in backend.paths("11.1").values())


def test_given_a_process_in_a_job_when_moved_to_another_process_cgroups_then_it_leaves(
        backend: V1Backend, children: list[int]) -> None:
    """The epilog steps out to sge_execd's cgroups."""
    move_story(backend, children, exec_shell("exec sleep 300"))


def test_given_the_caller_inside_the_job_when_it_kills_the_job_then_it_is_refused(
        backend: V1Backend, children: list[int]) -> None:
    """The epilog runs inside the job; killing from there would kill the epilog itself."""
    kill_from_inside_story(backend, children)


def test_given_a_process_that_exited_when_added_then_the_error_says_it_is_gone(
        backend: V1Backend) -> None:
    backend.create("13.1", Limits())
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    with pytest.raises(CgroupError) as err:
        backend.add_pid("13.1", pid)
    path = backend.paths("13.1")["cpuset"] / "cgroup.procs"
    assert str(err.value) == (f"cannot write {pid} to cgroup.procs: No such process; process "
                              f"{pid} is gone (it exited before it could be moved) "
                              f"(errno=ESRCH path={path} key=13.1 pid={pid})")
    assert isinstance(err.value.__cause__, OSError)
    assert err.value.__cause__.errno == errno.ESRCH
    assert not backend.contains("13.1", pid)


def test_given_no_cgroup_when_read_then_the_error_names_the_job(backend: V1Backend) -> None:
    with pytest.raises(CgroupError) as err:
        backend.read_limits("14.1")
    path = backend.paths("14.1")["cpuset"]
    assert str(err.value) == f"job 14.1 has no cgroup (key=14.1 path={path})"
    assert backend.kill("14.1") == 0
    assert backend.wait_empty("14.1", 0)
    assert not backend.exists("14.1")


# -- nested cgroups -----------------------------------------------------------


def make_sub(backend: V1Backend, key: str, sub: str) -> list[Path]:
    """A sub-cgroup ``sub`` inside the job in every hierarchy (what systemd-run or an admin
    tool makes); a cpuset gets its parent's cpus and mems, without which it takes no task."""
    made = []
    for ctrl, top in backend.paths(key).items():
        d = top / sub
        if d in made:
            continue
        d.mkdir()
        if ctrl == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text(read(top / f))
        made.append(d)
    return made


def test_given_a_process_in_a_sub_cgroup_when_the_job_is_killed_then_it_dies_and_all_goes(
        backend: V1Backend, children: list[int]) -> None:
    """pids, kill, wait_empty and destroy cover the job's whole subtree, deepest first."""
    backend.create("16.1", Limits())
    child = start_in(backend, "16.1", exec_shell("exec sleep 300"), children)
    subs = make_sub(backend, "16.1", "inner")
    for d in subs:
        (d / "cgroup.procs").write_text(str(child.pid))
    assert backend.pids("16.1") == [child.pid]
    assert backend.contains("16.1", child.pid)
    assert backend.relative_cgroup("16.1", child.pid) == "inner"
    with pytest.raises(CgroupError) as err:
        backend.destroy("16.1")
    assert str(err.value).startswith("cannot remove the cgroup of job 16.1: processes "
                                     f"{child.pid} are still in it")
    assert all(d.is_dir() for d in subs)
    assert backend.kill("16.1") == 1
    assert child.wait() == -signal.SIGKILL
    assert backend.wait_empty("16.1", 10)
    backend.destroy("16.1")
    assert not any(p.exists() for p in backend.paths("16.1").values())


def test_given_a_process_in_the_job_itself_then_its_relative_cgroup_is_empty(
        backend: V1Backend, children: list[int]) -> None:
    backend.create("16.2", Limits())
    child = start_in(backend, "16.2", exec_shell("exec sleep 300"), children)
    assert eventually(lambda: backend.pids("16.2") == [child.pid])
    assert backend.relative_cgroup("16.2", child.pid) == ""
    assert backend.relative_cgroup("16.2", os.getpid()) is None


# -- CPU time -----------------------------------------------------------------


def test_given_cpuacct_when_a_child_spins_then_the_job_is_charged_and_keeps_it_after_exit(
        backend: V1Backend, children: list[int]) -> None:
    if "cpuacct" not in backend.controllers:
        pytest.skip("the cpuacct controller is not mounted on this machine")
    backend.create("17.1", Limits())
    assert backend.paths("17.1")["cpuacct"].is_dir()
    idle = backend.usage("17.1")
    assert (idle["cpu_user_usec"], idle["cpu_system_usec"]) == (0, 0)
    started = time.monotonic()
    child = start_in(backend, "17.1", spin(0.3), children)
    assert child.output() == b"spun"
    lived = time.monotonic() - started
    running = backend.usage("17.1")
    # the kernel samples user/system per tick: allow one 10 ms tick either way
    assert 200_000 < running["cpu_user_usec"] <= (lived + 0.01) * 1_000_000
    assert running["cpu_system_usec"] >= 0
    gone = usage_after_kill(backend, "17.1", child, 10)
    assert gone["cpu_user_usec"] >= running["cpu_user_usec"]
    assert gone["cpu_system_usec"] >= running["cpu_system_usec"]


def _fake_v1(tmp_path: Path, cpuacct_files: dict[str, str]) -> V1Backend:
    """A V1Backend over plain directories holding a job's counter files (no kernel needed)."""
    hier = {c: Hierarchy(c, tmp_path / c, "/") for c in ("cpuset", "memory", "cpuacct")}
    (tmp_path / "memory" / "GECO" / "1.1").mkdir(parents=True)
    (tmp_path / "memory" / "GECO" / "1.1" / "memory.max_usage_in_bytes").write_text("4096\n")
    acct = tmp_path / "cpuacct" / "GECO" / "1.1"
    acct.mkdir(parents=True)
    for name, text in cpuacct_files.items():
        (acct / name).write_text(text)
    return V1Backend(hier, "GECO", proc=tmp_path)


def test_given_cpuacct_usage_files_then_nanoseconds_become_microseconds(tmp_path: Path) -> None:
    backend = _fake_v1(tmp_path, {"cpuacct.usage_user": "1234567890\n",
                                  "cpuacct.usage_sys": "999\n",
                                  "cpuacct.stat": "user 1\nsystem 1\n"})
    assert backend.usage("1.1") == {"memory_peak": 4096, "cpu_user_usec": 1_234_567,
                                    "cpu_system_usec": 0}


def test_given_only_cpuacct_stat_then_ticks_become_microseconds(tmp_path: Path) -> None:
    """Kernels before 4.7 have no usage_user/usage_sys: cpuacct.stat counts USER_HZ ticks."""
    backend = _fake_v1(tmp_path, {"cpuacct.stat": "user 150\nsystem 25\n"})
    hz = os.sysconf("SC_CLK_TCK")
    assert backend.usage("1.1") == {"memory_peak": 4096,
                                    "cpu_user_usec": 150 * 1_000_000 // hz,
                                    "cpu_system_usec": 25 * 1_000_000 // hz}


def test_given_a_job_made_before_cpuacct_then_usage_has_no_cpu_figures(tmp_path: Path) -> None:
    backend = _fake_v1(tmp_path, {})
    (tmp_path / "cpuacct" / "GECO" / "1.1").rmdir()
    assert backend.usage("1.1") == {"memory_peak": 4096}


def test_given_a_job_made_without_cpuacct_when_a_process_joins_then_its_cpuacct_is_made(
        backend: V1Backend, children: list[int]) -> None:
    """A job that runs across the geco upgrade that added cpuacct still takes new processes;
    a job that does not exist gets no directory anywhere."""
    if "cpuacct" not in backend.controllers:
        pytest.skip("the cpuacct controller is not mounted on this machine")
    backend.create("18.1", Limits())
    acct = backend.paths("18.1")["cpuacct"]
    acct.rmdir()
    assert "cpu_user_usec" not in backend.usage("18.1")
    child = start_in(backend, "18.1", exec_shell("exec sleep 300"), children)
    assert backend.contains("18.1", child.pid)
    assert read(acct / "cgroup.procs") == str(child.pid)
    with pytest.raises(CgroupError) as err:
        backend.add_pid("18.2", child.pid)
    assert "job 18.2 has no cgroup here (create it first)" in str(err.value)
    assert not any(p.exists() for p in backend.paths("18.2").values())


def _placed(pid: int) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` by hierarchy as geco keys it (``name=systemd``, ``""``)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {controllers: path for _, controllers, path in (ln.split(":", 2) for ln in lines)}


def test_under_systemd_job_processes_also_go_into_systemds_hierarchies_below_the_base(
        name: str, children: list[int]) -> None:
    """Given a backend with systemd's hierarchies (this host's name=systemd and hybrid
    cgroup2) and a base in a unit's cgroup (standing for geco-jobs.service), when the unit
    has no cgroup, then ensure_root names the fix; once it has, a process that joins a job
    is at <base>/<job> in each of them too (so systemd, which never rearranges a delegated
    unit, cannot move it out of its job's memory cgroup), contains() needs that, the
    epilog's step out takes it back there too, and destroy removes the job there."""
    assert set(SYSTEMD) == {"name=systemd", ""}, SYSTEMD
    with parent_name(h.mount_point for h in SYSTEMD.values()) as unit:
        base = f"/{unit}/jobs"
        b = V1Backend(HIER, name, systemd=SYSTEMD, systemd_base=base)
        with pytest.raises(CgroupError, match=r"systemctl start geco-jobs\.service"):
            b.ensure_root()
        for h in SYSTEMD.values():
            (h.mount_point / unit).mkdir()
        b.ensure_root()
        key = JobKey(8, 1)
        b.create(key, Limits())
        child = start_in(b, key, exec_shell("exec sleep 600"), children)

        placed = _placed(child.pid)
        assert placed["name=systemd"] == placed[""] == f"{base}/{key}"
        assert placed["memory"] == placed["cpuset"] == f"/{name}/{key}"
        assert b.contains(key, child.pid)
        assert b.job_keys() == [key]
        mine = _placed(os.getpid())
        systemd = SYSTEMD["name=systemd"]
        (systemd.mount_point / mine["name=systemd"].lstrip("/") / "cgroup.procs").write_text(
            str(child.pid))  # as systemd would have it: out of the job there
        assert not b.contains(key, child.pid)

        b.move_to_cgroups_of(child.pid, os.getpid())
        assert {k: _placed(child.pid)[k] for k in SYSTEMD} == {k: mine[k] for k in SYSTEMD}
        b.destroy(key)
        assert [d for d in b.paths(key).values() if d.exists()] == []


# -- devices: the GPUs a job was not granted ---------------------------------------


@pytest.mark.skipif("devices" not in HIER, reason="no v1 devices hierarchy here")
def test_given_two_gpus_when_jobs_are_granted_one_each_then_each_opens_only_its_own(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Through contain_job on the v1 devices controller (cgroup_testkit.gpu_story)."""
    gpu_story(backend, children, tmp_path)


@pytest.mark.skipif("devices" not in HIER, reason="no v1 devices hierarchy here")
def test_given_mig_caps_then_a_job_opens_only_its_own_gpus_caps_and_never_config_or_monitor(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """devices.deny from geco.node.gpus.denied with a MIG caps table (cgroup_testkit.mig_story)."""
    mig_story(backend, children, tmp_path)
