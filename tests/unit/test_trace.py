"""Per-job trace files (geco.job.trace) and how the hooks write them.

Files are made in a root-owned temporary directory, so these tests need root
(every geco hook that writes a trace runs as root; a non-root writer is
refused a directory it owns, which the tests below show too). The job owner is
``nobody``: a real user who is not root, so ownership and mode are checked
without creating accounts (tests/system/test_trace.py reads the files as a
real job owner).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from geco import config as _config
from geco import hooks, log
from geco.cgroup import Limits
from geco.config import Config
from geco.errors import GecoError
from geco.hooks import Exit
from geco.job import trace
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import lookup, resourcefile
from tests.logkit import RecordingHandler

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="trace files are root's to make (chown to the owner)")

NOBODY = 65534
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} (?P<program>\S+) "
                  r"\[(?P<pid>\d+)\|(?P<label>ERROR|WARN |INFO |DEBUG)\]: (?P<text>.*)$")


class Records(RecordingHandler):
    """Keeps every record that reaches the ``geco`` logger."""

    def messages(self, levelno: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= levelno]

    def events(self) -> dict[str, dict[str, str]]:
        return {r.geco_fields["GECO_EVENT"]: r.geco_fields  # type: ignore[attr-defined]
                for r in self.records if "GECO_EVENT" in getattr(r, "geco_fields", {})}


@pytest.fixture(autouse=True)
def geco_logger(restored_geco_logger: logging.Logger) -> Records:
    """The ``geco`` logger at DEBUG with only a recording handler; restored afterwards
    (``restored_geco_logger``: tests/conftest.py)."""
    records = Records()
    restored_geco_logger.handlers[:] = [records]
    restored_geco_logger.setLevel(logging.DEBUG)
    restored_geco_logger.propagate = False
    return records


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state", trace_dir=tmp_path / "log" / "trace")


def job(level: int, owner: str = "nobody", job_id: int = 42, task_id: int = 1) -> ResourceSet:
    return ResourceSet(job_id, task_id, trace_level=level, owner=owner, job_name="myjob",
                       nodes=(NodeResources(short_hostname(), slots=1),))


def say_all(name: str = "trace-test") -> None:
    lg = log.get(name)
    lg.debug("a debug step")
    lg.info("an info step")
    lg.warning("a warning")
    lg.error("an error")


def lines(path: Path) -> list[dict[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        assert m is not None, f"not a trace line: {line!r}"
        out.append(m.groupdict())
    return out


# ---------------------------------------------------------------------------
# levels


@pytest.mark.parametrize(("level", "expected"), [
    (-1, None), (0, None), (1, logging.ERROR), (2, logging.WARNING), (3, logging.INFO),
    (4, logging.DEBUG), (9, logging.DEBUG)])
def test_trace_levels_are_error_warn_info_debug(level: int, expected: int | None) -> None:
    assert trace.logging_level(level) == expected


@pytest.mark.parametrize(("level", "texts"), [
    (1, ["an error"]),
    (2, ["a warning", "an error"]),
    (3, ["an info step", "a warning", "an error"]),
    (4, ["a debug step", "an info step", "a warning", "an error"])])
def test_a_job_gets_the_lines_at_its_level_and_more_severe(cfg: Config, level: int,
                                                           texts: list[str]) -> None:
    """Given a job with geco_trace_level=N, when geco logs at every level, then its trace
    file holds exactly the lines at that level or above, in the seed format with the
    writer's name."""
    with trace.for_job(cfg, job(level), program="geco-test") as path:
        say_all()
    assert path == cfg.trace_dir / "42.1.trace"
    got = lines(path)
    assert [g["text"].split(") ", 1)[-1] for g in got] == texts
    assert {g["program"] for g in got} == {"geco-test"}
    assert {g["pid"] for g in got} == {str(os.getpid())}


@pytest.mark.parametrize("rs", [None, job(0), job(-3)])
def test_no_level_no_file(cfg: Config, rs: ResourceSet | None) -> None:
    """Given no resources or trace level 0, then nothing is traced and no directory made."""
    with trace.for_job(cfg, rs) as path:
        say_all()
    assert path is None
    assert not cfg.trace_dir.exists()


# ---------------------------------------------------------------------------
# who can read the file


def test_an_owner_with_a_shared_group_gets_a_root_only_file_in_a_root_0755_directory(
        cfg: Config, geco_logger: Records) -> None:
    """Given a job of nobody, whose primary group nogroup is not named after them (so not
    theirs alone), then the file is root:root 0600 with a warning saying why; the owner's
    own reading is tests/system/test_trace_access.py's (a user with a private group)."""
    with trace.for_job(cfg, job(3)) as path:
        pass
    assert path is not None
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    dst = cfg.trace_dir.stat()
    assert (dst.st_uid, stat.S_IMODE(dst.st_mode)) == (0, 0o755)
    assert ("job 42.1: the primary group 'nogroup' of owner 'nobody' is not theirs alone; its "
            "trace file is readable by root only") in geco_logger.messages(logging.WARNING)


def test_a_job_of_root_gets_a_root_0640_file(cfg: Config, geco_logger: Records) -> None:
    """Given a job of root (group root, no other members: root's alone), then the file is
    root:root 0640 and nothing is warned about."""
    with trace.for_job(cfg, job(3, owner="root")) as path:
        pass
    assert path is not None
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o640)
    assert geco_logger.messages(logging.WARNING) == []


def test_an_unknown_owner_gets_a_root_only_file_and_a_warning(cfg: Config,
                                                              geco_logger: Records) -> None:
    with trace.for_job(cfg, job(3, owner="no-such-user-here")) as path:
        log.get("x").info("hello")
    assert path is not None
    st = path.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)
    assert ("job 42.1: owner 'no-such-user-here' is not known on this host; its trace file "
            "is readable by root only") in geco_logger.messages(logging.WARNING)
    assert geco_logger.events()["trace-root-only"]["OWNER"] == "no-such-user-here"


def test_a_file_of_the_same_owner_is_appended_to(cfg: Config) -> None:
    with trace.for_job(cfg, job(3), program="geco-prolog") as path:
        log.get("x").info("first")
    with trace.for_job(cfg, job(3), program="geco-epilog"):
        log.get("x").info("second")
    assert path is not None
    assert [(g["program"], g["text"].split(") ", 1)[1]) for g in lines(path)] == [
        ("geco-prolog", "first"), ("geco-epilog", "second")]


@pytest.mark.parametrize("ids", [(0, 12345), (NOBODY, NOBODY)], ids=["other-group", "user-owned"])
def test_a_stale_file_of_another_owner_is_replaced_not_handed_over(
        cfg: Config, ids: tuple[int, int]) -> None:
    """Given a trace file left by an earlier job with the same id and another owner (job
    ids restart: root's file with that owner's group), or one a user owns (as geco before
    root-owned traces left it: its owner could have written anything into it), then the
    new job gets a fresh root-owned file, not the old lines."""
    cfg.trace_dir.mkdir(parents=True)
    old = cfg.trace_dir / "42.1.trace"
    old.write_text("bob's secret line\n")
    os.chown(old, *ids)
    old.chmod(0o640)
    with trace.for_job(cfg, job(3)) as path:
        log.get("x").info("alice's line")
    assert path == old
    assert "bob's secret" not in old.read_text()
    assert (old.stat().st_uid, old.stat().st_gid) == (0, 0)


def test_a_wider_mode_is_narrowed_to_0600(cfg: Config) -> None:
    cfg.trace_dir.mkdir(parents=True)
    old = cfg.trace_dir / "42.1.trace"
    old.write_text("")
    old.chmod(0o644)
    with trace.for_job(cfg, job(3)):
        pass
    assert stat.S_IMODE(old.stat().st_mode) == 0o600


# ---------------------------------------------------------------------------
# refused files and directories: a warning, never an exception


def refused(records: Records) -> list[str]:
    return [m for m in records.messages(logging.WARNING) if "no trace file written" in m]


def test_a_symlinked_trace_file_is_refused(cfg: Config, tmp_path: Path,
                                           geco_logger: Records) -> None:
    """Given <job>.<task>.trace is a symlink (to /etc/shadow, say), then geco neither follows
    it nor writes anywhere; the job runs untraced and a warning says why."""
    target = tmp_path / "target"
    target.write_text("untouched\n")
    cfg.trace_dir.mkdir(parents=True)
    (cfg.trace_dir / "42.1.trace").symlink_to(target)
    with trace.for_job(cfg, job(4)) as path:
        say_all()
    assert path is None
    assert target.read_text() == "untouched\n"
    assert target.stat().st_uid == 0
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir}/42.1.trace is a symbolic link"]
    assert geco_logger.events()["trace-refused"]["REASON"] == (
        f"{cfg.trace_dir}/42.1.trace is a symbolic link")


def test_a_symlinked_trace_directory_is_refused(cfg: Config, tmp_path: Path,
                                                geco_logger: Records) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    cfg.trace_dir.parent.mkdir(parents=True)
    cfg.trace_dir.symlink_to(elsewhere)
    with trace.for_job(cfg, job(3)) as path:
        pass
    assert path is None
    assert list(elsewhere.iterdir()) == []
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir} is a symbolic link"]


def test_a_trace_directory_not_owned_by_root_is_refused(cfg: Config,
                                                        geco_logger: Records) -> None:
    cfg.trace_dir.mkdir(parents=True, mode=0o755)
    os.chown(cfg.trace_dir, NOBODY, NOBODY)
    with trace.for_job(cfg, job(3)) as path:
        pass
    assert path is None
    assert list(cfg.trace_dir.iterdir()) == []
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir} must be owned by root, "
        f"got uid {NOBODY}"]


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_trace_directory_writable_by_others_is_refused(cfg: Config, geco_logger: Records,
                                                         mode: int) -> None:
    cfg.trace_dir.mkdir(parents=True)
    cfg.trace_dir.chmod(mode)
    with trace.for_job(cfg, job(3)) as path:
        pass
    assert path is None
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir} must not be writable by group "
        f"or others, got mode {mode:04o}"]


def test_a_trace_directory_that_is_a_file_is_refused(cfg: Config,
                                                     geco_logger: Records) -> None:
    cfg.trace_dir.parent.mkdir(parents=True)
    cfg.trace_dir.write_text("")
    with trace.for_job(cfg, job(3)) as path:
        pass
    assert path is None
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir} is not a directory"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "hard link"])
def test_a_trace_file_that_is_not_a_plain_file_is_refused(cfg: Config, tmp_path: Path,
                                                          geco_logger: Records,
                                                          kind: str) -> None:
    """Given a FIFO (which would block a plain open), a directory or a second hard link
    where the trace file goes, then it is refused at once and nothing is written."""
    cfg.trace_dir.mkdir(parents=True)
    path = cfg.trace_dir / "42.1.trace"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        other = cfg.trace_dir / "other"
        other.write_text("kept\n")
        os.link(other, path)
    with trace.for_job(cfg, job(3)) as got:
        log.get("x").error("not written")
    assert got is None
    what = "a file with one link" if kind == "hard link" else "a regular file"
    if kind == "directory":
        # the kernel refuses to open a directory for writing before geco can look at it
        assert refused(geco_logger) == [
            f"job 42.1: no trace file written: cannot open {path}: Is a directory"]
    else:
        assert refused(geco_logger) == [f"job 42.1: no trace file written: {path} is not {what}"]
    if kind == "hard link":
        assert path.read_text() == "kept\n"


def test_a_write_error_stops_the_trace_with_one_warning(cfg: Config,
                                                        geco_logger: Records) -> None:
    """Given a trace whose file cannot be written any more (a full disk), then the block
    goes on untraced and one warning says so."""
    with trace.for_job(cfg, job(3)) as path:
        assert path is not None
        handler = next(h for h in logging.getLogger("geco").handlers
                       if isinstance(h, trace._TraceFile))
        assert handler.fd is not None
        os.close(handler.fd)
        handler.fd = os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
        log.get("x").info("lost")
        log.get("x").info("lost too")
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: cannot write {path}: No space left on device"]


# ---------------------------------------------------------------------------
# the logger is left as it was


def test_for_job_lowers_the_logger_level_for_the_block_and_restores_it(cfg: Config) -> None:
    geco = logging.getLogger("geco")
    geco.setLevel(logging.WARNING)
    before = list(geco.handlers)
    with trace.for_job(cfg, job(4)) as path:
        assert geco.level == logging.DEBUG
        log.get("x").debug("seen in the trace")
    assert path is not None
    assert geco.level == logging.WARNING
    assert geco.handlers == before
    assert [g["text"].split(") ", 1)[1] for g in lines(path)] == ["seen in the trace"]


def test_for_job_restores_the_logger_when_the_block_raises(cfg: Config) -> None:
    geco = logging.getLogger("geco")
    geco.setLevel(logging.NOTSET)
    before = list(geco.handlers)
    with pytest.raises(GecoError, match=r"^boom$"), trace.for_job(cfg, job(3)):
        raise GecoError("boom")
    assert geco.level == logging.NOTSET
    assert geco.handlers == before


def test_a_backlog_replays_what_was_logged_before_the_level_was_known(cfg: Config) -> None:
    """Given records kept before the job's resources were read (the prolog's qstat), then
    the trace starts with those at the job's level, in order."""
    backlog = log.Backlog()
    log.collect(backlog)
    say_all()
    log.collect(None)
    with trace.for_job(cfg, job(2), backlog=backlog) as path:
        log.get("x").warning("after")
    assert path is not None
    assert [g["text"] for g in lines(path)] == ["a warning", "an error", "after"]
    assert not backlog.records


def test_a_backlog_keeps_only_the_last_records() -> None:
    backlog = log.Backlog(maxlen=2)
    log.collect(backlog)
    for n in range(5):
        log.get("x").info("record %d", n)
    log.collect(None)
    handler = RecordingHandler()
    backlog.replay(handler)
    assert [r.getMessage() for r in handler.records] == ["record 3", "record 4"]


# ---------------------------------------------------------------------------
# gecod's router


@pytest.fixture
def router(cfg: Config) -> Iterator[trace.TraceRouter]:
    handler = trace.TraceRouter(cfg)
    logging.getLogger("geco").addHandler(handler)
    yield handler
    logging.getLogger("geco").removeHandler(handler)
    handler.close()


def save(cfg: Config, rs: ResourceSet) -> None:
    resourcefile.write(cfg.resources_dir, rs)


def say_for(job_id: int | str, task_id: int | str, text: str,
            level: int = logging.INFO) -> None:
    log.get("daemon").log(level, text, extra=log.job_fields(job_id, task_id, "test"))


def test_the_router_writes_a_traced_jobs_records_at_its_level(
        cfg: Config, router: trace.TraceRouter) -> None:
    """Given job 42.1 at trace level 3 and job 43.1 at 0, when gecod logs for both (and
    for no job), then only 42.1's info-and-above records land in 42.1's file."""
    save(cfg, job(3))
    save(cfg, job(0, job_id=43))
    say_for(42, 1, "quarantined 42")
    say_for(42, 1, "debug 42", logging.DEBUG)
    say_for(43, 1, "quarantined 43")
    log.get("daemon").info("no job at all")
    path = cfg.trace_dir / "42.1.trace"
    got = lines(path)
    assert [g["text"].split(") ", 1)[1] for g in got] == ["quarantined 42"]
    assert got[0]["program"] == "gecod"
    assert sorted(p.name for p in cfg.trace_dir.iterdir()) == ["42.1.trace"]
    assert path.stat().st_uid == 0


def test_the_router_ignores_jobs_without_a_resource_file(
        cfg: Config, router: trace.TraceRouter) -> None:
    say_for(44, 1, "nothing known of 44")
    assert not cfg.trace_dir.exists()


def test_the_router_treats_a_garbage_resource_file_as_untraced(
        cfg: Config, router: trace.TraceRouter, geco_logger: Records) -> None:
    cfg.resources_dir.mkdir(parents=True)
    (cfg.resources_dir / "42.1").write_bytes(b"GECOResourceSet_v1{li42,li1,lf0,b0,garbage")
    say_for(42, 1, "not traced", logging.ERROR)
    assert not cfg.trace_dir.exists()
    assert geco_logger.messages() == ["not traced"]


@pytest.mark.parametrize(("job_id", "task_id"), [("../../etc/x", "1"), ("42", "1/../2"),
                                                 ("42", ""), ("", "1")])
def test_the_router_only_takes_job_fields_that_are_numbers(
        cfg: Config, router: trace.TraceRouter, job_id: str, task_id: str) -> None:
    save(cfg, job(4))
    say_for(job_id, task_id, "odd fields")
    assert not cfg.trace_dir.exists()


def test_the_router_sees_a_changed_resource_file(cfg: Config,
                                                 router: trace.TraceRouter) -> None:
    """Given a job first read at level 0, when its resource file is rewritten at level 4,
    then the next record is traced (the cache is keyed by mtime and inode)."""
    save(cfg, job(0))
    say_for(42, 1, "before")
    save(cfg, job(4))
    say_for(42, 1, "after", logging.DEBUG)
    path = cfg.trace_dir / "42.1.trace"
    assert [g["text"].split(") ", 1)[1] for g in lines(path)] == ["after"]


def test_the_router_forgets_ended_jobs_and_keeps_at_most_max_jobs(cfg: Config) -> None:
    router = trace.TraceRouter(cfg, max_jobs=2)
    logging.getLogger("geco").addHandler(router)
    try:
        for n in (50, 51, 52):
            save(cfg, job(0, job_id=n))
            say_for(n, 1, "x")
        assert sorted(router._jobs) == ["51.1", "52.1"]
        resourcefile.remove(cfg.resources_dir, JobKey(52, 1))
        say_for(52, 1, "x")
        assert sorted(router._jobs) == ["51.1"]
    finally:
        logging.getLogger("geco").removeHandler(router)


def test_a_refused_file_is_warned_about_once_not_per_record(
        cfg: Config, router: trace.TraceRouter, geco_logger: Records) -> None:
    """Given a traced job whose trace directory is not root's, when gecod logs three
    records for it, then one warning (journaled with the job's fields) says why, and the
    router does not loop on its own warning."""
    save(cfg, job(3))
    cfg.trace_dir.mkdir(parents=True)
    os.chown(cfg.trace_dir, NOBODY, NOBODY)
    for n in range(3):
        say_for(42, 1, f"record {n}")
    assert refused(geco_logger) == [
        f"job 42.1: no trace file written: {cfg.trace_dir} must be owned by root, "
        f"got uid {NOBODY}"]
    assert geco_logger.events()["trace-refused"]["JOB_ID"] == "42"
    assert list(cfg.trace_dir.iterdir()) == []


def test_the_router_never_raises_into_the_logging_call(cfg: Config, router: trace.TraceRouter,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       geco_logger: Records) -> None:
    save(cfg, job(3))

    def broken(*args: object) -> int:
        raise RuntimeError("a bug")
    monkeypatch.setattr(trace, "_open_trace", broken)
    say_for(42, 1, "still logged")
    assert "still logged" in geco_logger.messages()
    assert refused(geco_logger) == [
        "job 42.1: no trace file written: internal error RuntimeError: a bug"]


# ---------------------------------------------------------------------------
# the hooks


@pytest.fixture
def site(tmp_path: Path, cfg: Config, monkeypatch: pytest.MonkeyPatch) -> Config:
    """A site configuration file naming the temporary state and trace directories."""
    conf = tmp_path / "geco.toml"
    conf.write_text(f'[paths]\nstate_dir = "{cfg.state_dir}"\n'
                    f'[log]\ntrace_dir = "{cfg.trace_dir}"\n')
    monkeypatch.setattr(_config, "DEFAULT_PATH", conf)
    # keep these made-up jobs out of the machine's journal (real jobs get ids like 42 too)
    monkeypatch.setattr(log, "journal_socket", lambda: None)
    monkeypatch.setenv("JOB_ID", "42")
    monkeypatch.setenv("SGE_TASK_ID", "undefined")
    return cfg


def test_the_epilog_traces_its_body_and_its_outcome(site: Config,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Given job 42.1's resource file at level 4, when the epilog (job named on its command
    line) runs a body that fails, then the trace holds the body's lines, the error and
    the "finished" line, and the exit code is still 0."""
    save(site, job(4))
    monkeypatch.setattr(sys, "argv", ["epilog", "42", "0"])

    def body(cfg: Config, logger: logging.Logger) -> Exit:
        logger.debug("epilog step")
        raise GecoError("cannot remove the cgroup")
    assert hooks.run("epilog", body, after_the_job=True) == Exit.OK
    got = lines(site.trace_dir / "42.1.trace")
    assert {g["program"] for g in got} == {"geco-epilog"}
    texts = [g["text"] for g in got]
    assert texts[0].endswith(") epilog step")
    assert texts[1] == "geco epilog: cannot remove the cgroup"
    assert re.fullmatch(r"\(__init__\.py:\d+\) epilog finished with exit 0 in [0-9.]+ s "
                        r"\([0-9.]+ s since exec\)", texts[2])


def test_the_starter_traces_from_the_environment(site: Config,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    save(site, job(3))
    monkeypatch.setattr(sys, "argv", ["starter", "/bin/true"])

    def body(cfg: Config, logger: logging.Logger) -> Exit:
        logger.info("starter step")
        return Exit.OK
    assert hooks.run("starter", body) == Exit.OK
    texts = [g["text"] for g in lines(site.trace_dir / "42.1.trace")]
    assert texts[0].endswith(") starter step")


def test_a_refused_trace_never_changes_a_hooks_exit_code(
        site: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    save(site, job(4))
    site.trace_dir.mkdir(parents=True)
    site.trace_dir.chmod(0o777)
    monkeypatch.setattr(sys, "argv", ["epilog", "42", "0"])
    assert hooks.run("epilog", lambda cfg, logger: Exit.OK, after_the_job=True) == Exit.OK
    assert hooks.run("starter", lambda cfg, logger: Exit.JOB_ERROR) == Exit.JOB_ERROR
    assert list(site.trace_dir.iterdir()) == []


def test_a_garbage_resource_file_leaves_the_epilog_untraced(
        site: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    site.resources_dir.mkdir(parents=True)
    (site.resources_dir / "42.1").write_bytes(b"not a resource set")
    monkeypatch.setattr(sys, "argv", ["epilog", "42", "0"])
    assert hooks.run("epilog", lambda cfg, logger: Exit.OK, after_the_job=True) == Exit.OK
    assert not site.trace_dir.exists()


def test_a_body_attaches_the_trace_once_it_knows_the_job(site: Config) -> None:
    """Given a prolog-like body that logs before it knows the job's resources, when it
    calls attach_trace, then the trace starts with what it said before (at the job's
    level), and the trace is detached when the hook ends."""
    seen: list[Path | None] = []

    def body(cfg: Config, logger: logging.Logger) -> Exit:
        logger.debug("asking qstat")
        logger.warning("qstat retried")
        seen.append(hooks.attach_trace(cfg, job(2)))
        seen.append(hooks.attach_trace(cfg, job(4)))  # once only: ignored
        logger.info("not at level 2")
        logger.error("contain failed")
        return Exit.REQUEUE
    assert hooks.run("prolog", body) == Exit.REQUEUE
    path = site.trace_dir / "42.1.trace"
    assert seen == [path, path]
    texts = [g["text"] for g in lines(path)]
    assert texts == ["qstat retried", "job 42.1: the primary group 'nogroup' of owner 'nobody' "
                     "is not theirs alone; its trace file is readable by root only",
                     "contain failed"]
    assert hooks.attach_trace(site, job(4)) is None
    assert log._backlog is None  # the hook keeps no records after it ends
    assert not any(isinstance(h, trace._TraceFile)
                   for h in logging.getLogger("geco").handlers)


# ---------------------------------------------------------------------------
# the prolog's story


class FakeBackend:
    """Just what the prolog asks of a cgroup backend."""

    controllers = ("cpuset", "memory")

    def __init__(self) -> None:
        self.pids: list[int] = []

    def ensure_root(self) -> None:
        pass

    def parent_paths(self) -> dict[str, Path]:
        return {"cpuset": Path("/sys/fs/cgroup/cpuset/GECO")}

    def exists(self, key: str) -> bool:
        return False

    def contains(self, key: str, pid: int) -> bool:
        return pid in self.pids

    def job_keys(self) -> list[JobKey]:
        return [JobKey(7, 1)]

    def read_limits(self, key: str) -> Limits:
        return Limits(cpus="1")

    def available_cpus(self) -> str:
        return "0-1"

    def paths(self, key: str) -> dict[str, Path]:
        return {"cpuset": Path(f"/sys/fs/cgroup/cpuset/GECO/{key}")}

    def add_pid(self, key: str, pid: int) -> None:
        self.pids.append(pid)


@pytest.fixture
def prolog_env(site: Config, monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    """The prolog with Grid Engine, qstat and the cgroups replaced by fakes."""
    from geco import cgroup
    from geco.job import containment
    from geco.sge import execd
    from geco.wire import cluster

    backend = FakeBackend()
    monkeypatch.setattr(sys, "argv", ["prolog", "42", "0"])
    monkeypatch.setattr(execd, "find_shepherd", lambda job: 4242)
    monkeypatch.setattr(cgroup, "for_config", lambda cfg: backend)

    def contain_job(job: execd.JobRef, cfg: Config, backend: FakeBackend, *, pid: int,
                    found: lookup.Found, **kw: object) -> containment.Contained:
        backend.add_pid(job.key, pid)  # the shepherd goes in under the node lock
        node = found.resources.node()
        assert node is not None
        return containment.Contained(Limits(cpus="0", mems="0", memory=node.memory_limit),
                                     True, found)

    monkeypatch.setattr(containment, "contain_job", contain_job)
    # the job's other host answers ready (the barrier has tests of its own: test_multinode*)
    monkeypatch.setattr(cluster, "prepare", lambda rs, cfg, logger: [])
    return backend


def recording(records: Records, body: Callable[[Config, logging.Logger], Exit],
              ) -> Callable[[Config, logging.Logger], Exit]:
    """``body``, with ``records`` added to the ``geco`` logger the hook has just set up."""
    def wrapped(cfg: Config, logger: logging.Logger) -> Exit:
        logging.getLogger("geco").addHandler(records)
        return body(cfg, logger)
    return wrapped


def granted(level: int) -> ResourceSet:
    # root: its group is its own, so its trace is not root-only (no warning to skip here)
    return ResourceSet(42, 1, runtime_limit=1209600.0, trace_level=level, owner="root",
                       job_name="myjob", nodes=(
                           NodeResources(short_hostname(), slots=2, memory_limit=2 << 30),
                           NodeResources("othernode", is_slave=True, slots=2)))


def test_the_prolog_journals_what_it_read_from_qstat_and_traces_every_step(
        site: Config, prolog_env: FakeBackend, monkeypatch: pytest.MonkeyPatch,
        geco_logger: Records) -> None:
    """Given a job at trace level 4 whose resources come from qstat, then the journal gets
    resources-read (owner, slots, memory, h_rt, nodes, source) before job-contained, and
    the trace file holds the debug steps from before the level was known."""
    from geco.hooks import prolog

    def from_qstat(job: object, cfg: Config, logger: logging.Logger) -> lookup.Found:
        logger.debug("qstat -xml -j 42 answered")
        save(cfg, granted(4))
        return lookup.Found(granted(4), "qstat", 0.01)
    monkeypatch.setattr(lookup, "find", from_qstat)
    records = Records()
    assert hooks.run("prolog", recording(records, prolog._body)) == Exit.OK
    events = records.events()
    assert list(events) == ["resources-read", "job-contained", "prolog-done"]
    read = events["resources-read"]
    assert {k: read[k] for k in ("OWNER", "SLOTS", "TOTAL_SLOTS", "NODES", "MEMORY_LIMIT",
                                 "MEMSW_LIMIT", "H_RT", "TRACE_LEVEL", "SOURCE", "JOB_NAME")} == {
        "OWNER": "root", "SLOTS": "2", "TOTAL_SLOTS": "4", "NODES": "2",
        "MEMORY_LIMIT": str(2 << 30), "MEMSW_LIMIT": "0", "H_RT": "1209600", "TRACE_LEVEL": "4",
        "SOURCE": "qstat", "JOB_NAME": "myjob"}
    assert ("job 42.1 (owner root, 'myjob'): 2 slots here of 4 on 2 nodes, memory 2G, "
            "h_rt 1209600 s, trace level 4; read from qstat") in records.messages(logging.INFO)
    texts = [g["text"].split(") ", 1)[1] for g in lines(site.trace_dir / "42.1.trace")]
    assert texts[0] == "job 42.1: parent 4242 is the job's sge_shepherd (spool dir None)"
    assert texts[1].startswith("job 42.1: no saved resources at ")
    assert "qstat -xml -j 42 answered" in texts
    assert "job 42.1: cores geco may use: 0-1; taken by other jobs: 7.1=1" in texts
    assert texts[-1].startswith("prolog finished with exit 0")
    assert prolog_env.pids == [4242]


@pytest.mark.parametrize(("how", "source", "said"), [
    ("file", "file", "read from {path}"),
    ("spool", "spool", "from the execd spool only (qmaster unreachable: no memory limits)")])
def test_the_prolog_says_where_the_resources_came_from(
        site: Config, prolog_env: FakeBackend, monkeypatch: pytest.MonkeyPatch,
        geco_logger: Records, how: str, source: str, said: str) -> None:
    from geco.hooks import prolog

    if how == "file":
        save(site, granted(0))

    def resources(job: object, cfg: Config, logger: logging.Logger) -> lookup.Found:
        if how == "spool":
            logger.warning("qmaster not reachable", extra=log.job_fields(
                42, 1, "degraded-containment"))
        return lookup.Found(granted(0), source, 0.01)
    monkeypatch.setattr(lookup, "find", resources)
    records = Records()
    assert hooks.run("prolog", recording(records, prolog._body)) == Exit.OK
    assert records.events()["resources-read"]["SOURCE"] == source
    text = said.format(path=site.resources_dir / "42.1")
    assert any(m.endswith(f"h_rt 1209600 s; {text}") for m in records.messages(logging.INFO))
    assert not site.trace_dir.exists()


def test_the_trace_directory_is_0755_whatever_the_umask(cfg: Config) -> None:
    """Given root's umask 077 (a hardened node), then the directories geco makes (the
    trace directory and its missing parents) are still 0755, so job owners can reach
    their files in them."""
    old = os.umask(0o077)
    try:
        with trace.for_job(cfg, job(3)) as path:
            pass
    finally:
        os.umask(old)
    assert path is not None
    assert stat.S_IMODE(cfg.trace_dir.stat().st_mode) == 0o755
    assert stat.S_IMODE(cfg.trace_dir.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
