"""Render a ResourceSet for people and scripts: text, json, shell, v1.

The shell form keeps the original ``geco-rsrcinfo`` variable names
(``SGE_RESOURCE_HOSTS``, ``SGE_RESOURCE_NSLOTS``, ... as bash arrays with one
entry per node, plus ``SGE_RESOURCE_JOB_*`` scalars), because site scripts
``eval`` that output. The JSON form is the documented contract of
``geco rsrcinfo --format json`` (memory in bytes, times in seconds).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from geco.resourceset import ResourceSet
from geco.sge import v1format
from geco.units import format_memory

__all__ = ["FORMATS", "render", "to_dict"]


def to_dict(rs: ResourceSet) -> dict[str, object]:
    """Return the JSON contract's mapping of ``rs``."""
    return {
        "job_id": rs.job_id, "task_id": rs.task_id, "job_name": rs.job_name,
        "owner": rs.owner, "group": rs.group, "cwd": rs.cwd,
        "runtime_limit": rs.runtime_limit, "is_standby": rs.is_standby,
        "per_slot_vmem": rs.per_slot_vmem, "trace_level": rs.trace_level,
        "is_array": rs.is_array, "phi_for_user": rs.phi_for_user,
        "nodes": [{"name": n.name, "is_slave": n.is_slave, "slots": n.slots,
                   "memory_limit": n.memory_limit, "vmem_limit": n.vmem_limit,
                   "gpus": n.gpus, "phis": n.phis} for n in rs.nodes],
    }


def _json(rs: ResourceSet) -> bytes:
    return (json.dumps(to_dict(rs), indent=2) + "\n").encode()


def _q(value: object) -> str:
    text = str(int(value) if isinstance(value, bool) else value)
    return shlex.quote(text)


def _shell(rs: ResourceSet) -> bytes:
    scalars = {"JOB_ID": rs.job_id, "TASK_ID": rs.task_id, "JOB_NAME": rs.job_name,
               "JOB_OWNER": rs.owner, "JOB_GROUP": rs.group, "JOB_CWD": rs.cwd,
               "JOB_MAXRT": rs.runtime_limit, "JOB_IS_STANDBY": rs.is_standby,
               "JOB_VMEM": rs.per_slot_vmem, "JOB_TRACELEVEL": rs.trace_level,
               "JOB_IS_ARRAY": rs.is_array, "JOB_CONFIG_PHI_FOR_USER": rs.phi_for_user}
    arrays: dict[str, list[object]] = {
        "HOSTS": [n.name for n in rs.nodes], "NSLOTS": [n.slots for n in rs.nodes],
        "MEM": [n.memory_limit for n in rs.nodes], "VMEM": [n.vmem_limit for n in rs.nodes],
        "GPU": [n.gpus for n in rs.nodes], "PHI": [n.phis for n in rs.nodes]}
    lines = [f"SGE_RESOURCE_{k}={_q(v)}" for k, v in scalars.items()]
    lines += [f"SGE_RESOURCE_{k}=({' '.join(_q(x) for x in v)})" for k, v in arrays.items()]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _limit(n: int) -> str:
    return format_memory(n) if n else "none"


def _text(rs: ResourceSet) -> bytes:
    flags = [name for name, on in (("array", rs.is_array), ("standby", rs.is_standby),
                                   ("phi-for-user", rs.phi_for_user)) if on]
    lines = [
        f"job {rs.key} {rs.job_name!r} of {rs.owner}:{rs.group}",
        f"  cwd {rs.cwd or '(home directory)'}",
        f"  runtime limit {f'{rs.runtime_limit:g} s' if rs.runtime_limit else 'none'}, "
        f"h_vmem per slot {_limit(rs.per_slot_vmem)}, trace level {rs.trace_level}"
        + (f", {', '.join(flags)}" if flags else ""),
    ]
    for n in rs.nodes:
        role = "slave " if n.is_slave else "master"
        extra = "".join(f", {k} {v}" for k, v in (("gpus", n.gpus), ("phis", n.phis)) if v)
        lines.append(f"  {role} {n.name}: {n.slots} slot(s), memory {_limit(n.memory_limit)}, "
                     f"memory+swap {_limit(n.vmem_limit)}{extra}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _v1(rs: ResourceSet) -> bytes:
    return v1format.serialize(rs) + b"\n"


FORMATS: dict[str, Callable[[ResourceSet], bytes]] = {
    "text": _text, "json": _json, "shell": _shell, "v1": _v1}


def render(rs: ResourceSet, fmt: str) -> bytes:
    """Return ``rs`` in one of :data:`FORMATS` (raises KeyError for another name)."""
    return FORMATS[fmt](rs)
