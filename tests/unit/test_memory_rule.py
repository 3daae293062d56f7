"""Nothing unlimited: the node's memory for a job that requests none ([cgroup]
memory_per_slot, vmem_per_slot), what the owner reads when such a job is OOM-killed, and
the reserve of RAM kept for the node's own daemons ([cgroup] memory_reserve).

A real job under the default, on the real Grid Engine: tests/integration/test_memory_default.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from geco import config
from geco.jobkey import JobKey
from geco.node.limits import MemoryDefault
from geco.oom.message import RequestHint, owner_message
from geco.oom.watch import OomEvent
from geco.resourceset import NodeResources

M, G = 1 << 20, 1 << 30


def test_memory_sizes_are_read_as_grid_engine_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[cgroup]\nmemory_per_slot = "2G"\nvmem_per_slot = "3000M"\n'
                    "memory_reserve = 1048576\n")
    cfg = config.load(path)
    assert (cfg.memory_per_slot, cfg.vmem_per_slot, cfg.memory_reserve) == (2 * G, 3000 * M, M)
    assert MemoryDefault.from_config(cfg) == MemoryDefault(2 * G, 3000 * M)
    assert (config.Config().memory_per_slot, config.Config().memory_reserve) == (0, 0)


def test_a_memory_size_that_is_none_is_logged_and_the_default_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[cgroup]\nmemory_per_slot = "lots"\n')
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert cfg.memory_per_slot == 0
    assert caplog.messages == [f'config {path}: cgroup.memory_per_slot must be a memory size '
                               "such as \"2G\" or \"512M\" (0 = none), got 'lots'; using the "
                               "default 0"]


@pytest.mark.parametrize(("node", "expected"), [
    # no request: the default x the slots here
    (NodeResources("n1", slots=3), (3 * G, 6 * G)),
    # a request of either kind is kept as it is: a default beside it would cap it
    (NodeResources("n1", slots=3, memory_limit=M), (M, 0)),
    (NodeResources("n1", slots=3, vmem_limit=8 * G), (0, 8 * G)),
    # a record with no slots here still gets one slot's worth, never "0 = none"
    (NodeResources("n1", slots=0), (G, 2 * G)),
])
def test_a_job_that_requests_no_memory_gets_the_default_per_slot(
        node: NodeResources, expected: tuple[int, int]) -> None:
    got = MemoryDefault(G, 2 * G).applied(node)
    assert (got.memory_limit, got.vmem_limit) == expected
    assert MemoryDefault().applied(NodeResources("n1", slots=3)) == NodeResources("n1", slots=3)


def test_the_owner_of_a_job_without_a_request_reads_the_default_and_what_to_request() -> None:
    """Given a 2-slot job that requested no memory, killed at the node's default of 200M per
    slot with a peak of 400M, then the owner reads that the node's default stopped it (not
    'more than it requested'), the default per slot, and an m_mem_free to resubmit with."""
    event = OomEvent(JobKey(42, 1), "node7", 400 * M, 400 * M, pid=31, command="python3")
    text = owner_message(event, RequestHint(slots=2, is_array=False))
    assert text == ("geco: job 42 on node node7 used more memory than this node gives a job "
                    "that requests none, and the kernel stopped process 31 (python3). Memory "
                    "limit: 400M (the node's default: 200M per slot x 2 slots); peak use: "
                    "400M. Resubmit with a memory request, for example -l m_mem_free=300M.")
