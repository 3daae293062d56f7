"""geco.job.gpufds's decisions that need no process: nothing held, an owner nobody names.

The look itself (real processes holding a GPU fd handed over through a socket, the time
budget running out) is in tests/system/test_teardown.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from geco.cgroup import Backend
from geco.config import Config
from geco.job import gpufds
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from tests.logkit import RecordingHandler, handler_on


class Untouched:
    """A backend no step may ask anything: the decision came before the look."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the backend was asked for {name}")


def test_a_job_that_held_no_gpu_looks_at_nothing(tmp_path: Path) -> None:
    cfg = Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool")
    assert gpufds.revoke(cfg, cast(Backend, Untouched()), JobKey(5, 1), (), None) == \
        gpufds.Revoked()


def test_a_job_whose_owner_nobody_names_is_journaled_unchecked_and_nothing_is_killed(
        tmp_path: Path) -> None:
    """Given a job that held GPU 1 whose resource file names no owner and no spool dir,
    then whose other jobs to look in is not known: gpu-fds-unchecked (an error) names the
    job, its GPU and why; no process is looked at or killed."""
    cfg = Config(state_dir=tmp_path / "state", execd_spool_dir=tmp_path / "spool")
    resourcefile.write(cfg.resources_dir, ResourceSet(
        5, 1, nodes=(NodeResources(short_hostname(), gpus="1"),)))
    records = RecordingHandler()
    with handler_on("geco.job.gpufds", records):
        result = gpufds.revoke(cfg, cast(Backend, Untouched()), JobKey(5, 1), (1,), None)

    assert result == gpufds.Revoked(complete=False)
    [record] = records.records
    assert (record.levelname, record.getMessage()) == (
        "ERROR", "job 5.1 ended, but whether processes of its owner's other jobs here hold "
                 "its GPU 1 open is not known: its owner is unknown")
    assert getattr(record, "geco_fields", {}) == {
        "JOB_ID": "5", "SGE_TASK_ID": "1", "GECO_EVENT": "gpu-fds-unchecked", "GPUS": "1",
        "REASON": "its owner is unknown"}
