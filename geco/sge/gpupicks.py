"""The GPU ids geco picked for a job, kept beside its resource file.

The record is ``<state_dir>/resources/gpu-picks/<job>.<task>``.

Son of Grid Engine only counts a job's GPUs (``"count:2"``); which ones it holds on a node is
geco's pick (:func:`geco.node.gpus.pick`), known to no one but this node's resource file
(``"count:2=1,3"``). A resource file that turns unusable is written anew from Grid Engine
(:func:`geco.sge.resourcefile.rewrite`), which knows the count only: the picks would be lost,
and the job's later tasks, ``geco status``, its OOM and end records, and the next job's pick
(which could be given the same GPU) would go wrong. So the containment that picks also saves
them here, under the node lock, and a rewrite takes them back (:func:`kept`).

Not the kernel's record instead: the job's cgroup denies the other GPUs, but cgroup v1's
``devices.list`` of a cgroup that allows all but some shows ``a *:* rwm`` only, and a v2 device
program is not read back.

One line per file, written atomically: ``geco-gpu-picks-v1 host=<name> gpus=count:<n>=<ids>
submitted=<seconds>`` (the node record's name and GPU list, and which job of its number it is:
0 when not known). The record goes with the resource file
(:func:`geco.sge.resourcefile.remove`), and gecod's reaper prunes one left without it.
"""

from __future__ import annotations

import re
from pathlib import Path

from geco import atomicfile, gpushare, jobfiles, log
from geco._tuple import NamedTuple
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.resourceset import ResourceSet, short_hostname

__all__ = ["Picks", "kept", "load", "remove", "save"]

_MAGIC = "geco-gpu-picks-v1"
_LINE = re.compile(_MAGIC + r" host=(\S+) gpus=(count:[0-9]+=[0-9,]+) submitted=([0-9.]+)\n")
_MODE = 0o644  # what the resource file says too, and as readable


class Picks(NamedTuple):
    """One job's picks on one node.

    Attributes
    ----------
    host: the node's name as the job's resource set spells it.
    share: the count and the ids picked for it.
    submitted: when the job was submitted (seconds since the epoch), 0 when not known.
    """

    host: str
    share: gpushare.Share
    submitted: float = 0.0


def save(resources_dir: Path, rs: ResourceSet, host: str, share: gpushare.Share) -> None:
    """Record ``share`` (a count with the ids picked for it) as job ``rs``'s on ``host``.

    Raises
    ------
    GecoError
        when it cannot be written (nothing half-written is left).
    """
    stamp = log.submitted_text(rs.submitted) if 0 <= rs.submitted < 1e15 else "0"
    line = f"{_MAGIC} host={host} gpus={share} submitted={stamp}\n"
    if _LINE.fullmatch(line) is None:  # never written unreadable
        raise GecoError(f"cannot record the GPUs picked for job {rs.key} on {host!r}: "
                        f"{share} on a host so named is not a record geco can read back")
    atomicfile.write_atomic(jobfiles.gpu_picks(resources_dir, rs.key), line.encode(), mode=_MODE,
                            make_dir=True, what="record of the GPUs picked")


def load(resources_dir: Path, key: JobKey) -> Picks | None:
    """The record of job task ``key``; None when there is none.

    Raises
    ------
    GecoError
        when it cannot be read or is not one record line (naming the file).
    """
    path = jobfiles.gpu_picks(resources_dir, key)
    try:
        text = path.read_bytes().decode("ascii")
    except FileNotFoundError:
        return None
    except UnicodeError:
        text = ""
    except OSError as exc:
        raise GecoError.from_oserror("cannot read the record of the GPUs picked", exc,
                                     path=path) from exc
    found = _LINE.fullmatch(text)
    try:
        if found is None:
            raise ValueError(text)
        return Picks(found[1], gpushare.parse_share(found[2]), float(found[3]))
    except (GecoError, ValueError):
        raise GecoError(f"the record of the GPUs picked for job {key} is not "
                        f"'{_MAGIC} host=<name> gpus=count:<n>=<ids> submitted=<seconds>'",
                        path=path) from None


def remove(resources_dir: Path, key: JobKey) -> None:
    """Remove the record of job task ``key`` (none is fine).

    Raises
    ------
    GecoError
        when it exists and cannot be removed.
    """
    atomicfile.remove(jobfiles.gpu_picks(resources_dir, key), "record of the GPUs picked")


def kept(resources_dir: Path, rs: ResourceSet, hostname: str | None = None, *,
         contained: bool) -> tuple[ResourceSet, str]:
    """``rs``, read anew from Grid Engine, with the ids geco picked on this node put back,
    and why they could not be ("" when they were, or there were none to keep).

    They are put back beside the count (``"count:2"`` -> ``"count:2=1,3"``) when the record
    is of this job (same submission, when both know it) and the count is the same. Nothing
    is ever made up: without such a record the count stays without ids.

    Parameters
    ----------
    rs: the job's set as Grid Engine gave it now (qstat, the spool).
    hostname: this node's name as ``rs`` spells it (None: this host's).
    contained: the job holds its GPUs here already (its cgroups exist), so a count without
        a record means picks lost; else none may have been made yet.
    """
    node = rs.node(hostname)
    try:
        fresh = gpushare.parse_share(node.gpus) if node is not None else gpushare.Share()
    except GecoError:
        return rs, ""  # Grid Engine's own answer is not geco's to mend
    if not fresh.counted or fresh.ids or node is None:
        return rs, ""  # ids Grid Engine granted itself, or already there
    try:
        picks = load(resources_dir, rs.key)
    except GecoError as exc:
        return rs, str(exc)
    if picks is None:
        return rs, (f"no record of them ({jobfiles.gpu_picks(resources_dir, rs.key)})"
                    if contained and fresh.amount else "")
    if short_hostname(picks.host) != short_hostname(node.name):
        return rs, f"the record of them is {picks.host}'s, not {node.name}'s"
    if picks.submitted and rs.submitted \
            and log.submitted_text(picks.submitted) != log.submitted_text(rs.submitted):
        return rs, "the record of them is an earlier job's of that number"
    if picks.share.amount != fresh.amount:
        return rs, (f"Grid Engine counts {fresh.amount} GPU(s) here, the record of them "
                    f"{picks.share}")
    back = node._replace(gpus=str(picks.share))
    return rs.replace(nodes=tuple(back if n is node else n for n in rs.nodes)), ""
