"""OOM detection (geco.oom) on this machine's kernel: real cgroup v1 kills, /dev/kmsg, journald.

The first part needs nothing special: the kernel log line and cgroup file
parsers, the wording, the spool reading, and the cgroup v2 watch on plain
files -- inotify works on any file, and this host has no cgroup2 with the
memory controller (its ``/sys/fs/cgroup/unified`` has none), so the v2 path
is driven through a fake cgroup2 tree of plain files. The second part kills
real processes in real v1 memory cgroups named ``geco-test-<pid>-<n>``
(removed with plain syscalls afterwards, see tests/cgroup_testkit.py), and
writes as the unprivileged ``gecotest`` user.

The kernel prints its ``oom-kill:`` line at most 10 times per 5 s (a global
rate limit); tests that expect every victim named wait for a fresh window
first (:func:`quiet_oom_log`).
"""

from __future__ import annotations

import itertools
import os
import select
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geco import oom
from geco.cgroup import Limits, V1Backend, V2Backend, find_hierarchies, parse_mountinfo
from geco.daemon.runloop import RunLoop
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.units import format_memory, parse_memory
from tests.cgroup_testkit import (
    allocate,
    eventually,
    start_in,
    usable_v1_hierarchies,
    v1_backend,
)

MiB = 1 << 20
HOOK_DUMPS = Path(__file__).resolve().parents[1] / "fixtures" / "hooks"
# Real oom-kill lines, as this machine's kernel (6.18) printed them.
MEMCG_LINE = (b"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
              b"oom_memcg=/geco-test-exp,task_memcg=/geco-test-exp,task=python,pid=10498,uid=0")
GLOBAL_LINE = (b"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,2,"
               b"global_oom,task_memcg=/GECO/42.1,task=stress,pid=777,uid=1001")

_ids = itertools.count(1)


def unique_job() -> int:
    """A job number no other test (or session) uses at the same time: journal entries are ours."""
    return os.getpid() * 100 + next(_ids)


# ===========================================================================
# part 1: parsing and wording (no privileges needed)
# ===========================================================================


def test_given_a_memcg_oom_kill_line_when_parsed_then_every_field_is_taken() -> None:
    record = oom.parse_oom_kill(MEMCG_LINE, 5462)
    assert record == oom.KillRecord(seq=5462, constraint="CONSTRAINT_MEMCG",
                                    oom_memcg="/geco-test-exp", task_memcg="/geco-test-exp",
                                    command="python", pid=10498, uid=0)
    assert record.belongs_to("/geco-test-exp")
    assert not record.belongs_to("/geco-test")  # a prefix of the name is not a parent


def test_given_a_node_wide_line_with_commas_in_mems_when_parsed_then_oom_memcg_is_none() -> None:
    record = oom.parse_oom_kill(GLOBAL_LINE)
    assert record is not None
    assert (record.constraint, record.oom_memcg, record.task_memcg) == \
        ("CONSTRAINT_NONE", None, "/GECO/42.1")
    assert (record.command, record.pid, record.uid) == ("stress", 777, 1001)
    assert record.belongs_to("/GECO") and record.belongs_to("/GECO/42.1")


def test_given_a_command_name_holding_separators_when_parsed_then_pid_and_uid_are_the_real_ones(
        ) -> None:
    """The command is the user's choice (prctl PR_SET_NAME); the pid and uid come last."""
    line = MEMCG_LINE.replace(b"task=python", b"task=a,pid=1,uid=2")
    record = oom.parse_oom_kill(line)
    assert record is not None
    assert (record.command, record.pid, record.uid) == ("a,pid=1,uid=2", 10498, 0)


@pytest.mark.parametrize("line", [
    b"Memory cgroup out of memory: Killed process 10498 (python) total-vm:218792kB",
    b"oom-kill:constraint=CONSTRAINT_MEMCG,task=x",
    b"python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
])
def test_given_other_kernel_lines_when_parsed_then_they_are_not_kill_records(line: bytes) -> None:
    assert oom.parse_oom_kill(line) is None


def test_given_v2_memory_events_when_parsed_then_each_counter_is_read_and_odd_lines_skipped(
        ) -> None:
    data = b"low 0\nhigh 17\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\nbroken\nsock x\n"
    assert oom.parse_keyed(data) == {"low": 0, "high": 17, "max": 12, "oom": 3, "oom_kill": 2,
                                     "oom_group_kill": 0}


def test_given_v1_oom_control_when_parsed_then_oom_kill_is_read() -> None:
    data = b"oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"
    assert oom.parse_keyed(data)["oom_kill"] == 4


@pytest.mark.parametrize(("peak", "current", "expected"), [
    (200 * MiB, 200 * MiB, "300M"),     # the issue's example
    (64 * MiB, 64 * MiB, "96M"),
    (1 << 30, 1 << 30, "1.5G"),
    (700 * MiB, 700 * MiB, "1.1G"),     # 1050M is more than three digits: G, rounded up
    (10 << 30, 10 << 30, "15G"),
    (100, 0, "1M"),                     # never below 1M
])
def test_given_a_peak_when_suggesting_then_it_is_1_5x_rounded_up_to_a_friendly_unit(
        peak: int, current: int, expected: str) -> None:
    assert oom.suggest_request(peak, current) == expected


@given(st.integers(min_value=1, max_value=1 << 44), st.integers(min_value=0, max_value=1 << 44))
def test_any_suggestion_reads_back_above_the_peak_and_the_request_and_close_to_1_5x(
        peak: int, current: int) -> None:
    text = oom.suggest_request(peak, current)
    value = parse_memory(text)
    assert value is not None
    want = max(Decimal(peak) * Decimal("1.5"), Decimal(current + 1), Decimal(MiB))
    assert value >= want
    # two significant digits round up by at most 10 %, plus the 1M floor of the M unit
    assert value <= want * Decimal("1.1") + MiB


def event(**changes: Any) -> oom.OomEvent:
    base = oom.OomEvent(key=JobKey(42, 1), node="vm", limit=200 * MiB, peak=200 * MiB, pid=1234,
                        command="python3", kill_count=1, scope="job")
    return oom.OomEvent(**{**{f: getattr(base, f) for f in base.__slots__}, **changes})


def test_given_a_job_over_its_m_mem_free_when_worded_then_it_reads_like_the_issue_says() -> None:
    text = oom.owner_message(event(), oom.RequestHint(slots=1, m_mem_free=200 * MiB,
                                                      h_vmem=2 << 30))
    assert text == ("geco: job 42.1 on node vm used more memory than it requested and the "
                    "kernel stopped process 1234 (python3). Memory limit: 200M (-l "
                    "m_mem_free=200M per slot x 1 slot); peak use: 200M. Resubmit with a "
                    "larger request, for example -l m_mem_free=300M.")


def test_given_a_node_wide_oom_far_below_the_limit_then_the_job_is_not_blamed() -> None:
    text = oom.owner_message(event(limit=4 << 30, peak=100 * MiB, scope=""),
                             oom.RequestHint(slots=1, m_mem_free=4 << 30))
    assert text == ("geco: job 42.1 on node vm lost process 1234 (python3) to the kernel's "
                    "out-of-memory killer, but the job was not over its memory limit (peak use "
                    "100M of 4G): the node as a whole ran out of memory. This is not the job's "
                    "fault and a larger request would not help; if the job failed, resubmit it "
                    "unchanged.")


def test_given_the_kernel_log_says_node_wide_when_worded_then_even_a_full_job_is_not_blamed(
        ) -> None:
    e = event(scope="node")
    assert e.node_wide
    assert "the node as a whole ran out of memory" in oom.owner_message(e, None)


def test_given_no_limit_when_worded_then_it_says_the_job_has_none() -> None:
    text = oom.owner_message(event(limit=0, peak=3 << 30, pid=0, command=""), None)
    assert text.startswith("geco: job 42.1 on node vm lost a process to the kernel's "
                           "out-of-memory killer, but the job was not over its memory limit "
                           "(it has none on this node): ")


def test_given_h_vmem_set_the_ram_swap_limit_when_worded_then_h_vmem_is_named_per_slot(
        ) -> None:
    """2 slots x h_vmem=1G = 2G RAM+swap; RAM was 1G (m_mem_free=512M x 2)."""
    e = event(key=JobKey(43, 1), limit=2 << 30, peak=2 << 30, limit_kind="ram+swap", pid=0,
              command="")
    text = oom.owner_message(e, oom.RequestHint(slots=2, m_mem_free=512 * MiB, h_vmem=1 << 30,
                                                is_array=False))
    assert text == ("geco: job 43 on node vm used more memory than it requested and the kernel "
                    "stopped a process. Memory+swap limit: 2G (-l h_vmem=1G per slot x 2 "
                    "slots); peak use: 2G. Resubmit with a larger request, for example -l "
                    "h_vmem=1.5G.")


def test_given_h_vmem_below_the_suggestion_when_m_mem_free_binds_then_both_are_raised() -> None:
    """h_vmem caps RAM too: raising m_mem_free alone past it would change nothing."""
    text = oom.owner_message(event(), oom.RequestHint(slots=1, m_mem_free=200 * MiB,
                                                      h_vmem=250 * MiB))
    assert text.endswith("Resubmit with a larger request, for example "
                         "-l m_mem_free=300M,h_vmem=300M.")


def test_given_no_request_information_when_worded_then_the_remedy_names_a_total() -> None:
    text = oom.owner_message(event(), None)
    assert text.endswith("Memory limit: 200M; peak use: 200M. Resubmit with a larger memory "
                         "request (about 300M for this node in total).")


def test_given_a_bad_policy_then_the_error_names_the_choices() -> None:
    with pytest.raises(GecoError) as err:
        oom.check_policy("kill")
    assert str(err.value) == "the OOM policy ([gecod] oom) must be kernel or kill-job, got 'kill'"
    assert oom.check_policy("kill-job") == "kill-job"


def test_given_a_resource_set_when_hinting_then_requests_are_per_slot_on_this_node() -> None:
    rs = ResourceSet(job_id=9, task_id=1, is_array=True, per_slot_vmem=500 * MiB, nodes=(
        NodeResources("other", slots=4, memory_limit=4 << 30, vmem_limit=2000 * MiB),
        NodeResources("vm.example", is_slave=True, slots=2, memory_limit=2 << 30,
                      vmem_limit=1000 * MiB)))
    assert oom.request_hint(rs, "vm") == oom.RequestHint(slots=2, m_mem_free=1 << 30,
                                                         h_vmem=500 * MiB, is_array=True)
    assert oom.request_hint(rs, "nowhere") is None
    assert oom.request_hint(None) is None


# -- the spool ------------------------------------------------------------------


def dump_section(dump: Path, title: str) -> bytes:
    """One ``### <title>`` section of a recorded hook dump, as the file's bytes."""
    lines = dump.read_bytes().split(b"\n")
    start = lines.index(b"### " + title.encode()) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(b"###"))
    return b"\n".join(lines[start:end]) + b"\n"


def spool_from_dump(dump: Path, spool: Path) -> dict[str, str]:
    """Rebuild a job's spool dir from a real SoGE 8.1.9 dump; return the job's environment."""
    spool.mkdir(parents=True)
    for name in ("config", "environment"):
        (spool / name).write_bytes(dump_section(dump, f"SGE_JOB_SPOOL_DIR file: {name}"))
    env = dump_section(dump, "environment (sorted):").decode()
    return dict(line.split("=", 1) for line in env.splitlines() if "=" in line)


@pytest.mark.parametrize("dump", ["epilog.6.2.txt", "epilog.1.undefined.txt",
                                  "epilog.9.1.txt"])
def test_given_a_real_soge_spool_when_reading_the_target_then_it_is_the_job_s_stderr_file(
        tmp_path: Path, dump: str) -> None:
    """SoGE does not spool SGE_STDERR_PATH; the config's dir + sge_shepherd's name must give
    exactly what the job saw in its environment."""
    env = spool_from_dump(HOOK_DUMPS / dump, tmp_path / "spool")
    assert b"SGE_STDERR_PATH" not in (tmp_path / "spool" / "environment").read_bytes()
    target = oom.stderr_target(tmp_path / "spool")
    assert target is not None
    assert target.path / target.name_in_dir == Path(env["SGE_STDERR_PATH"])
    assert target.owner == env["USER"]


def write_spool(spool: Path, config: dict[str, str], environment: dict[str, str]) -> Path:
    spool.mkdir(parents=True, exist_ok=True)
    (spool / "config").write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    (spool / "environment").write_text("".join(f"{k}={v}\n" for k, v in environment.items()))
    return spool


CONFIG = {"job_owner": "alice", "job_id": "42", "ja_task_id": "0", "job_name": "sim",
          "stdout_path": "/home/alice/out", "stderr_path": "/home/alice/err",
          "merge_stderr": "0", "cwd": "/home/alice"}


def test_given_the_environment_names_the_file_then_it_is_used_as_is(tmp_path: Path) -> None:
    spool = write_spool(tmp_path, CONFIG, {"SGE_STDERR_PATH": "/scratch/sim.err"})
    assert oom.stderr_target(spool) == oom.StderrTarget(Path("/scratch/sim.err"), "", "alice")


def test_given_merged_output_then_stdout_is_the_target(tmp_path: Path) -> None:
    spool = write_spool(tmp_path, {**CONFIG, "merge_stderr": "1"}, {})
    assert oom.stderr_target(spool) == oom.StderrTarget(Path("/home/alice/out"), "sim.o42",
                                                        "alice")


def test_given_stderr_to_dev_null_then_there_is_no_target(tmp_path: Path) -> None:
    spool = write_spool(tmp_path, {**CONFIG, "stderr_path": "/dev/null"}, {})
    assert oom.stderr_target(spool) is None


def test_given_no_spooled_config_then_the_error_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(GecoError) as err:
        oom.stderr_target(tmp_path)
    assert str(err.value) == (f"cannot read the job's spooled config: No such file or directory "
                              f"(errno=ENOENT path={tmp_path / 'config'})")


# -- cgroup v2 on plain files ------------------------------------------------------


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_given_an_inotify_watch_on_a_plain_file_when_it_is_written_then_the_fd_turns_readable(
        tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    path.write_bytes(b"oom_kill 0\n")
    fd = oom.open_inotify(path)
    try:
        assert not readable(fd)
        path.write_bytes(b"oom_kill 1\n")
        assert readable(fd, 5.0)
    finally:
        os.close(fd)


def test_given_a_missing_file_when_watching_then_the_os_error_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        oom.open_inotify(tmp_path / "nope")
    assert err.value.filename == str(tmp_path / "nope")


def fake_v2(tmp_path: Path, events: bytes) -> tuple[V2Backend, Path]:
    """A cgroup2 tree of plain files: what V2Backend reads for job 42.1."""
    mount = tmp_path / "cgroup"
    job = mount / "GECO" / "42.1"
    job.mkdir(parents=True)
    (mount / "cgroup.controllers").write_text("cpuset memory pids\n")
    for name, value in {"memory.events": events.decode(), "memory.max": f"{64 * MiB}\n",
                        "memory.peak": f"{64 * MiB - 4096}\n", "memory.current": "0\n",
                        "memory.swap.max": "max\n", "cpuset.cpus": "0\n", "cpuset.mems": "0\n",
                        "pids.max": "max\n"}.items():
        (job / name).write_text(value)
    return V2Backend(mount, "GECO"), job


def test_given_a_v2_job_when_memory_events_counts_a_kill_then_the_watch_reports_it_once(
        tmp_path: Path) -> None:
    backend, job = fake_v2(tmp_path, b"max 0\noom 0\noom_kill 0\n")
    state = tmp_path / "state"
    with oom.OomWatch(backend, "42.1", state_dir=state, node="vm") as watch:
        assert watch.check() == []
        (job / "memory.events").write_bytes(b"max 9\noom 1\noom_kill 1\n")
        assert readable(watch.fileno(), 5.0)
        assert watch.on_readable() == [oom.OomEvent(
            key="42.1", node="vm", limit=64 * MiB, peak=64 * MiB - 4096, kill_count=1)]
        assert not readable(watch.fileno())  # drained
        assert watch.check() == []
    # a restarted gecod: the count on disk says 1 was reported
    with oom.OomWatch(backend, "42.1", state_dir=state, node="vm") as again:
        assert again.check() == []
        (job / "memory.events").write_bytes(b"max 9\noom 3\noom_kill 3\n")
        assert [e.kill_count for e in again.on_readable()] == [2, 3]
    assert (state / "oom" / "42.1").read_bytes().endswith(b" reported=3\n")


def test_given_a_v2_job_recreated_under_the_same_name_then_its_count_starts_over(
        tmp_path: Path) -> None:
    backend, job = fake_v2(tmp_path, b"oom_kill 2\n")
    state = tmp_path / "state"
    with oom.OomWatch(backend, "42.1", state_dir=state) as watch:
        assert len(watch.check()) == 2
    # the job is re-queued: its cgroup is removed and made again (a new inode)
    for f in job.iterdir():
        f.unlink()
    job.rmdir()
    fake_v2(tmp_path, b"oom_kill 1\n")
    with oom.OomWatch(backend, "42.1", state_dir=state) as watch:
        assert [e.kill_count for e in watch.check()] == [1]


def test_given_a_count_file_above_the_kernel_s_counter_then_the_count_starts_over(
        tmp_path: Path) -> None:
    """Same boot and inode (kernfs may reuse one), but the kernel's counter is lower than what
    was reported: the file belongs to an older cgroup, and the kills now counted are new."""
    backend, job = fake_v2(tmp_path, b"oom_kill 5\n")
    state = tmp_path / "state"
    with oom.OomWatch(backend, "42.1", state_dir=state) as watch:
        assert len(watch.check()) == 5
    (job / "memory.events").write_bytes(b"oom_kill 2\n")
    with oom.OomWatch(backend, "42.1", state_dir=state) as watch:
        assert [e.kill_count for e in watch.check()] == [1, 2]


# ===========================================================================
# part 2: real cgroup v1 kills (root)
# ===========================================================================

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))


HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
needs_v1 = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

# The oom-kill line is rate-limited by the kernel: 10 per 5 s window.
_RATE_WINDOW = 5.5
_last_kill = [0.0]


@pytest.fixture
def quiet_oom_log() -> None:
    """Wait until the kernel's rate limit window of our last kill has passed."""
    wait = _last_kill[0] + _RATE_WINDOW - time.monotonic()
    if wait > 0:
        time.sleep(wait)


@pytest.fixture
def backend(children: list[int]) -> Iterator[V1Backend]:
    """A v1 backend on a fresh geco-test-* parent, removed with plain syscalls afterwards
    (``children``: tests/system/conftest.py)."""
    with v1_backend(HIER, exclusive_cpus=False) as b:
        yield b


@pytest.fixture
def job(backend: V1Backend) -> str:
    """A fresh job cgroup with a 64 MiB limit (RAM and RAM+swap)."""
    key = f"{unique_job()}.1"
    backend.create(key, Limits(memory=64 * MiB, memory_swap=64 * MiB))
    return key


@pytest.fixture
def kmsg() -> Iterator[oom.KernelLog]:
    with oom.KernelLog.open() as k:
        yield k


# journal_log (geco-test-oom): tests/conftest.py


def oom_kill(backend: V1Backend, key: str, children: list[int]) -> int:
    """Run a child that touches 200 MiB in the job; return its pid once the kernel killed it."""
    child = start_in(backend, key, allocate(200 * MiB), children)
    assert child.output() == b""
    assert child.wait() == -signal.SIGKILL
    _last_kill[0] = time.monotonic()
    return child.pid


def sleeper(out: int) -> None:
    os.close(out)
    time.sleep(300)


def memory_file(backend: V1Backend, key: str, name: str) -> int:
    return int((backend.paths(key)["memory"] / name).read_text())


def own_comm() -> str:
    """What a forked child of this test is called in the kernel log."""
    return Path("/proc/self/comm").read_text().strip()


@pytest.fixture
def owner(job_owner: Any) -> Iterator[_Owner]:
    """The test user, with one fresh directory of theirs (``owner.dir``), removed afterwards."""
    directory = job_owner.make_dir("oom")
    try:
        yield _Owner(job_owner.name, job_owner.uid, job_owner.gid, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class _Owner:
    name: str
    uid: int
    gid: int
    dir: Path


def owner_file(owner: _Owner, name: str = "job.e42") -> Path:
    """A file of the owner's in their directory, with one line in it."""
    path = owner.dir / name
    path.write_bytes(b"earlier output\n")
    os.chown(path, owner.uid, owner.gid)
    return path


def spool_for(tmp_path: Path, key: str, owner: _Owner, stderr: Path) -> Path:
    job_id = key.partition(".")[0]
    return write_spool(tmp_path / "spool" / "vm" / "active_jobs" / key,
                       {"job_owner": owner.name, "job_id": job_id, "ja_task_id": "0",
                        "job_name": "sim", "stderr_path": str(stderr.parent),
                        "stdout_path": str(stderr.parent), "merge_stderr": "0",
                        "cwd": str(stderr.parent)},
                       {"JOB_ID": job_id, "SGE_TASK_ID": "undefined"})


@needs_v1
def test_given_a_job_over_its_limit_when_the_kernel_kills_then_one_event_is_reported_everywhere(
        backend: V1Backend, job: str, children: list[int], kmsg: oom.KernelLog,
        journal_log: Any, owner: _Owner, tmp_path: Path, quiet_oom_log: None) -> None:
    """Given a 64 MiB job and its watch, when a child touches 200 MiB, then exactly one event
    names it (pid, command from /dev/kmsg), with the limit and the peak the kernel shows; the
    owner's stderr file gets the message appended as the owner, and the journal the record."""
    watch = oom.OomWatch(backend, job, state_dir=tmp_path / "state", kmsg=kmsg)
    try:
        assert watch.check() == []
        victim = oom_kill(backend, job, children)
        assert readable(watch.fileno(), 10.0)
        events = watch.on_readable()
        assert watch.check() == []
    finally:
        watch.close()
    assert events == [oom.OomEvent(
        key=job, node=short_hostname(), limit=memory_file(backend, job, "memory.limit_in_bytes"),
        peak=memory_file(backend, job, "memory.max_usage_in_bytes"), pid=victim,
        command=own_comm(), kill_count=1, limit_kind="ram", scope="job")]
    assert events[0].limit == 64 * MiB
    assert not events[0].node_wide
    # the owner's file and the journal
    path = owner_file(owner)
    target = oom.StderrTarget(path, "", owner.name)
    hint = oom.RequestHint(slots=1, m_mem_free=64 * MiB)
    assert oom.handle(events, "kernel", backend, target=target, hint=hint) is None
    text = oom.owner_message(events[0], hint)
    assert text == (f"geco: job {job} on node {short_hostname()} used more memory than it "
                    f"requested and the kernel stopped process {victim} ({own_comm()}). "
                    f"Memory limit: 64M (-l m_mem_free=64M per slot x 1 slot); peak use: "
                    f"{format_memory(events[0].peak)}. Resubmit with a larger request, for "
                    f"example -l m_mem_free=96M.")
    assert path.read_text() == "earlier output\n" + text + "\n"
    assert (path.stat().st_uid, path.stat().st_gid) == (owner.uid, owner.gid)
    job_id, _, task = job.partition(".")
    [entry] = journal_log.entries(GECO_EVENT="oom", JOB_ID=job_id)
    assert {k: entry.get(k) for k in ("SGE_TASK_ID", "LIMIT", "PEAK", "PID", "COMMAND",
                                      "OOM_KILLS", "PRIORITY", "MESSAGE")} == {
        "SGE_TASK_ID": task, "LIMIT": str(64 * MiB), "PEAK": str(events[0].peak),
        "PID": str(victim), "COMMAND": own_comm(), "OOM_KILLS": "1", "PRIORITY": "4",
        "MESSAGE": text.removeprefix("geco: ")}


@needs_v1
def test_given_five_kills_when_checked_then_five_events_name_the_five_victims_in_order(
        backend: V1Backend, job: str, children: list[int], kmsg: oom.KernelLog,
        tmp_path: Path, quiet_oom_log: None) -> None:
    with oom.OomWatch(backend, job, state_dir=tmp_path, kmsg=kmsg) as watch:
        victims = [oom_kill(backend, job, children) for _ in range(5)]
        events = watch.on_readable()
    assert [(e.pid, e.kill_count) for e in events] == list(zip(victims, range(1, 6),
                                                               strict=True))
    assert oom.parse_keyed((backend.paths(job)["memory"] / "memory.oom_control")
                           .read_bytes())["oom_kill"] == 5


@needs_v1
def test_given_a_persisted_count_when_a_new_watch_starts_then_it_repeats_nothing_and_misses_nothing(
        backend: V1Backend, job: str, children: list[int], tmp_path: Path) -> None:
    with oom.OomWatch(backend, job, state_dir=tmp_path) as first:
        oom_kill(backend, job, children)
        assert [e.kill_count for e in first.on_readable()] == [1]
    # gecod restarts: a new watch, the same state dir
    with oom.OomWatch(backend, job, state_dir=tmp_path) as second:
        assert second.check() == []
        oom_kill(backend, job, children)  # a kill while the new watch runs
        assert [e.kill_count for e in second.on_readable()] == [2]
    oom_kill(backend, job, children)  # a kill while nobody watches
    with oom.OomWatch(backend, job, state_dir=tmp_path) as third:
        assert [e.kill_count for e in third.check()] == [3]


@needs_v1
def test_given_two_kills_before_any_watch_when_one_starts_then_it_reports_both_unnamed(
        backend: V1Backend, job: str, children: list[int], tmp_path: Path) -> None:
    """Their kernel log lines came before the reader opened /dev/kmsg: 'a process'."""
    oom_kill(backend, job, children)
    oom_kill(backend, job, children)
    with oom.KernelLog.open() as kmsg, \
            oom.OomWatch(backend, job, state_dir=tmp_path, kmsg=kmsg) as watch:
        events = watch.check()
    assert [(e.kill_count, e.pid, e.command) for e in events] == [(1, 0, ""), (2, 0, "")]
    assert "and the kernel stopped a process. Memory limit: 64M; " in \
        oom.owner_message(events[0], None)


@needs_v1
def test_given_no_kernel_log_when_a_kill_happens_then_it_is_still_reported(
        backend: V1Backend, job: str, children: list[int], tmp_path: Path) -> None:
    with oom.OomWatch(backend, job, state_dir=tmp_path, kmsg=None) as watch:
        oom_kill(backend, job, children)
        [e] = watch.on_readable()
    assert (e.pid, e.command, e.scope, e.limit) == (0, "", "", 64 * MiB)


@needs_v1
@pytest.mark.parametrize("policy", ["kernel", "kill-job"])
def test_given_a_policy_when_a_kill_is_handled_then_only_kill_job_ends_the_rest_of_the_job(
        backend: V1Backend, job: str, children: list[int], tmp_path: Path, journal_log: Any,
        policy: str) -> None:
    bystander = start_in(backend, job, sleeper, children)
    with oom.OomWatch(backend, job, state_dir=tmp_path) as watch:
        oom_kill(backend, job, children)
        events = watch.on_readable()
    assert len(events) == 1
    killed = oom.handle(events, policy, backend)
    job_id = job.partition(".")[0]
    ended = journal_log.entries(GECO_EVENT="oom-job-ended", JOB_ID=job_id)
    if policy == "kernel":
        assert killed is None
        assert backend.pids(job) == [bystander.pid]
        assert ended == []
        return
    assert killed == 1
    assert bystander.wait() == -signal.SIGKILL
    assert eventually(lambda: backend.pids(job) == [], 10.0)
    [entry] = ended
    assert (entry["PROCESSES"], entry["OOM_POLICY"], entry["PRIORITY"]) == ("1", "kill-job", "4")


# -- the owner's file -------------------------------------------------------------


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing to the owner needs root")


@needs_root
def test_given_a_symlink_in_place_of_the_file_when_appending_then_it_is_not_followed(
        owner: _Owner, tmp_path: Path) -> None:
    """Given the user replaced their .e file by a link to another of their files, or to a file
    of root's, then neither changes and the error names the link."""
    path = owner_file(owner)
    mine = owner_file(owner, "other")
    roots = tmp_path / "root-file"
    roots.write_bytes(b"root\n")
    roots.chmod(0o666)  # even a file the user could write through the link stays untouched
    for target in (mine, roots):
        path.unlink()
        path.symlink_to(target)
        os.lchown(path, owner.uid, owner.gid)
        with pytest.raises(GecoError) as err:
            oom.append_to_owner_file(path, "geco: x\n", owner.uid, owner.gid)
        assert str(err.value) == (
            f"cannot append to {path} as uid {owner.uid} (open): Too many levels of "
            f"symbolic links; it is a symbolic link, which geco does not follow "
            f"(errno=ELOOP path={path} uid={owner.uid})")
        assert err.value.__cause__ is not None
    assert mine.read_bytes() == b"earlier output\n"
    assert roots.read_bytes() == b"root\n"


@needs_root
def test_given_a_file_only_root_may_write_when_appending_then_the_owner_s_rights_refuse(
        owner: _Owner) -> None:
    path = owner_file(owner)
    os.chown(path, 0, 0)
    path.chmod(0o644)
    with pytest.raises(GecoError) as err:
        oom.append_to_owner_file(path, "geco: x\n", owner.uid, owner.gid)
    assert str(err.value) == (f"cannot append to {path} as uid {owner.uid} (open): "
                              f"Permission denied; the job owner may not write it "
                              f"(errno=EACCES path={path} uid={owner.uid})")
    assert path.read_bytes() == b"earlier output\n"


@needs_root
def test_given_the_file_is_gone_when_appending_then_none_is_created(owner: _Owner) -> None:
    path = owner_file(owner)
    path.unlink()
    with pytest.raises(GecoError) as err:
        oom.append_to_owner_file(path, "geco: x\n", owner.uid, owner.gid)
    assert str(err.value) == (f"cannot append to {path} as uid {owner.uid} (open): No such "
                              f"file or directory; the file is gone, and geco never creates one "
                              f"(errno=ENOENT path={path} uid={owner.uid})")
    assert not path.exists()


@needs_root
def test_given_a_directory_when_appending_then_the_named_file_in_it_is_used_or_refused(
        owner: _Owner) -> None:
    path = owner_file(owner, "sim.e42")
    assert oom.append_to_owner_file(path.parent, "geco: x\n", owner.uid, owner.gid,
                                    name_in_dir="sim.e42") == path
    assert path.read_bytes() == b"earlier output\ngeco: x\n"
    with pytest.raises(GecoError) as err:
        oom.append_to_owner_file(path.parent, "geco: x\n", owner.uid, owner.gid)
    assert str(err.value) == (f"cannot append to {path.parent} as uid {owner.uid} (open): "
                              f"Is a directory; it is a directory (errno=EISDIR "
                              f"path={path.parent} uid={owner.uid})")
    missing = path.parent / "sim.e43"
    with pytest.raises(GecoError) as err:
        oom.append_to_owner_file(path.parent, "geco: x\n", owner.uid, owner.gid,
                                 name_in_dir="sim.e43")
    assert err.value.fields["path"] == missing
    assert not missing.exists()


@needs_root
@pytest.mark.parametrize("reader", [False, True], ids=["no-reader", "reader"])
def test_given_a_fifo_in_the_files_place_then_nothing_is_written_and_nothing_waits(
        owner: _Owner, reader: bool) -> None:
    """Given a FIFO the owner put where their stderr file was (with nobody reading it, or
    their own process holding it open to read), when geco appends an OOM report, then it
    refuses at once, saying it is a FIFO and not a file, instead of waiting for the
    writer's timeout: a job cannot make its OOM reports hold gecod's worker."""
    fifo = owner_file(owner).parent / "fifo"
    os.mkfifo(fifo)
    os.chown(fifo, owner.uid, owner.gid)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK) if reader else -1
    try:
        with pytest.raises(GecoError) as err:
            oom.append_to_owner_file(fifo, "geco: x\n", owner.uid, owner.gid, timeout=60)
        if reader:
            assert str(err.value) == (f"cannot append to {fifo} as uid {owner.uid}: it is not "
                                      f"a regular file (a FIFO, a device or a socket), which "
                                      f"geco does not write to (path={fifo} uid={owner.uid})")
            assert os.read(held, 64) == b""  # not a byte went in
        else:
            assert str(err.value) == (f"cannot append to {fifo} as uid {owner.uid} (open): No "
                                      f"such device or address; it is a FIFO or a device, "
                                      f"which geco does not write to (errno=ENXIO path={fifo} "
                                      f"uid={owner.uid})")
    finally:
        if held >= 0:
            os.close(held)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


@pytest.fixture
def frozen_file(owner: _Owner, tmp_path: Path) -> Iterator[Path]:
    """The owner's file on a file system that hangs every write: a loop-mounted ext4 frozen
    with fsfreeze (as a dead NFS server would), in the owner's directory; thawed and removed
    afterwards."""
    image, mount = tmp_path / "fs.img", owner.dir / "mnt"
    mount.mkdir()
    with image.open("wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        path = mount / "job.e42"
        path.write_bytes(b"")
        os.chown(path, owner.uid, owner.gid)
        subprocess.run(["fsfreeze", "-f", str(mount)], check=True)
        try:
            yield path
        finally:
            subprocess.run(["fsfreeze", "-u", str(mount)], check=True)
    finally:
        # the killed writer leaves the file system once it is thawed: wait for that
        deadline = time.monotonic() + 60
        while subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, f"{mount} stays busy"
            time.sleep(0.1)


@needs_root
def test_given_a_write_that_hangs_when_appending_then_it_gives_up_after_the_timeout(
        owner: _Owner, frozen_file: Path) -> None:
    """Given the owner's file on a file system whose writes hang, when geco appends, then it
    gives up after its timeout, naming the file, and kills the writer."""
    with pytest.raises(GecoError) as err:
        oom.append_to_owner_file(frozen_file, "geco: x\n", owner.uid, owner.gid, timeout=0.3)
    assert str(err.value) == (f"cannot append to {frozen_file} as uid {owner.uid}: no answer "
                              f"within 0.3 s (a hung file system?); the writer was killed "
                              f"(path={frozen_file} uid={owner.uid})")


# -- gecod's side: the monitor in a runloop -----------------------------------------


def run_until(loop: RunLoop, done: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        loop.run_once()
    return done()


@needs_v1
def test_given_the_monitor_in_a_runloop_when_a_job_is_killed_then_the_owner_reads_the_remedy(
        backend: V1Backend, job: str, children: list[int], owner: _Owner, tmp_path: Path,
        quiet_oom_log: None) -> None:
    """Given gecod's wiring (monitor, spool dir, resource file), when the kernel kills a job
    process, the owner's .e file gets the message with the request to raise; when the job's
    cgroup is removed, the monitor drops the watch and its count file."""
    stderr = owner_file(owner, f"sim.e{job.partition('.')[0]}")
    spool_root = tmp_path / "spool"
    spool_for(tmp_path, job, owner, stderr)
    job_id = int(job.partition(".")[0])
    resources = tmp_path / "resources"
    resourcefile.write(resources, ResourceSet(job_id=job_id, task_id=1, is_array=False, nodes=(
        NodeResources(short_hostname(), slots=1, memory_limit=64 * MiB),)))
    state = tmp_path / "state"
    batches: list[list[oom.OomEvent]] = []
    with RunLoop(granularity=0.5) as loop:
        monitor = oom.OomMonitor(loop, backend, state_dir=state, policy="kernel",
                                 execd_spool_dir=spool_root, resources_dir=resources,
                                 node="vm", on_events=batches.append)
        monitor.start()
        try:
            assert monitor.keys == [job]
            victim = oom_kill(backend, job, children)
            assert run_until(loop, lambda: bool(batches))
            [[e]] = batches
            assert (e.pid, e.kill_count) == (victim, 1)
            assert stderr.read_text() == "earlier output\n" + oom.owner_message(
                e, oom.RequestHint(slots=1, m_mem_free=64 * MiB, is_array=False)) + "\n"
            assert f"geco: job {job_id} on node vm used more memory" in stderr.read_text()
            assert stderr.read_text().endswith("for example -l m_mem_free=96M.\n")
            assert (state / "oom" / job).exists()
            # the epilog removes the cgroup while the watch is open: v1 signals the eventfd
            backend.destroy(job)
            assert run_until(loop, lambda: monitor.keys == [], 5.0)
            assert not (state / "oom" / job).exists()
        finally:
            monitor.close()


@needs_v1
def test_given_a_cgroup_made_without_gecod_when_the_sweep_runs_then_its_earlier_kill_is_reported(
        backend: V1Backend, children: list[int], tmp_path: Path) -> None:
    """Given a monitor without a kernel log and a stale count file of a job that ended while
    gecod was down, when the prolog makes a job cgroup that has a kill before the sweep, then
    the sweep reports it, the stale file goes, and the next kill comes through the eventfd."""
    stale = tmp_path / "oom" / "999.1"
    stale.parent.mkdir()
    stale.write_bytes(b"geco-oom-v1 incarnation=x/1 reported=4\n")
    batches: list[list[oom.OomEvent]] = []
    with RunLoop(granularity=0.5) as loop:
        monitor = oom.OomMonitor(loop, backend, state_dir=tmp_path, kmsg=None,
                                 on_events=batches.append)
        monitor.start()
        try:
            assert monitor.keys == []
            assert not stale.exists()
            key = f"{unique_job()}.1"
            backend.create(key, Limits(memory=64 * MiB, memory_swap=64 * MiB))  # the prolog
            oom_kill(backend, key, children)
            assert batches == []
            monitor.sync()  # what the sweep timer runs
            assert monitor.keys == [key]
            assert [[(e.kill_count, e.pid) for e in b] for b in batches] == [[(1, 0)]]
            oom_kill(backend, key, children)
            assert run_until(loop, lambda: len(batches) == 2)
            assert [(e.kill_count, e.pid) for e in batches[1]] == [(2, 0)]
        finally:
            monitor.close()
