"""Per-job trace files as a real job owner sees them: root's, readable by the owner only.

Root writes the files here the way the prolog, the epilog and gecod do
(:func:`geco.job.trace.for_job`, :class:`geco.job.trace.TraceRouter`), for jobs owned
by the unprivileged test user ``gecotest`` (the ``job_owner`` fixture; its
primary group is its own, as ``useradd`` makes it on Debian); the files are
then read, and written to, as ``gecotest`` and as ``nobody`` with ``runuser``.
The owner reads but cannot write or grow their trace. The starter runs as the
job's owner: it is run here in a child process that has dropped to
``gecotest``, and writes nothing into the trace.

The real Grid Engine runs (a job submitted with ``-l geco_trace_level``) are
in tests/integration.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco import config as _config
from geco import hooks, log
from geco.config import Config
from geco.hooks import Exit
from geco.job import trace
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from tests.servicekit import JobOwner

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0,
                                 reason="writes files as root and reads them as other users")]


@pytest.fixture(autouse=True)
def geco_logger(monkeypatch: pytest.MonkeyPatch, restored_geco_logger: logging.Logger) -> None:
    """The ``geco`` logger at DEBUG, restored afterwards (``restored_geco_logger``:
    tests/conftest.py); made-up jobs stay out of the machine's journal (real jobs may have
    the same ids)."""
    monkeypatch.setattr(log, "journal_socket", lambda: None)
    restored_geco_logger.setLevel(logging.DEBUG)


@pytest.fixture
def cfg() -> Iterator[Config]:
    """State and trace directories in a fresh 0755 directory every user can traverse
    (pytest's own temporary directories are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="geco-test-trace-"))
    base.chmod(0o755)
    yield Config(state_dir=base / "state", trace_dir=base / "trace")
    shutil.rmtree(base)


def job(owner: JobOwner, level: int = 3, job_id: int = 42) -> ResourceSet:
    return ResourceSet(job_id, 1, trace_level=level, owner=owner.name, job_name="myjob",
                       nodes=(NodeResources(short_hostname(), slots=1),))


def read_as(user: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", "cat", str(path)],
                          capture_output=True, text=True, timeout=30, check=False)


def append_as(user: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Try to grow ``path`` as ``user``: append to it, else make it writable first."""
    return subprocess.run(["runuser", "-u", user, "--", "sh", "-c",
                           'echo grown >> "$1" || { chmod u+w "$1" && echo grown >> "$1"; }',
                           "sh", str(path)],
                          capture_output=True, text=True, timeout=30, check=False)


def assert_only_the_owner_reads(path: Path, owner: JobOwner, text: str) -> None:
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, owner.gid, 0o640)
    mine = read_as(owner.name, path)
    assert mine.returncode == 0, mine.stderr
    assert text in mine.stdout
    theirs = read_as("nobody", path)
    assert theirs.returncode == 1
    assert theirs.stdout == ""
    assert theirs.stderr == f"cat: {path}: Permission denied\n"
    before = path.read_bytes()
    grow = append_as(owner.name, path)
    assert grow.returncode != 0
    assert f"{path}: Permission denied" in grow.stderr
    assert "Operation not permitted" in grow.stderr  # the chmod: not theirs
    assert path.read_bytes() == before


def test_a_hooks_trace_is_readable_by_the_job_owner_and_nobody_else(
        cfg: Config, job_owner: JobOwner) -> None:
    with trace.for_job(cfg, job(job_owner), program="geco-prolog") as path:
        log.get("prolog").info("job 42.1 contained")
    assert path is not None
    assert_only_the_owner_reads(path, job_owner, "geco-prolog [")
    assert "job 42.1 contained" in path.read_text()


def test_gecods_trace_is_readable_by_the_job_owner_and_nobody_else(
        cfg: Config, job_owner: JobOwner) -> None:
    resourcefile.write(cfg.resources_dir, job(job_owner, level=4))
    router = trace.TraceRouter(cfg)
    logging.getLogger("geco").addHandler(router)
    try:
        log.get("daemon").debug("job 42.1: shepherd quarantined",
                                extra=log.job_fields(42, 1, "quarantined", PID=99))
    finally:
        logging.getLogger("geco").removeHandler(router)
        router.close()
    path = cfg.trace_dir / "42.1.trace"
    assert_only_the_owner_reads(path, job_owner, "gecod [")
    assert "job 42.1: shepherd quarantined" in path.read_text()


def as_user(owner: JobOwner, work: object) -> int:
    """Run ``work()`` (returning an int) in a child that is ``owner``; return its result."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 255
        try:
            os.setgroups([])
            os.setgid(owner.gid)
            os.setuid(owner.uid)
            code = int(work())  # type: ignore[operator]
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def site(cfg: Config, monkeypatch: pytest.MonkeyPatch, job_owner: JobOwner) -> Config:
    """A site configuration naming the temporary directories, readable by the owner;
    the job's resource file at level 3, as the prolog leaves it."""
    conf = Path(cfg.state_dir.parent) / "geco.toml"
    conf.write_text(f'[paths]\nstate_dir = "{cfg.state_dir}"\n'
                    f'[log]\ntrace_dir = "{cfg.trace_dir}"\n')
    conf.chmod(0o644)
    monkeypatch.setattr(_config, "DEFAULT_PATH", conf)
    monkeypatch.setenv("JOB_ID", "42")
    monkeypatch.setenv("SGE_TASK_ID", "undefined")
    monkeypatch.setattr(sys, "argv", ["starter", "/bin/true"])
    resourcefile.write(cfg.resources_dir, job(job_owner))
    return cfg


def starter_body(cfg: Config, logger: logging.Logger) -> Exit:
    logger.info("the starter ran as uid %d", os.getuid())
    return Exit.JOB_ERROR  # a code the test can tell from a crash (255)


def test_the_starter_as_the_owner_leaves_the_prolog_trace_alone(
        site: Config, job_owner: JobOwner) -> None:
    """Given the trace file the root prolog made, when the starter runs as the job's owner,
    then it runs with its own exit code and the file is unchanged: only root writes it."""
    with trace.for_job(site, job(job_owner), program="geco-prolog"):
        log.get("prolog").info("prolog line")
    before = (site.trace_dir / "42.1.trace").read_bytes()
    assert as_user(job_owner, lambda: hooks.run("starter", starter_body)) == Exit.JOB_ERROR
    assert (site.trace_dir / "42.1.trace").read_bytes() == before
    assert_only_the_owner_reads(site.trace_dir / "42.1.trace", job_owner, "prolog line")


def test_an_owner_whose_primary_group_is_shared_gets_a_root_only_trace(
        cfg: Config, job_owner: JobOwner) -> None:
    """Given a job of nobody, whose primary group (nogroup) is not theirs alone, then the
    trace is root:root 0600: neither nobody nor another user reads it (a group-readable
    file would show it to every member of that group)."""
    owner = JobOwner("nobody", 65534, 65534, Path("/nonexistent"))
    with trace.for_job(cfg, job(owner)) as path:
        log.get("prolog").info("job 42.1 contained")
    assert path is not None
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    for user in ("nobody", job_owner.name):
        assert read_as(user, path).stderr == f"cat: {path}: Permission denied\n"


def test_the_starter_as_the_owner_creates_no_trace_file(site: Config,
                                                        job_owner: JobOwner) -> None:
    """Given no trace file (the job ran no root hook here), when the starter runs as the
    owner, then it starts untraced with its own exit code and creates nothing."""
    site.trace_dir.mkdir(mode=0o755)
    assert as_user(job_owner, lambda: hooks.run("starter", starter_body)) == Exit.JOB_ERROR
    assert list(site.trace_dir.iterdir()) == []


def test_the_owner_cannot_write_a_trace_file_root_made_for_someone_else(
        cfg: Config, job_owner: JobOwner) -> None:
    """Given a root-only trace file (its owner was unknown), when a process of the job's
    owner tries to trace into it, then it is refused and the file is unchanged."""
    rs = job(job_owner).replace(owner="no-such-user-here")
    with trace.for_job(cfg, rs) as path:
        log.get("x").info("root only")
    assert path is not None
    before = path.read_bytes()

    def try_it() -> int:
        with trace.for_job(cfg, job(job_owner)) as got:
            log.get("x").error("must not land")
        return 0 if got is None else 1
    assert as_user(job_owner, try_it) == 0
    assert path.read_bytes() == before


STARTER_IMPORTS = """
import os, sys
from pathlib import Path
from geco import config, log
config.DEFAULT_PATH = Path(sys.argv[1])
log.journal_socket = lambda: None
from geco.hooks import Exit, run
sys.argv = ["starter", "/bin/true"]
code = run("starter", lambda cfg, logger: Exit.OK)
print(code, " ".join(m for m in ("geco.job.trace", "geco.sge.resourcefile", "geco.resourceset")
                     if m in sys.modules) or "none")
"""


def test_the_starter_of_an_untraced_job_imports_no_trace_code(site: Config,
                                                              job_owner: JobOwner) -> None:
    """Given a job without a trace file, when its starter runs as the owner, then its uid
    decides: neither geco.job.trace nor the resource file code is imported (the starter is
    on every job's critical path)."""
    site.trace_dir.mkdir(mode=0o755)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        ["runuser", "-u", job_owner.name, "--", sys.executable, "-c", STARTER_IMPORTS,
         str(_config.DEFAULT_PATH)],
        capture_output=True, text=True, timeout=60, check=False, cwd=repo,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(repo), "JOB_ID": "42",
             "SGE_TASK_ID": "undefined", "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "0 none\n"
