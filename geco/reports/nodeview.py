"""What this node gives jobs: the resource picture ``geco check`` prints.

One line each for the cores jobs are bound to (the GECO parent's less ``[cgroup]
cpus_reserve``), the memory all jobs together may use (the RAM less ``[cgroup]
memory_reserve``), the default for a job that requests no memory, and the GPUs with
their devices, so an admin sees at a glance what a job here can get and what it can
never get, as the configuration and the kernel say it; and how the kernel moves a
process into its job (``favordynmods``: README, "Busy nodes").
"""

from __future__ import annotations

import os
from pathlib import Path

from geco import procfs
from geco.cgroup import Backend, favors_dynmods, parse_mountinfo
from geco.config import Config
from geco.cpulist import format_cpulist, parse_cpulist
from geco.errors import GecoError
from geco.node import gpus, health
from geco.node.limits import MemoryDefault, jobs_memory
from geco.units import format_memory

__all__ = ["lines"]


def lines(cfg: Config, backend: Backend, proc: Path = procfs.ROOT) -> list[tuple[str, str]]:
    """``(what, text)`` for cores, memory, the default, the GPUs, the kernel's moves, the
    jobs' private /tmp, gecod's Prometheus endpoint and the node's health."""
    from geco.daemon import metrics  # its one line; prometheus_client only when listening
    from geco.job import privatetmp

    return [("cores", _cores(cfg, backend)), ("memory", _memory(cfg)),
            ("default", _default(cfg)), ("gpus", _gpus(cfg)), ("moves", _moves(proc)),
            ("tmp", privatetmp.describe(cfg)), ("metrics", metrics.describe(cfg)),
            ("health", health.describe(cfg))]


def _cores(cfg: Config, backend: Backend) -> str:
    try:
        parent = parse_cpulist(backend.available_cpus())
    except GecoError:  # no job has run yet: the GECO parent gets the root's cpus then
        parent = frozenset(os.sched_getaffinity(0))
    reserved = parse_cpulist(cfg.cpus_reserve) & parent
    jobs = parent - reserved
    kept = (f"cpus {format_cpulist(reserved)} kept for the node's daemons ([cgroup] "
            "cpus_reserve)") if reserved else "none kept back ([cgroup] cpus_reserve)"
    return f"cpus {format_cpulist(jobs) or 'none'} for jobs ({len(jobs)}); {kept}"


def _memory(cfg: Config) -> str:
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if not cfg.memory_reserve:
        return (f"all jobs together may use the node's RAM, {format_memory(ram)}; none "
                "kept back ([cgroup] memory_reserve)")
    return (f"all jobs together may use {format_memory(jobs_memory(cfg.memory_reserve))}: "
            f"the node's RAM, {format_memory(ram)}, less {format_memory(cfg.memory_reserve)} "
            "kept for its daemons ([cgroup] memory_reserve)")


def _default(cfg: Config) -> str:
    given = MemoryDefault.booked(cfg)
    where = "[cgroup] memory_per_slot, vmem_per_slot"
    if not (cfg.memory_per_slot and cfg.vmem_per_slot):
        where += "; else the memory complexes' defaults, qconf -sc"
    if not (given.per_slot or given.vmem_per_slot):
        return f"a job that requests no memory runs with no memory limit ({where})"
    return (f"a job that requests no memory gets RAM {_per_slot(given.per_slot)}, "
            f"RAM+swap {_per_slot(given.vmem_per_slot)} ({where})")


def _moves(proc: Path) -> str:
    if favors_dynmods(parse_mountinfo((proc / "self" / "mountinfo").read_bytes())):
        return ("favordynmods: the kernel moves a process into its job at once, also after "
                "a quiet moment (forks and exits pay a little for it)")
    return ("the kernel's default: after a quiet moment, the first process moved into a job "
            "waits for an RCU grace period (milliseconds) and those behind it too; a node "
            "that starts many processes a second wants favordynmods (README: Busy nodes)")


def _per_slot(n: int) -> str:
    return f"{format_memory(n)} per slot" if n else "unlimited"


def _gpus(cfg: Config) -> str:
    try:
        table = gpus.node_table(cfg.gpu_devices)
    except GecoError as exc:
        return f"unusable: {exc}"
    if not table:
        return ("none (no NVIDIA driver table, /dev/nvidia<N> or [gpu] devices): jobs are "
                "refused every NVIDIA device (c 195:*) and MIG capability by a process "
                "that may set device rules (CAP_SYS_ADMIN)")
    listed = ", ".join(f"{g.id} = {g.path} (c {g.major}:{g.minor}"
                       f"{f', NUMA {g.numa}' if g.numa >= 0 else ''})" for g in table)
    return (f"{len(table)}, each job opens only those Grid Engine granted it "
            f"([gpu] complex {cfg.gpu_complex}): {listed}")
