"""Root's Grid Engine commands get the site's environment, never the job's (issue 11).

The root prolog and epilog run with the job's environment, which its owner sets
(``qsub -v SGE_QMASTER_PORT=1,SGE_ROOT=/tmp,PATH=/tmp/evil``). :mod:`geco.sge.siteenv`
builds the environment of qstat and qmod from geco.toml, the cell's
``settings.sh`` and sge_execd's own environment instead; these tests give it
fixture trees (a /proc with an sge_execd, a cell) and a hostile ``os.environ``.
A qmaster that cannot be reached is a transient failure (the prolog exits 99),
and a job is only run without memory limits when the site says so.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from geco import config as _config
from geco.config import Config
from geco.errors import QstatError
from geco.hooks import Exit, run
from geco.sge import execd, lookup
from geco.sge.command import run_qstat
from geco.sge.siteenv import SYSTEM_PATH, SgeEnv, discover
from tests.logkit import RecordingHandler, handler_on

HOSTILE = {"SGE_ROOT": "/tmp", "SGE_CELL": "x", "SGE_QMASTER_PORT": "1",
           "SGE_EXECD_PORT": "2", "SGE_CLUSTER_NAME": "evil", "SGE_ARCH": "evil",
           "PATH": "/tmp/evil", "LD_PRELOAD": "/tmp/evil.so"}
# what qstat -xml printed, exit status 0, with SGE_QMASTER_PORT=1 (SoGE 8.1.9)
COMM_ERROR = ("<?xml version='1.0'?>\n<comunication_error >\n    <AN_status>11</AN_status>\n"
              "    <AN_text>unable to send message to qmaster using port 1 on host "
              "&quot;vm&quot;: got send error</AN_text>\n    <AN_quality>1</AN_quality>\n"
              "</comunication_error>\n")


@pytest.fixture
def hostile_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``qsub -v`` puts into the environment of a root hook."""
    for name, value in HOSTILE.items():
        monkeypatch.setenv(name, value)


class Site:
    """A fixture tree: a /proc, an execd spool, a cell, Debian's defaults file."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.proc = base / "proc"
        self.spool = base / "spool"
        self.root = base / "sge"
        self.defaults = base / "default-gridengine"
        self.proc.mkdir()
        self.spool.mkdir()

    def process(self, pid: int, ppid: int, comm: str, uids: str = "0\t0\t0\t0",
                environ: dict[str, str] | None = None) -> None:
        d = self.proc / str(pid)
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uids}\n")
        fields = ["S", str(ppid)] + ["0"] * 17 + ["4242"]  # field 22 (index 19): start time
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0"
                                             for k, v in (environ or {}).items()))

    def cell(self, name: str = "default", settings: str = "", mode: int = 0o644) -> Path:
        common = self.root / name / "common"
        common.mkdir(parents=True)
        (common / "settings.sh").write_text(settings)
        (common / "settings.sh").chmod(mode)
        (self.root / "bin" / "lx-amd64").mkdir(parents=True, exist_ok=True)
        return common

    def config(self, **values: object) -> Config:
        return Config(execd_spool_dir=self.spool, **values)  # type: ignore[arg-type]

    def discover(self, cfg: Config | None = None, start: int = 300) -> SgeEnv:
        return discover(cfg or self.config(), proc=self.proc, start=start,
                        debian_defaults=self.defaults, debian_root=self.base / "no-debian")


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


def execd_below_hook(site: Site, environ: dict[str, str], uids: str = "0\t0\t0\t0") -> None:
    """hook 300 -> sge_shepherd 200 -> sge_execd 100, as Grid Engine forks them."""
    site.process(100, 1, "sge_execd", uids, environ)
    site.process(200, 100, "sge_shepherd", environ=HOSTILE)
    site.process(300, 200, "python3", environ=HOSTILE)


def test_given_a_hostile_job_environment_then_execd_and_the_cell_decide(
        site: Site, hostile_environ: None) -> None:
    """Given the job's SGE_*/PATH in os.environ, then every value comes from execd's own
    environment or the cell's settings.sh, and PATH is the site's."""
    execd_below_hook(site, {"SGE_ROOT": str(site.root), "SGE_CELL": "default",
                            "SGE_EXECD_PORT": "6445", "PATH": "/execd/path"})
    site.cell(settings="SGE_QMASTER_PORT=6444; export SGE_QMASTER_PORT\n"
                       "SGE_CLUSTER_NAME=p6444; export SGE_CLUSTER_NAME\n"
                       "SGE_ARCH=lx-amd64; export SGE_ARCH\n")
    env = site.discover()
    assert env.values == {"SGE_ROOT": str(site.root), "SGE_CELL": "default",
                          "SGE_QMASTER_PORT": "6444", "SGE_EXECD_PORT": "6445",
                          "SGE_CLUSTER_NAME": "p6444", "SGE_ARCH": "lx-amd64"}
    assert env.environ() == {**env.values, "PATH": f"{site.root}/bin/lx-amd64:{SYSTEM_PATH}",
                             "LC_ALL": "C", "HOME": "/"}
    assert env.sources["SGE_ROOT"] == "sge_execd pid 100"
    assert env.sources["SGE_QMASTER_PORT"] == f"{site.root}/default/common/settings.sh"


def test_given_geco_toml_values_then_they_win_over_everything(site: Site,
                                                              hostile_environ: None) -> None:
    execd_below_hook(site, {"SGE_ROOT": "/execd/root", "SGE_QMASTER_PORT": "7000"})
    site.cell("prod", settings="SGE_QMASTER_PORT=6444\n")
    env = site.discover(site.config(sge_root=str(site.root), sge_cell="prod",
                                    sge_qmaster_port=5000, sge_execd_port=5001,
                                    sge_cluster_name="main"))
    assert env.values == {"SGE_ROOT": str(site.root), "SGE_CELL": "prod",
                          "SGE_QMASTER_PORT": "5000", "SGE_EXECD_PORT": "5001",
                          "SGE_CLUSTER_NAME": "main"}
    assert set(env.sources.values()) == {"geco.toml"}


def test_given_a_process_that_merely_calls_itself_sge_execd_then_it_is_not_believed(
        site: Site, hostile_environ: None) -> None:
    """A user can name a process sge_execd (prctl) but not give it real uid 0."""
    execd_below_hook(site, {"SGE_ROOT": "/tmp", "SGE_QMASTER_PORT": "1"},
                     uids="1000\t0\t0\t0")
    env = site.discover()
    assert env.values == {"SGE_CELL": "default"}
    assert env.path == SYSTEM_PATH


def test_execd_is_found_through_its_pid_file_when_it_is_no_ancestor(site: Site) -> None:
    """gecod is no child of execd: the pid file in the execd spool names it."""
    site.process(100, 1, "sge_execd", environ={"SGE_ROOT": str(site.root)})
    site.process(300, 1, "gecod")
    (site.spool / "somehost").mkdir()
    (site.spool / "somehost" / "execd.pid").write_text("100\n")
    site.cell()
    assert site.discover().values["SGE_ROOT"] == str(site.root)


def test_settings_are_read_never_run_and_only_from_files_no_one_else_may_write(
        site: Site) -> None:
    """A value with backquotes or $ is not a literal: ignored. A group-writable
    settings.sh is ignored whole."""
    (site.defaults).write_text(f"SGE_ROOT={site.root}\nSGE_ARCH=`\"$SGE_ROOT/util/arch\"`\n")
    site.defaults.chmod(0o644)
    site.cell(settings="SGE_QMASTER_PORT=$(touch /tmp/pwned)\nSGE_EXECD_PORT=6445\n")
    env = site.discover()
    assert env.values == {"SGE_ROOT": str(site.root), "SGE_CELL": "default",
                          "SGE_EXECD_PORT": "6445"}
    site.defaults.chmod(0o664)
    assert "SGE_ROOT" not in site.discover().values


def test_invalid_values_are_ignored_with_a_warning(site: Site,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    execd_below_hook(site, {"SGE_ROOT": str(site.root), "SGE_QMASTER_PORT": "99999",
                            "SGE_CELL": ".."})
    site.cell()
    with caplog.at_level(logging.WARNING, logger="geco.sge.siteenv"):
        env = site.discover()
    assert (env.values["SGE_CELL"], "SGE_QMASTER_PORT" in env.values) == ("default", False)
    assert "ignoring SGE_QMASTER_PORT='99999' from sge_execd pid 100: not a valid value" \
        in caplog.text


def test_on_this_machine_the_real_execd_or_debian_defaults_give_a_working_qstat(
        hostile_environ: None) -> None:
    """Given the real /proc and the packaged Grid Engine, then qstat is the cell's, found
    in the site's PATH, and nothing of the hostile environment is used."""
    env = discover(Config())
    assert not set(env.values.items()) & set(HOSTILE.items())
    assert "/tmp" not in env.path
    qstat = env.which("qstat")
    assert qstat is not None and os.access(qstat, os.X_OK)


# ---------------------------------------------------------------------------
# an unreachable qmaster


def fake_qstat(directory: Path, body: str) -> Path:
    path = directory / "qstat"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_communication_error_document_is_a_transient_failure_not_the_jobs_data(
        tmp_path: Path) -> None:
    """qstat -xml prints <comunication_error> with exit status 0 when it cannot reach the
    qmaster: retried, then a QstatError (re-queue), never a QstatParseError (error state)."""
    qstat = fake_qstat(tmp_path, f"cat <<'EOF'\n{COMM_ERROR}EOF\n")
    sleeps: list[float] = []
    with pytest.raises(QstatError) as info:
        run_qstat(["-xml", "-j", "7"], Config(qstat=str(qstat), qstat_retries=1),
                  sleep=sleeps.append)
    assert str(info.value) == (
        f"{qstat} -xml -j 7 failed 2 time(s); last: cannot reach the qmaster: unable to "
        'send message to qmaster using port 1 on host "vm": got send error '
        "(attempts=2 exit_status=0)")
    assert sleeps == [1.0]


def spooled_job(tmp_path: Path) -> execd.JobRef:
    spool = tmp_path / "active_jobs" / "7.1"
    spool.mkdir(parents=True)
    (spool / "config").write_text("job_owner=alice\njob_name=j\n")
    (spool / "pe_hostfile").write_text(f"{os.uname().nodename} 1 all.q@x UNDEFINED\n")
    return execd.JobRef(7, 1, spool)


def prolog_body(job: execd.JobRef, seen: list[int]):  # type: ignore[no-untyped-def]
    """The prolog's resource step, on the site configuration the hook loaded."""
    def body(cfg: Config, log: logging.Logger) -> Exit:
        rs = lookup.find(job, cfg, log).resources
        seen.append(rs.nodes[0].memory_limit)
        return Exit.OK
    return body


@pytest.mark.usefixtures("restored_geco_logger")
@pytest.mark.parametrize("opt_in", [False, True], ids=["default", "run_without_memory_limits"])
def test_a_prolog_facing_an_unreachable_qmaster_requeues_unless_the_site_opts_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        opt_in: bool) -> None:
    """Given no resource file and a qmaster that cannot be reached, then by default the
    prolog exits 99 (re-queue: no job in error state, no queue in error state) and says
    why; a site with run_without_memory_limits = true gets the job bound to its cores
    with no memory limit, and a warning."""
    qstat = fake_qstat(tmp_path, f"cat <<'EOF'\n{COMM_ERROR}EOF\n")
    site = tmp_path / "geco.toml"
    site.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[qstat]\ncommand = "{qstat}"\nretries = 0\n'
                    f"run_without_memory_limits = {str(opt_in).lower()}\n")
    monkeypatch.setattr(_config, "DEFAULT_PATH", site)
    seen: list[int] = []
    records = RecordingHandler()
    with handler_on("geco.hooks.prolog", records):
        code = run("prolog", prolog_body(spooled_job(tmp_path), seen))
    err = capsys.readouterr().err
    [warning] = [r for r in records.records if r.levelno == logging.WARNING]
    event = warning.geco_fields["GECO_EVENT"]  # type: ignore[attr-defined]
    if opt_in:
        assert (code, seen, event) == (Exit.OK, [0], "degraded-containment")
        assert "job 7.1 is contained with its cores only, WITHOUT memory limits" \
            in warning.getMessage()
    else:
        assert (code, seen, event) == (Exit.REQUEUE, [], "degraded-containment-refused")
        assert "job 7.1 is not started with its cores only and no memory limits" \
            in warning.getMessage()
        assert "cannot reach the qmaster" in err
        assert err.rstrip().endswith("; re-queueing the job")
