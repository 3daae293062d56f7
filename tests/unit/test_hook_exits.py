"""Hook exit codes: what Grid Engine does with them is the contract (sge_shepherd(8)).

99 re-queues the job, 100 puts the job in error state, and anything else would
put the whole queue in error state; no failure of one job may do that.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from geco import config as _config
from geco.config import Config
from geco.errors import GecoError, NotContained, QstatParseError, TaskNotRunning
from geco.hooks import Exit, run
from geco.hooks.starter import Launch, job_argv

# hooks.run() sets up geco's logging (stderr and the journal): undone after each test
# (tests/conftest.py), or every later test's journal records would reach journald twice
pytestmark = pytest.mark.usefixtures("restored_geco_logger")


def _raiser(exc: BaseException):  # type: ignore[no-untyped-def]
    def body(cfg: Config, log: logging.Logger) -> Exit:
        raise exc
    return body


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_config, "DEFAULT_PATH", tmp_path / "geco.toml")


@pytest.mark.parametrize(("failure", "code"), [
    (GecoError("cgroup refused"), Exit.REQUEUE),
    (TaskNotRunning("task 1 of job 5 is not dispatched yet"), Exit.REQUEUE),
    (QstatParseError("JB_owner is missing"), Exit.JOB_ERROR),
    (NotContained("job 5.1 is not inside its cgroups"), Exit.JOB_ERROR),
    (RuntimeError("a bug"), Exit.REQUEUE),
    (KeyError("a bug"), Exit.REQUEUE),
])
def test_before_the_job_a_failure_requeues_or_holds_never_other_codes(
        failure: Exception, code: Exit, capsys: pytest.CaptureFixture[str]) -> None:
    """Given a prolog body that fails, then the hook exits 99 or 100 and says why on stderr."""
    assert run("prolog", _raiser(failure)) == code
    err = capsys.readouterr().err
    assert f"geco prolog: {'internal error ' if not isinstance(failure, GecoError) else ''}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("failure", [GecoError("x"), QstatParseError("y"), RuntimeError("z")])
def test_after_the_job_every_failure_exits_zero(failure: Exception) -> None:
    """Given an epilog body that fails, then the hook still exits 0: 99 would run the
    job a second time and anything else would put the queue in error state."""
    assert run("epilog", _raiser(failure), after_the_job=True) == Exit.OK


def test_a_broken_configuration_requeues(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("[log\n")
    monkeypatch.setattr(_config, "DEFAULT_PATH", bad)
    assert run("prolog", _raiser(AssertionError("never reached"))) == Exit.REQUEUE
    assert "the configuration is not valid TOML" in capsys.readouterr().err


def test_hooks_ignore_geco_config_from_the_job_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Given a job owner who sets GECO_CONFIG (qsub -v) to a file of theirs, then the
    root hooks still read only the site's file."""
    evil = tmp_path / "evil.toml"
    evil.write_text('[qstat]\ncommand = "/home/mallory/qstat"\n')
    monkeypatch.setenv("GECO_CONFIG", str(evil))
    seen: list[str] = []

    def body(cfg: Config, log: logging.Logger) -> Exit:
        seen.append(cfg.qstat)
        return Exit.OK
    assert run("prolog", body) == Exit.OK
    assert seen == ["qstat"]


SCRIPT = "/var/spool/gridengine/execd/vm/job_scripts/7"


def test_a_batch_script_runs_under_the_queue_shell_as_grid_engine_would() -> None:
    """posix_compliant: the script runs under SGE_STARTER_SHELL_PATH, a login shell when
    SGE says so, with the job's arguments untouched."""
    env = {"JOB_SCRIPT": SCRIPT, "SGE_STARTER_SHELL_PATH": "/bin/bash",
           "SGE_STARTER_SHELL_START_MODE": "posix_compliant", "SGE_STARTER_USE_LOGIN_SHELL": "true"}
    assert job_argv([SCRIPT, "argA", "arg B", ""], env, Launch()) == (
        "/bin/bash", ["-bash", SCRIPT, "argA", "arg B", ""])
    env["SGE_STARTER_USE_LOGIN_SHELL"] = "false"
    assert job_argv([SCRIPT, "x"], env, Launch()) == ("/bin/bash", ["bash", SCRIPT, "x"])


def test_unix_behavior_and_binaries_without_a_shell_are_executed_directly() -> None:
    env = {"JOB_SCRIPT": SCRIPT, "SGE_STARTER_SHELL_PATH": "/bin/sh",
           "SGE_STARTER_SHELL_START_MODE": "unix_behavior"}
    assert job_argv([SCRIPT, "a"], env, Launch()) == (SCRIPT, [SCRIPT, "a"])
    binary = {"JOB_SCRIPT": "sleep", "SGE_STARTER_SHELL_PATH": "/bin/sh",
              "SGE_STARTER_SHELL_START_MODE": "posix_compliant"}
    assert job_argv(["sleep", "10"], binary, Launch(binary=True, no_shell=True)) == (
        "sleep", ["sleep", "10"])


def test_a_binary_job_with_a_shell_is_one_command_line_for_the_shell() -> None:
    """`qsub -b y 'echo one | tr a-z A-Z'` and `qsub -b y /bin/echo "a b" "e'f"`: Grid
    Engine joins the words, each followed by a space, into one `sh -c` line (a login
    shell when SGE says so), so pipes work and an odd quote is the shell's error."""
    env = {"JOB_SCRIPT": "echo one | tr a-z A-Z", "SGE_STARTER_SHELL_PATH": "/bin/sh",
           "SGE_STARTER_SHELL_START_MODE": "posix_compliant",
           "SGE_STARTER_USE_LOGIN_SHELL": "true"}
    assert job_argv(["echo one | tr a-z A-Z"], env, Launch(binary=True)) == (
        "/bin/sh", ["-sh", "-c", "echo one | tr a-z A-Z "])
    assert job_argv(["/bin/echo", "a b", "e'f"], env, Launch(binary=True))[1][2] == \
        "/bin/echo a b e'f "
    # script_from_stdin: Grid Engine hands the starter "-s" and the arguments only
    env.update(JOB_SCRIPT="/usr/bin/printf", SGE_STARTER_SHELL_START_MODE="script_from_stdin")
    assert job_argv(["-s", "[%s]", "a b"], env, Launch(binary=True)) == (
        "/bin/sh", ["-sh", "-c", "/usr/bin/printf [%s] a b "])


def test_script_from_stdin_and_start_as_command_run_the_shell_as_grid_engine_does() -> None:
    env = {"JOB_SCRIPT": SCRIPT, "SGE_STARTER_SHELL_PATH": "/bin/bash",
           "SGE_STARTER_SHELL_START_MODE": "script_from_stdin"}
    assert job_argv(["-s", "a 1"], env, Launch()) == ("/bin/bash", ["bash", "-s", "a 1"])
    env["SGE_STARTER_SHELL_START_MODE"] = "start_as_command"
    assert job_argv([SCRIPT, "x"], env, Launch()) == ("/bin/bash", ["bash", "-c", SCRIPT])


def test_a_qrsh_command_runs_under_the_owner_shell_unless_noshell() -> None:
    """qrsh_starter hands a starter the words; without a starter it runs them as one line
    under the owner's login shell (`-c`), or directly with `qrsh -noshell`."""
    qrsh = {"JOB_SCRIPT": "QRSH", "SGE_STARTER_SHELL_PATH": "",
            "SGE_STARTER_SHELL_START_MODE": "unix_behavior"}
    words = ["echo hi | tr a-z A-Z;", "exit", "3"]
    assert job_argv(words, qrsh, Launch(qrsh=True, owner_shell="/bin/bash")) == (
        "/bin/bash", ["bash", "-c", "echo hi | tr a-z A-Z; exit 3"])
    assert job_argv(["/tmp/petask.sh", "a 2"], qrsh, Launch(qrsh=True, no_shell=True)) == (
        "/tmp/petask.sh", ["/tmp/petask.sh", "a 2"])
