"""`geco status --job`: what is read for a job, and how it is shown.

The backend here is a stand-in that answers like a real one (its figures are
the test's inputs); the real kernel is read in tests/system/test_job_cli.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from geco import jobfiles
from geco.cgroup import Limits
from geco.config import Config
from geco.errors import CgroupError, GecoError
from geco.jobkey import JobKey
from geco.reports import jobstatus
from geco.reports.jobstatus import JobStatus, Process, format_duration, format_table
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile

HOST = short_hostname()
G = 1 << 30


class FakeBackend:
    """Answers exists/read_limits/usage/pids/job_keys like a backend with one job."""

    version = 1
    controllers = ("cpuset", "memory", "freezer", "pids")

    def __init__(self, keys: dict[str, tuple[Limits, dict[str, int], list[int]]]) -> None:
        self.keys = keys
        self.vanish_on_read = False

    def exists(self, key: str) -> bool:
        return key in self.keys

    def job_keys(self) -> list[JobKey]:
        return sorted(map(JobKey.parse, self.keys))

    def read_limits(self, key: str) -> Limits:
        return self.keys[key][0]

    def usage(self, key: str) -> dict[str, int]:
        if self.vanish_on_read:
            del self.keys[key]
            raise CgroupError(f"job {key} has no memory cgroup", key=key)
        return dict(self.keys[key][1])

    def pids(self, key: str) -> list[int]:
        return list(self.keys[key][2])


LIMITS = Limits(cpus="2-3", mems="0", memory=2 * G, memory_swap=3 * G, pids=4096)
USAGE = {"memory_current": 5 << 20, "memory_peak": 7 << 20, "oom_kill": 1,
         "cpu_user_usec": 12_345_678, "cpu_system_usec": 400_000,
         "pids_current": 3, "pids_peak": 9, "pids_max_events": 0}


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool")


def write_resources(cfg: Config, **changes: object) -> Path:
    rs = ResourceSet(job_id=42, task_id=1, runtime_limit=7200.0, owner="alice",
                     job_name="sim.sh", nodes=(NodeResources(HOST, slots=2),))
    return resourcefile.write(cfg.resources_dir, rs.replace(**changes))


def spool_config(cfg: Config, key: str, host: str = HOST) -> Path:
    path = cfg.execd_spool_dir / host / "active_jobs" / key / "config"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"job_id=42\n")
    return path


# -- read --------------------------------------------------------------------


def test_read_takes_limits_usage_processes_and_the_resource_file(cfg: Config) -> None:
    """Given a job with limits, usage (CPU included), our own pid in it, a resource file and
    a spooled config written 600 s before 'now', when read, then every figure is there and it
    has been running for 600 s of its 7200 s h_rt."""
    write_resources(cfg)
    started = spool_config(cfg, "42.1").stat().st_mtime
    backend = FakeBackend({"42.1": (LIMITS, USAGE, [os.getpid()])})

    st = jobstatus.read(cfg, backend, "42.1", now=started + 600)  # type: ignore[arg-type]

    assert st == JobStatus(
        key="42.1", host=HOST, owner="alice", job_name="sim.sh", cpus="2-3", mems="0",
        memory_limit=2 * G, memory_swap_limit=3 * G, memory_current=5 << 20,
        memory_peak=7 << 20, cpu_user=12.345678, cpu_system=0.4, oom_kills=1,
        pids_limit=4096, pids_current=3, pids_peak=9, pids_refused=0,
        processes=(Process(os.getpid(), Path("/proc/self/comm").read_text().strip()),),
        running_for=600.0, runtime_limit=7200.0, hosts=(HOST,))


def test_without_spooled_config_the_resource_file_dates_the_start(cfg: Config) -> None:
    """Given no execd spool dir, then the resource file's mtime is the start."""
    started = write_resources(cfg).stat().st_mtime
    backend = FakeBackend({"42.1": (LIMITS, USAGE, [])})
    st = jobstatus.read(cfg, backend, "42.1", now=started + 30)  # type: ignore[arg-type]
    assert (st.running_for, st.notes) == (30.0, ())


def test_the_spool_dir_is_found_under_another_spelling_of_the_host(cfg: Config) -> None:
    """Given the spool dir under a fully qualified host name, then it is still found."""
    started = spool_config(cfg, "42.1", host=f"{HOST}.cluster.example").stat().st_mtime
    backend = FakeBackend({"42.1": (LIMITS, USAGE, [])})
    st = jobstatus.read(cfg, backend, "42.1", now=started + 5)  # type: ignore[arg-type]
    assert st.running_for == 5.0


def test_without_resource_file_owner_and_start_are_unknown_and_noted(cfg: Config) -> None:
    """Given a job (gecod-made, say) with neither resource file nor spool dir, then owner,
    name, h_rt and start are empty and two notes say why; usage the kernel lacks is None."""
    backend = FakeBackend({"42.1": (Limits(cpus="0"), {"memory_current": 1}, [])})
    st = jobstatus.read(cfg, backend, "42.1")  # type: ignore[arg-type]
    assert (st.owner, st.job_name, st.runtime_limit, st.running_for, st.memory_peak,
            st.cpu_user, st.oom_kills) == ("", "", 0.0, None, None, None, None)
    assert st.notes == (
        f"no resource file {cfg.resources_dir}/42.1 (owner, name and h_rt unknown)",
        "start time unknown: no spooled job config and no resource file")


def test_a_corrupt_resource_file_is_noted_not_fatal(cfg: Config) -> None:
    path = jobfiles.resource_file(cfg.resources_dir, JobKey(42, 1))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GECOResourceSet_v1{")
    backend = FakeBackend({"42.1": (LIMITS, USAGE, [])})
    st = jobstatus.read(cfg, backend, "42.1")  # type: ignore[arg-type]
    assert st.notes[0].startswith("the resource file is unusable: ")
    assert st.running_for is None


def test_a_job_without_cgroups_is_one_sentence(cfg: Config) -> None:
    """Given no cgroup for 42.1, then CgroupError says the job has none on this host."""
    with pytest.raises(CgroupError) as err:
        jobstatus.read(cfg, FakeBackend({}), "42.1")  # type: ignore[arg-type]
    assert str(err.value) == (f"job 42.1 has no cgroups on {HOST} (not running here, "
                              f"or already ended)")


def test_a_job_that_ends_while_read_is_not_here_rather_than_a_failure(cfg: Config) -> None:
    """Given cgroups that vanish between the existence check and the usage read, then the
    error is the same 'no cgroups' sentence, not the backend's."""
    backend = FakeBackend({"42.1": (LIMITS, USAGE, [])})
    backend.vanish_on_read = True
    with pytest.raises(CgroupError) as err:
        jobstatus.read(cfg, backend, "42.1")  # type: ignore[arg-type]
    assert str(err.value) == (f"job 42.1 has no cgroups on {HOST} (not running here, "
                              f"or already ended)")


def test_a_bad_key_is_refused(cfg: Config) -> None:
    with pytest.raises(CgroupError) as err:
        jobstatus.read(cfg, FakeBackend({}), "42")  # type: ignore[arg-type]
    assert str(err.value) == ("a job cgroup key must be <job>.<task> in decimal digits "
                              "without leading zeros (e.g. 42.1), got '42'")


def test_keys_of_job_lists_only_that_jobs_tasks() -> None:
    backend = FakeBackend({k: (LIMITS, {}, []) for k in ("42.1", "42.3", "420.1", "4.2")})
    assert jobstatus.keys_of_job(backend, 42) == ["42.1", "42.3"]  # type: ignore[arg-type]


# -- format ------------------------------------------------------------------


STATUS = JobStatus(
    key=JobKey(42, 1), host="n001", owner="alice", job_name="sim.sh", cpus="2-3", mems="0",
    memory_limit=2 * G, memory_swap_limit=3 * G, memory_current=1288490188,
    memory_peak=3 << 29, cpu_user=12.345, cpu_system=0.4, oom_kills=0,
    pids_limit=4096, pids_current=7, pids_peak=9, pids_refused=0,
    processes=(Process(101, "sge_shepherd"), Process(20345, "sim.sh")),
    running_for=3723.0, runtime_limit=7200.0)


def test_the_table_has_one_line_per_figure() -> None:
    """Given a running job, then the table names the job and host and shows each figure."""
    assert format_table(STATUS).split("\n") == [
        "job 42.1 on n001",
        "  owner        alice",
        "  name         sim.sh",
        "  cores        2-3",
        "  NUMA nodes   0",
        "  memory       1.2G now, peak 1.5G, limit 2G",
        "  memory+swap  limit 3G",
        "  CPU          12.3 s user + 0.4 s system",
        "  OOM kills    0",
        "  tasks        7 now, peak 9, limit 4096",
        "  processes    2",
        "  running for  1:02:03 of h_rt 2:00:00 (52%)",
        ""]


def test_on_a_gpu_node_the_table_names_the_jobs_gpus() -> None:
    """Given a job on a node with GPUs, then a GPUs line follows the NUMA nodes: its ids, or
    "none" for a job that was granted none (and so can open none)."""
    assert format_table(dataclasses.replace(STATUS, gpus="1,3")).split("\n")[5] == \
        "  GPUs         1,3"
    assert format_table(dataclasses.replace(STATUS, gpus="")).split("\n")[5] == \
        "  GPUs         none"


def test_verbose_lists_each_process_under_the_count() -> None:
    lines = format_table(STATUS, verbose=True).split("\n")
    assert lines[10:14] == ["  processes    2",
                           "                   101  sge_shepherd",
                           "                 20345  sim.sh",
                           "  running for  1:02:03 of h_rt 2:00:00 (52%)"]


def test_unknowns_are_said_in_words() -> None:
    """Given nothing but the cgroup (no resource file, old kernel, no cpuacct, no limits),
    then each unknown figure says why, and the notes follow."""
    st = dataclasses.replace(
        STATUS, owner="", job_name="", memory_limit=0, memory_swap_limit=0, memory_peak=None,
        cpu_user=None, cpu_system=None, oom_kills=None, pids_limit=0, pids_current=None,
        pids_peak=None, pids_refused=None, processes=(Process(7, ""),),
        running_for=None, runtime_limit=0.0, notes=("no resource file x",))
    assert format_table(st, verbose=True).split("\n") == [
        "job 42.1 on n001",
        "  owner        unknown",
        "  name         unknown",
        "  cores        2-3",
        "  NUMA nodes   0",
        "  memory       1.2G now, peak not reported by this kernel, limit none",
        "  memory+swap  limit none",
        "  CPU          not accounted on this node (no cpuacct cgroup for the job)",
        "  OOM kills    not counted by this kernel",
        "  tasks        not counted, no limit (the job has no pids cgroup on this node)",
        "  processes    1",
        "                 7  ?",
        "  running for  unknown",
        "  note: no resource file x",
        ""]


@pytest.mark.parametrize(("running", "limit", "text"), [
    (59.9, 0.0, "0:00:59 (no h_rt)"),
    (7300.0, 7200.0, "2:01:40, past h_rt 2:00:00 by 0:01:40"),
    (7200.0, 7200.0, "2:00:00 of h_rt 2:00:00 (100%)"),
])
def test_running_time_against_h_rt(running: float, limit: float, text: str) -> None:
    st = dataclasses.replace(STATUS, running_for=running, runtime_limit=limit)
    assert format_table(st).split("\n")[-2] == f"  running for  {text}"


def test_durations_are_hours_minutes_seconds_with_unbounded_hours() -> None:
    assert [format_duration(s) for s in (0, 61.9, 3600, 90061)] == [
        "0:00:00", "0:01:01", "1:00:00", "25:01:01"]


def test_json_form_has_bytes_seconds_and_nulls() -> None:
    doc = json.loads(json.dumps(jobstatus.to_dict(
        dataclasses.replace(STATUS, cpu_user=None, cpu_system=None))))
    assert doc == {
        "key": "42.1", "job_id": 42, "task_id": 1, "host": "n001", "owner": "alice",
        "job_name": "sim.sh", "cpus": "2-3", "mems": "0", "memory_limit": 2 * G,
        "memory_swap_limit": 3 * G, "memory_current": 1288490188, "memory_peak": 3 << 29,
        "cpu_user": None, "cpu_system": None, "oom_kills": 0,
        "pids_limit": 4096, "pids_current": 7, "pids_peak": 9, "pids_refused": 0,
        "processes": [{"pid": 101, "command": "sge_shepherd"},
                      {"pid": 20345, "command": "sim.sh"}],
        "running_for": 3723.0, "runtime_limit": 7200.0, "notes": [], "hosts": [],
            "gpus": None}


def test_another_hosts_json_form_reads_back_as_the_same_status() -> None:
    """Given a status as another host sends it (JSON, NODE_STATUS), then from_dict gives the
    very status back, unknowns included; a document that is not one is one clear error."""
    st = dataclasses.replace(STATUS, cpu_user=None, memory_peak=None, notes=("x",),
                             hosts=("n001", "n002"))
    assert jobstatus.from_dict(json.loads(json.dumps(jobstatus.to_dict(st)))) == st
    on_a_gpu_node = dataclasses.replace(STATUS, gpus="1,3")
    assert jobstatus.from_dict(json.loads(json.dumps(jobstatus.to_dict(on_a_gpu_node)))) \
        == on_a_gpu_node
    with pytest.raises(GecoError, match="not a job status document: KeyError: 'key'"):
        jobstatus.from_dict({"host": "n002"})


def test_a_job_over_several_hosts_names_them_in_the_table() -> None:
    """Given a job whose resource file names three hosts, then its table says so."""
    lines = format_table(dataclasses.replace(STATUS, hosts=("n001", "n002", "n003"))).split("\n")
    assert lines[1:4] == ["  owner        alice", "  name         sim.sh",
                          "  hosts        3: n001, n002, n003"]


def test_the_accounting_view_is_the_job_end_record() -> None:
    """The status's figures, as the shared Accounting record (unknown counts as 0)."""
    st = dataclasses.replace(STATUS, oom_kills=None)
    assert st.accounting.describe() == ("peak memory 1.5G, CPU 12.3 s user + 0.4 s system, "
                                        "no OOM kill")
