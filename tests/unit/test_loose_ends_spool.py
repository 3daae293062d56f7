"""Issue 37, point 4: a job's spool directory is looked up on this host's spool only
(geco.sge.execd.find_spool_dir), also where hosts share one spool file system."""

from __future__ import annotations

from pathlib import Path

from geco.jobkey import JobKey
from geco.sge.execd import find_spool_dir


def _spool(root: Path, host: str, key: str) -> Path:
    path = root / host / "active_jobs" / key
    path.mkdir(parents=True)
    return path


def test_another_hosts_spool_of_the_same_job_number_is_never_this_hosts(
        tmp_path: Path) -> None:
    """Given two hosts' spools side by side, each with a job 5.1, then each host finds its
    own; a host with none there finds none (not its neighbour's)."""
    mine, theirs = _spool(tmp_path, "node1", "5.1"), _spool(tmp_path, "node2", "5.1")
    _spool(tmp_path, "node2", "6.1")
    assert find_spool_dir(tmp_path, JobKey(5, 1), "node1") == mine
    assert find_spool_dir(tmp_path, JobKey(5, 1), "node2") == theirs
    assert find_spool_dir(tmp_path, JobKey(6, 1), "node1") is None
    assert find_spool_dir(tmp_path, JobKey(5, 1), "node3") is None


def test_this_host_spelled_with_its_domain_or_in_capitals_is_still_found(
        tmp_path: Path) -> None:
    """Given Grid Engine spelling this host with its domain (or in capitals), then its
    spool is found under that name; a host whose name only begins the same is not."""
    fqdn = _spool(tmp_path, "node1.cluster.example", "7.1")
    _spool(tmp_path, "node10", "8.1")
    assert find_spool_dir(tmp_path, JobKey(7, 1), "node1") == fqdn
    assert find_spool_dir(tmp_path, JobKey(7, 1), "NODE1") == fqdn
    assert find_spool_dir(tmp_path, JobKey(8, 1), "node1") is None
