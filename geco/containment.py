"""Make and unmake one job's cgroups on this node.

:func:`contain` turns a job's record for this host into cgroups: it picks
whole cores (packed by :mod:`geco.cores` on the hwloc topology), sets the
memory limits, and creates the cgroups in every managed controller.
:func:`release` is the other half: freeze, kill, thaw, wait until empty,
remove (the epilog and gecod's reaper go through :mod:`geco.teardown`, which
adds the journal record and the escalation when a process does not die).

Core choice needs a node-wide lock: two prologs starting at the same moment
would otherwise both see the same cores as free. The allocator's state is
never kept in memory; it is read back from the job cpusets under the lock,
so it survives any restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from geco import cores, log
from geco.cgroup import Backend, Limits
from geco.errors import GecoError
from geco.resource import NodeResources
from geco.topology import Topology, format_cpulist, parse_cpulist

__all__ = ["Release", "contain", "kill_and_remove", "read_usage", "release"]

_log = log.get("containment")


@contextlib.contextmanager
def _node_lock(state_dir: Path) -> Iterator[None]:
    """Hold the node-wide allocation lock (an flock, released even if we crash)."""
    state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(state_dir / "cores.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _drop_stale(backend: Backend, active_jobs: Path | None, keep: str) -> None:
    """Remove empty job cgroups whose job no longer runs here, so their cores come back.

    Only empty ones: a cgroup with processes left is the reaper's business,
    and its cores stay busy until it is clean.
    """
    if active_jobs is None or not active_jobs.is_dir():
        return
    for key in backend.job_keys():
        if key == keep or (active_jobs / key).exists() or backend.pids(key):
            continue
        try:
            backend.destroy(key)
            job, _, task = key.partition(".")
            _log.info("removed stale empty cgroup %s", key,
                      extra=log.job_fields(job, task, "stale-cgroup-removed"))
        except GecoError as exc:
            _log.warning("cannot remove stale cgroup %s: %s", key, exc)


def contain(key: str, node: NodeResources, backend: Backend, *, state_dir: Path,
            hardware_threads: bool = False, topology: Topology | None = None,
            active_jobs: Path | None = None) -> Limits:
    """Create the job's cgroups for this node's share and return the limits applied.

    Idempotent: when the job's cgroups already exist (made by an earlier hook
    or by gecod), their limits are returned unchanged and no cores are taken.

    Parameters
    ----------
    key: ``<job>.<task>``.
    node: the job's record for this host (slots, memory limits).
    backend: the cgroup backend of this host.
    state_dir: where the node lock lives.
    hardware_threads: one slot = one hardware thread instead of one whole core.
    topology: the host topology (default: loaded through hwloc).
    active_jobs: the execd's ``active_jobs`` dir, to recognise stale cgroups.

    Raises
    ------
    CoresUnavailable
        when this node has fewer free cores than the job's slots here.
    CgroupError
        when the kernel refuses a cgroup operation.
    """
    with _node_lock(state_dir):
        if backend.exists(key):
            try:
                return backend.read_limits(key)
            except GecoError as exc:
                # half made (a crash between two mkdirs): nothing can run in it yet
                # unless it has pids, so start it over; with pids, let the error stand
                if backend.pids(key):
                    raise
                _log.warning("job %s: rebuilding incomplete cgroups (%s)", key, exc)
                backend.destroy(key)
        _drop_stale(backend, active_jobs, keep=key)
        busy = cores.busy_from_cpusets(backend.read_limits(k).cpus for k in backend.job_keys())
        allowed = parse_cpulist(backend.available_cpus())
        topo = topology or Topology.load()
        chosen = cores.allocate(topo, node.slots, busy_pus=busy, allowed_pus=allowed,
                                hardware_threads=hardware_threads)
        limits = Limits(cpus=format_cpulist(chosen.cpus), mems=format_cpulist(chosen.mems),
                        memory=node.memory_limit, memory_swap=node.vmem_limit)
        backend.create(key, limits)
        return limits


@dataclass(frozen=True, slots=True)
class Release:
    """What the teardown of one job's cgroups found and did."""

    killed: int
    remaining: tuple[int, ...]
    usage: dict[str, int]

    @property
    def clean(self) -> bool:
        """True when the cgroups are gone."""
        return not self.remaining


def read_usage(key: str, backend: Backend) -> dict[str, int]:
    """Return the job's accounting counters (see :meth:`Backend.usage`), ``{}`` when unreadable.

    Read them before :func:`kill_and_remove`: removing the cgroups removes
    the counters with them.
    """
    try:
        return backend.usage(key)
    except GecoError as exc:  # a half-made cgroup has no counters; teardown still runs
        _log.debug("job %s: no usage figures: %s", key, exc)
        return {}


def kill_and_remove(key: str, backend: Backend, *, timeout: float) -> tuple[int, tuple[int, ...]]:
    """SIGKILL everything in the job's cgroups (sub-cgroups included), wait, remove them.

    The backend freezes the cgroup so nothing can fork while it is being
    killed, SIGKILLs every member and thaws so the kills are delivered; then
    we wait for the cgroup to empty within ``timeout`` seconds and remove it.

    Returns
    -------
    (processes signalled, pids left): the cgroups are removed exactly when no
    pid is left; a cgroup that does not empty is kept, never silently leaked.

    Raises
    ------
    CgroupError
        when the kernel refuses a read, a write or the removal.
    """
    # kill() freezes first on its own (best effort: a missing freezer or a process
    # stuck in D must not stop the SIGKILLs), so nothing can fork away meanwhile
    killed = backend.kill(key)
    if not backend.wait_empty(key, timeout):
        return killed, tuple(backend.pids(key))
    backend.destroy(key)
    return killed, ()


def release(key: str, backend: Backend, *, timeout: float) -> Release:
    """Kill everything left in a job's cgroups and remove them (see :func:`kill_and_remove`).

    The usage counters are read first, while the cgroups still exist. A job
    without cgroups is a clean release of nothing.

    Raises
    ------
    CgroupError
        as :func:`kill_and_remove`.
    """
    if not backend.exists(key):
        return Release(0, (), {})
    usage = read_usage(key, backend)
    killed, remaining = kill_and_remove(key, backend, timeout=timeout)
    return Release(killed, remaining, usage)
