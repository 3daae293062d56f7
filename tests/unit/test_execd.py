"""What hooks read from Grid Engine: job ids, the spooled config, the shepherd check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from geco import procfs
from geco.errors import GecoError
from geco.jobkey import JOB_ID_RULE, TASK_ID_RULE
from geco.sge import execd
from geco.sge.execd import JobRef


@pytest.mark.parametrize(("argv", "env", "want"), [
    (["42", "0"], {}, (42, 1)),                         # queue args of a non-array job
    (["42", "3"], {}, (42, 3)),
    ([], {"JOB_ID": "42", "SGE_TASK_ID": "undefined"}, (42, 1)),
    ([], {"JOB_ID": "7", "SGE_TASK_ID": "2"}, (7, 2)),
    (["9"], {"SGE_TASK_ID": "4"}, (9, 4)),
])
def test_the_job_comes_from_arguments_else_environment(argv: list[str], env: dict[str, str],
                                                       want: tuple[int, int]) -> None:
    job = execd.job_from_hook(argv, env)
    assert (job.job_id, job.task_id) == want and job.key == f"{want[0]}.{want[1]}"


@pytest.mark.parametrize(("argv", "env", "message"), [
    ([], {}, "no job id: give $job_id as the first argument or run under Grid Engine"),
    (["x1"], {}, f"{JOB_ID_RULE}, got 'x1'"),
    (["0"], {}, f"{JOB_ID_RULE}, got '0'"),
    (["5", "-1"], {}, f"{TASK_ID_RULE}, got '-1'"),
    (["../5"], {}, f"{JOB_ID_RULE}, got '../5'"),
    ([], {"JOB_ID": "42", "SGE_TASK_ID": "x"}, f"{TASK_ID_RULE}, got 'x'"),
])
def test_bad_ids_are_refused_with_a_clear_message(argv: list[str], env: dict[str, str],
                                                  message: str) -> None:
    with pytest.raises(GecoError) as info:
        execd.job_from_hook(argv, env)
    assert str(info.value) == message


def test_the_spooled_config_is_read_as_key_value_lines(tmp_path: Path) -> None:
    (tmp_path / "config").write_bytes(b"job_owner=testuser\njob_name=a=b\ncwd=/home/t\n"
                                      b"junk line\nh_vmem=2G\n")
    conf = execd.read_config(tmp_path)
    assert conf == {"job_owner": "testuser", "job_name": "a=b", "cwd": "/home/t",
                    "h_vmem": "2G"}


def test_a_missing_spooled_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(GecoError) as info:
        execd.read_config(tmp_path)
    assert str(info.value) == ("cannot read the job's spooled config: No such file or "
                               f"directory (errno=ENOENT path={tmp_path / 'config'})")


def test_proc_ppid_survives_hostile_command_names(tmp_path: Path) -> None:
    """Given a process whose name contains ') ' and spaces, its parent is still read right."""
    exe = tmp_path / "a) b (c"
    exe.symlink_to(sys.executable)
    child = subprocess.Popen([str(exe), "-c", "import time; time.sleep(5)"])
    try:
        assert procfs.ppid(child.pid) == os.getpid()
        assert procfs.comm(child.pid) == "a) b (c"
    finally:
        child.kill()
        child.wait()
    assert procfs.ppid(child.pid) == 0 and procfs.comm(child.pid) == ""


def test_a_hook_whose_parent_is_not_a_shepherd_is_refused(tmp_path: Path) -> None:
    """Given a hook run by hand (parent: this test), then it will not put its parent
    into any job's cgroups."""
    job = JobRef(5, 1, tmp_path / "5.1")
    with pytest.raises(GecoError) as info:
        execd.find_shepherd(job)
    assert str(info.value).startswith("the hook's parent is not an sge_shepherd (ppid=")
    assert str(info.value).endswith("job=5.1)")


HOOK = """
import os, sys
from pathlib import Path
from geco.sge import execd
spool = Path(sys.argv[1])
(spool / "pid").write_text(str(os.getppid()))
try:
    execd.find_shepherd(execd.JobRef(5, 1, spool))
except Exception as exc:
    print(exc)
"""


def test_a_shepherd_of_another_job_is_refused(tmp_path: Path) -> None:
    """Given a process named sge_shepherd that runs in job 6.1's spool dir, when job 5.1's
    hook (its child) checks it, then it is refused: it is not that job's shepherd."""
    other, mine = tmp_path / "6.1", tmp_path / "5.1"
    other.mkdir()
    mine.mkdir()
    shepherd = tmp_path / "sge_shepherd"
    shepherd.symlink_to(sys.executable)
    repo = str(Path(__file__).resolve().parents[2])
    parent = ("import subprocess, sys; "
              "subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]])")
    out = subprocess.run([str(shepherd), "-c", parent, HOOK, str(mine)], env={"PYTHONPATH": repo},
                         cwd=other, capture_output=True, text=True, timeout=30)
    assert "the hook's parent is not this job's shepherd (ppid=" in out.stdout, out.stderr
    assert f"shepherd_cwd={other} spool_dir={mine}" in out.stdout


def test_given_an_execd_spool_when_finding_the_job_then_any_host_spelling_is_found(
        tmp_path: Path) -> None:
    (tmp_path / "vm.example.org" / "active_jobs" / "42.1").mkdir(parents=True)
    assert execd.find_spool_dir(tmp_path, "42.1", "vm") == \
        tmp_path / "vm.example.org" / "active_jobs" / "42.1"
    assert execd.find_spool_dir(tmp_path, "43.1", "vm") is None


def test_a_process_of_another_name_is_no_shepherd() -> None:
    assert not execd.is_job_shepherd(os.getpid())  # python
    assert not execd.is_job_shepherd(2**22 + 1)  # above pid_max: no such process
