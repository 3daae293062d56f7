"""The differential suite with private /tmp on: the same job gives the same result.

Grid Engine alone is the oracle. Each case of the differential suite's batch jobs
(tests/integration/samecases.py: shells, directives, -v/-V, the environment,
arrays, -now y, a -pe job's `qrsh -inherit` tasks) first runs in ``geco-test-plain.q``
(no hook of geco's) while the node has no private /tmp; then [tmp] private is switched
on and the same case runs in ``geco-test-same.q`` (geco's starter, the preload, gecod):
its output files, accounting, qsub's exit code and queue state must be those of the run
without. What private /tmp changes (README, "A private /tmp for every job") no case
looks at: the node's /tmp as another job left it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.livekit import site_settings
from tests.integration.samecases import BATCH, queues_with_scripts
from tests.integration.samekit import GECO, PLAIN, Batch, Outcome, Same, assert_same

pytestmark = pytest.mark.sge

CASES: dict[str, Batch] = {
    **BATCH,
    "pe-qrsh-inherit": Batch(("-cwd", "-N", "mpi", "-pe", "mpi", "2", "mpi.sh")),
}


@pytest.fixture(scope="module")
def same(sge: Any, gecod: Any, job_owner: Any) -> Iterator[Same]:
    """Both queues, gecod serving and sge_execd with the preload, the suite's scripts."""
    with queues_with_scripts(sge, job_owner, "private-tmp-same") as kit:
        yield kit


@pytest.fixture(scope="module")
def without(same: Same) -> dict[str, Outcome]:
    """Every case's outcome in the plain queue, no private /tmp on the node."""
    same.enable()
    results = {}
    for name, case in CASES.items():
        same.wait_idle()
        results[name] = same.batch(PLAIN, case, 90)
    return results


@pytest.fixture(scope="module")
def private_tmp(without: dict[str, Outcome], gecod: Any) -> Iterator[None]:
    with site_settings({("tmp", "private"): True}, gecod):
        yield


@pytest.mark.parametrize("name", CASES)
def test_a_batch_job_with_private_tmp_gives_the_same_result_as_grid_engine_alone(
        same: Same, without: dict[str, Outcome], private_tmp: None, name: str) -> None:
    """Given a case run by Grid Engine alone without private /tmp, when it runs in geco's
    queue with [tmp] private on, then its output files, accounting, qsub's exit code and
    the queue instance's state are the same."""
    case = CASES[name]
    same.enable()
    same.wait_idle()
    assert_same({GECO: same.batch(GECO, case, 90), PLAIN: without[name]},
                f"qsub {' '.join(case.args)} (private /tmp)", case.worked)
