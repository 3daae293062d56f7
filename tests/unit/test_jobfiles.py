"""A job's files on a node, one home (geco/jobfiles.py): where each lives, what its end
forgets, and what gecod's reaper finds left of jobs that are gone."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from geco import jobfiles
from geco.config import Config
from geco.errors import JobKeyError
from geco.jobkey import JobKey
from tests.logkit import RecordingHandler, handler_on

KEY = JobKey(42, 3)


@pytest.fixture
def cfg(tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state", trace_dir=tmp_path / "trace")


def made(path: Path, age: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x\n")
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def every_file(cfg: Config, key: JobKey) -> dict[str, Path]:
    return {"resource file": jobfiles.resource_file(cfg.resources_dir, key),
            "GPU picks": jobfiles.gpu_picks(cfg.resources_dir, key),
            "OOM count": jobfiles.oom_count(cfg.state_dir, key),
            "stuck marker": jobfiles.stuck_marker(cfg.state_dir, key),
            "re-queue count": jobfiles.requeue_count(cfg.state_dir, key),
            "namespace pin": jobfiles.namespace_pin(cfg.state_dir, key),
            "private /tmp": jobfiles.tmp_dir(cfg, key),
            "usage samples": jobfiles.samples(cfg.usage_dir, key),
            "trace": jobfiles.trace(cfg.trace_dir, key)}


def test_each_file_of_a_job_has_one_place_named_by_its_key(cfg: Config) -> None:
    """The places the module's table gives, for a state dir of /var/lib/geco."""
    cfg = cfg._replace(state_dir=Path("/var/lib/geco"), trace_dir=Path("/var/log/geco/trace"))
    assert {what: str(p) for what, p in every_file(cfg, KEY).items()} == {
        "resource file": "/var/lib/geco/resources/42.3",
        "GPU picks": "/var/lib/geco/resources/gpu-picks/42.3",
        "OOM count": "/var/lib/geco/oom/42.3",
        "stuck marker": "/var/lib/geco/stuck/42.3",
        "re-queue count": "/var/lib/geco/health/requeues/42.3",
        "namespace pin": "/var/lib/geco/mntns/42.3",
        "private /tmp": "/var/lib/geco/tmp/42.3",
        "usage samples": "/var/lib/geco/usage/42.3",
        "trace": "/var/log/geco/trace/42.3.trace"}
    assert jobfiles.tmp_dir(cfg._replace(tmp_base="/scratch"), KEY) == Path("/scratch/42.3")


@pytest.mark.parametrize("key", ["../42.3", "42.3/..", "42", "", "42.3\n"])
def test_a_key_that_is_no_job_key_never_reaches_a_path(cfg: Config, key: str) -> None:
    with pytest.raises(JobKeyError):
        jobfiles.oom_count(cfg.state_dir, key)
    with pytest.raises(JobKeyError):
        jobfiles.forget(cfg, key)


def test_forgetting_a_job_removes_what_its_end_leaves_nothing_of_and_keeps_the_rest(
        cfg: Config) -> None:
    """Given every file of job 42.3 and of job 42.4, when 42.3 is forgotten, then its
    resource file, GPU picks, OOM count and stuck marker are gone; its samples and trace
    (its owner reads them after the end) stay, and so does every file of 42.4."""
    mine, other = every_file(cfg, KEY), every_file(cfg, JobKey(42, 4))
    for path in [*mine.values(), *other.values()]:
        made(path)

    assert jobfiles.forget(cfg, KEY)

    gone = {"resource file", "GPU picks", "OOM count", "stuck marker"}
    assert {what for what, p in mine.items() if not p.exists()} == gone
    assert all(p.exists() for p in other.values())
    assert jobfiles.forget(cfg, KEY)  # nothing left is nothing to do


def test_a_file_that_cannot_be_removed_is_named_and_the_others_still_go(
        cfg: Config) -> None:
    """Given a directory where job 42.3's OOM count file belongs, when it is forgotten,
    then the other three are removed, forget says one is left, and one warning names it."""
    files = every_file(cfg, KEY)
    for what in ("resource file", "GPU picks", "stuck marker"):
        made(files[what])
    files["OOM count"].mkdir(parents=True)
    records = RecordingHandler()

    with handler_on("geco.jobfiles", records):
        assert not jobfiles.forget(cfg, KEY)

    assert [what for what in ("resource file", "GPU picks", "stuck marker", "OOM count")
            if files[what].exists()] == ["OOM count"]
    [warning] = records.records
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == ("job 42.3: cannot remove the OOM count file: Is a directory "
                                    f"(errno=EISDIR path={files['OOM count']})")


def test_the_files_kept_are_listed_by_job_with_the_newest_change(cfg: Config) -> None:
    """Given job 42.3's resource file (an hour old) and OOM count (a minute old), job 7.1's
    GPU picks alone, and names that are no job key, then each job is listed once, with
    when its newest file changed; the rest is not looked at."""
    made(jobfiles.resource_file(cfg.resources_dir, KEY), age=3600)
    count = made(jobfiles.oom_count(cfg.state_dir, KEY), age=60)
    picks = made(jobfiles.gpu_picks(cfg.resources_dir, JobKey(7, 1)), age=7200)
    made(cfg.resources_dir / ".42.3.new")
    made(cfg.state_dir / "oom" / "notes")
    made(jobfiles.samples(cfg.usage_dir, JobKey(9, 1)))

    assert jobfiles.kept(cfg) == {KEY: count.stat().st_mtime,
                                  JobKey(7, 1): picks.stat().st_mtime}
    assert jobfiles.kept(Config(state_dir=cfg.state_dir / "none")) == {}
