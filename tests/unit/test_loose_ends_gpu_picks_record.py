"""Issue 37, point 3: when the record of a job's GPU picks is put back, and when it is not.

:func:`geco.sge.resourcefile.rewrite` writes a set Grid Engine gave anew (qstat knows a Son of
Grid Engine job's GPU count, not which GPUs geco picked) with the picks put back from their
record (:mod:`geco.sge.gpupicks`) -- only when that record is this job's, on this host, for
the same count; otherwise nothing is made up and, for a job that holds its GPUs already, a
warning says why. Real files in ``tmp_path``; the containment and the reaper on real cgroups
are ``tests/system/test_loose_ends_gpu_picks.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from geco import jobfiles
from geco.config import Config
from geco.errors import GecoError
from geco.gpushare import parse_share
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import gpupicks, resourcefile
from tests.logkit import RecordingHandler, handler_on

KEY = JobKey(42, 3)
SUBMITTED = 1795303085.311469


def granted(gpus: str, host: str = "n001", submitted: float = SUBMITTED) -> ResourceSet:
    return ResourceSet(KEY.job, KEY.task, submitted=submitted,
                       nodes=(NodeResources("n000", slots=2, gpus="count:2"),
                              NodeResources(host, is_slave=True, slots=1, gpus=gpus)))


class Events(RecordingHandler):
    """The journal events the geco loggers record."""

    def __contains__(self, event: object) -> bool:
        return any(getattr(r, "geco_fields", {}).get("GECO_EVENT") == event
                   for r in self.records)


@pytest.fixture
def events() -> Iterator[Events]:
    handler = Events()
    with handler_on("geco", handler):
        yield handler


def on_record(tmp_path: Path) -> str:
    rs = resourcefile.read(tmp_path, KEY)
    assert rs is not None
    assert rs.nodes[0].gpus == "count:2"  # another host's record is never touched
    return rs.nodes[1].gpus


def test_the_picks_are_put_back_beside_the_same_count_of_this_job_on_this_host(
        tmp_path: Path, events: Events) -> None:
    gpupicks.save(tmp_path, granted("count:2"), "n001.cluster", parse_share("count:2=1,3"))

    written = resourcefile.rewrite(tmp_path, granted("count:2"), "n001", contained=True)

    assert on_record(tmp_path) == written.nodes[1].gpus == "count:2=1,3"
    assert "gpu-picks-kept" in events and "gpu-picks-unknown" not in events


@pytest.mark.parametrize(("saved_for", "why"), [
    (granted("count:1"), "Grid Engine counts 2 GPU(s) here, the record of them count:1=1"),
    (granted("count:2", submitted=SUBMITTED - 86400),
     "the record of them is an earlier job's of that number"),
    (granted("count:2", host="n009"), "the record of them is n009's, not n001's"),
], ids=["another-count", "an-earlier-job", "another-host"])
def test_a_record_that_is_not_this_jobs_here_puts_nothing_back_and_says_why(
        tmp_path: Path, saved_for: ResourceSet, why: str) -> None:
    node = saved_for.nodes[1]
    share = parse_share(node.gpus)
    gpupicks.save(tmp_path, saved_for, node.name, share._replace(ids=(1, 2)[:share.amount]))

    kept, lost = gpupicks.kept(tmp_path, granted("count:2"), "n001", contained=True)

    assert kept == granted("count:2")
    assert lost == why


def test_ids_grid_engine_granted_itself_and_a_job_not_contained_yet_are_left_alone(
        tmp_path: Path, events: Events) -> None:
    """An RSMAP's ids are Grid Engine's own (mapped again at every read); a job not yet
    contained has no picks to lose: neither is a warning."""
    resourcefile.rewrite(tmp_path, granted("0,1"), "n001", contained=True)
    assert on_record(tmp_path) == "0,1"
    resourcefile.rewrite(tmp_path, granted("count:2"), "n001")
    assert on_record(tmp_path) == "count:2"
    assert "gpu-picks-unknown" not in events and "gpu-picks-kept" not in events


def test_a_host_name_that_could_not_be_read_back_is_refused_in_one_sentence(
        tmp_path: Path) -> None:
    with pytest.raises(GecoError) as err:
        gpupicks.save(tmp_path, granted("count:1"), "n001 gpus=count:1=0",
                      parse_share("count:1=1"))
    assert str(err.value) == ("cannot record the GPUs picked for job 42.3 on "
                              "'n001 gpus=count:1=0': count:1=1 on a host so named is not a "
                              "record geco can read back")
    assert not jobfiles.gpu_picks(tmp_path, KEY).exists()


def test_removing_the_resource_file_removes_the_record_and_a_record_alone_is_listed(
        tmp_path: Path) -> None:
    cfg = Config(state_dir=tmp_path)
    resourcefile.write(cfg.resources_dir, granted("count:2"))
    gpupicks.save(cfg.resources_dir, granted("count:2"), "n001", parse_share("count:2=0,1"))
    jobfiles.resource_file(cfg.resources_dir, KEY).unlink()
    assert list(jobfiles.kept(cfg)) == [KEY]

    resourcefile.write(cfg.resources_dir, granted("count:2"))
    assert resourcefile.remove(cfg.resources_dir, KEY)

    assert not jobfiles.gpu_picks(cfg.resources_dir, KEY).exists()
    assert jobfiles.kept(cfg) == {}
