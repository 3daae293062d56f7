"""Issue 37, point 2: a grant the node can never meet fails once, as the job's own fault.

An RSMAP grant of a GPU id that names no GPU of the node (Open Cluster Scheduler granted
``gpuZ``; the node's GPUs are device nodes with NVIDIA's numbers in ``[gpu] devices``):
the real prolog, on real v1 cgroups, contains the job with no GPU (never refused, or Grid
Engine would start it again and again) and exits 100 with one sentence, so Grid Engine
holds the job in error once; the node does not count it against itself (its health
streak stays empty: one job's grant never takes a node out).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from geco import config as _config
from geco.cgroup import V1Backend, find_hierarchies, parse_mountinfo
from geco.config import Config
from geco.hooks import Exit, prolog, run
from geco.jobkey import JobKey
from geco.node import health
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.sge import resourcefile
from geco.sge.execd import JobRef
from geco.sge.lookup import Found
from tests.cgroup_testkit import Child, open_verdicts, usable_v1_hierarchies, v1_backend, verdicts

MOUNTED = find_hierarchies(parse_mountinfo(Path("/proc/self/mountinfo").read_bytes()),
                           Path("/sys/fs/cgroup"))
HIER, WHY_NOT = usable_v1_hierarchies(MOUNTED)
pytestmark = [pytest.mark.root, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT),
              pytest.mark.usefixtures("restored_geco_logger")]
HOST = short_hostname()
KEY = JobKey(71, 1)


@pytest.fixture
def backend() -> Iterator[V1Backend]:
    with v1_backend(HIER, exclusive_cpus=False) as made:
        yield made


def test_a_grant_of_a_gpu_the_node_lacks_holds_the_job_once_and_never_counts_against_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: V1Backend,
        children: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    """Given a job granted GPU gpuZ on a node whose GPUs are 0 and 1, when its prolog runs,
    then it exits 100 (held in error) with one sentence naming gpuZ and the node's GPUs,
    its shepherd is in the job's cgroups with both GPUs denied, and the node's failure
    streak stays empty."""
    devices = [str(tmp_path / "gpu0"), str(tmp_path / "gpu1")]
    for path, minor in zip(devices, (0, 1), strict=True):
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(195, minor))
    site = tmp_path / "geco.toml"
    site.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                    f'[gpu]\ndevices = {devices!r}\n'.replace("'", '"'))
    monkeypatch.setattr(_config, "DEFAULT_PATH", site)
    rs = ResourceSet(KEY.job, KEY.task, owner="ocsuser",
                     nodes=(NodeResources(HOST, slots=1, gpus="gpuZ"),))
    resourcefile.write(_config.load(site).resources_dir, rs)  # as qstat's lookup saves it
    shepherd = Child(open_verdicts({"gpu0": devices[0], "gpu1": devices[1]}), children)

    def body(cfg: Config, logger: prolog.log.Logger) -> Exit:
        return prolog.contain(JobRef(KEY.job, KEY.task, None), shepherd.pid, os.getpid(), cfg,
                              logger, backend, Found(rs, "qstat", 0.0))

    assert run("prolog", body) == Exit.JOB_ERROR
    # the containment says it contained the job with no GPU; the prolog, its outcome, once
    said = [line.split("|ERROR]: ", 1)[1] for line in capsys.readouterr().err.splitlines()
            if "|ERROR]: geco prolog: " in line]
    assert len(said) == 1, said
    last = said[0]
    assert last.startswith("geco prolog: Grid Engine granted GPU 'gpuZ', but it names no GPU "
                           "here"), last
    assert f"0={devices[0]}, 1={devices[1]}" in last and last.endswith(
        "; the job is put in error state"), last
    assert backend.contains(KEY, shepherd.pid)
    shepherd.go()
    seen = verdicts(shepherd)
    assert (seen["gpu0"], seen["gpu1"]) == ("EPERM", "EPERM"), seen
    cfg = _config.load(site)
    assert health.describe(cfg) == "no failure to contain a job since the last one contained"
