"""The words a job's owner reads about an OOM kill (:func:`owner_message`).

HTCondor's style: what happened, the limit and the request that set it, the
peak, and a larger request to resubmit with (:func:`suggest_request`). A kill
while the job was well below its limit (< 90 %), or one the kernel log puts
outside the job's cgroup, is a node-wide shortage and says so instead of
blaming the job (:attr:`geco.oom.OomEvent.node_wide`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from geco.errors import GecoError
from geco.gpushare import format_ids, parse_share
from geco.oom.watch import OomEvent
from geco.resourceset import ResourceSet
from geco.units import format_memory, parse_memory

__all__ = ["RequestHint", "owner_message", "request_hint", "suggest_request"]

# Suggested request = this x the peak per slot, rounded up to a friendly value.
_HEADROOM = Decimal("1.5")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------
# the job's requests
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHint:
    """What the job asked Grid Engine for on this node: the requests a remedy names.

    Attributes
    ----------
    slots: slots on this node.
    m_mem_free: per-slot ``-l m_mem_free`` in bytes (0 = not requested).
    h_vmem: per-slot ``-l h_vmem`` in bytes (0 = not requested).
    is_array: an array job is named ``42.1``, another job just ``42``.
    gpus: its GPU ids on this node (``"1,3"``; "" = none or not picked), for the records.
    """

    slots: int = 1
    m_mem_free: int = 0
    h_vmem: int = 0
    is_array: bool = True
    gpus: str = ""


def request_hint(rs: ResourceSet | None, host: str | None = None) -> RequestHint | None:
    """Return the requests of ``rs`` on ``host`` (default this host), or None when unknown."""
    if rs is None:
        return None
    node = rs.node(host)
    if node is None:
        return None
    slots = max(node.slots, 1)
    return RequestHint(slots=slots, m_mem_free=-(-node.memory_limit // slots),
                       h_vmem=-(-node.vmem_limit // slots), is_array=rs.is_array,
                       gpus=_gpu_ids(node.gpus))


def _gpu_ids(text: str) -> str:
    try:
        return format_ids(parse_share(text).ids)
    except GecoError:  # an OOM report goes out whatever the GPU list says
        return ""


# ---------------------------------------------------------------------------
# what the owner reads
# ---------------------------------------------------------------------------


def _ceil_2_digits(value: Decimal, smallest: Decimal) -> Decimal:
    """``value`` rounded up to two significant digits, in steps of at least ``smallest``."""
    if value <= 0:
        return smallest
    step = max(Decimal(1).scaleb(value.adjusted() - 1), smallest)
    return (value / step).to_integral_value(rounding=ROUND_CEILING) * step


def suggest_request(peak: int, current: int = 0) -> str:
    """Return a friendly per-slot request for a job that peaked at ``peak`` bytes per slot.

    About 1.5 x the peak, and always above ``current`` (the request that was
    too small), rounded *up* to two significant digits in M, G or T
    (powers of 1024, as Grid Engine reads them): ``300M``, ``1.4G``, ``12G``.

    Parameters
    ----------
    peak: peak use per slot in bytes.
    current: the per-slot request in force, bytes (0 = none).

    Returns
    -------
    A memory value Grid Engine accepts after ``-l m_mem_free=``/``h_vmem=``.
    """
    want = max(Decimal(peak) * _HEADROOM, Decimal(current + 1), Decimal(1 << 20))
    for unit, size, smallest in (("M", 1 << 20, Decimal(1)), ("G", 1 << 30, Decimal("0.1")),
                                 ("T", 1 << 40, Decimal("0.1"))):
        rounded = _ceil_2_digits(want / size, smallest)
        if rounded < 1000 or unit == "T":
            return f"{format(rounded.normalize(), 'f')}{unit}"
    raise AssertionError("unreachable: T takes any size")


def _job_label(event: OomEvent, hint: RequestHint | None) -> str:
    if hint is not None and not hint.is_array:
        return str(event.job_id)
    return event.key


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _binding_requests(event: OomEvent, hint: RequestHint) -> list[tuple[str, int]]:
    """The requests (name, per-slot bytes) that set ``event.limit``, m_mem_free first."""
    # h_vmem caps RAM+swap and, in geco, RAM too; m_mem_free caps RAM only
    names = ("h_vmem",) if event.limit_kind == "ram+swap" else ("m_mem_free", "h_vmem")
    per_slot = {"m_mem_free": hint.m_mem_free, "h_vmem": hint.h_vmem}
    # the kernel keeps limits in whole pages; per-slot values were rounded up
    slack = _PAGE + hint.slots
    return [(n, per_slot[n]) for n in names
            if per_slot[n] and abs(per_slot[n] * hint.slots - event.limit) < slack]


def owner_message(event: OomEvent, request_hint: RequestHint | None) -> str:
    """Return the paragraph the job's owner reads about ``event`` (one line, starts "geco:").

    Parameters
    ----------
    event: the kill.
    request_hint: the job's requests on this node; None when unknown (the
        remedy then names no ``-l`` option).

    Returns
    -------
    For a job over its limit: what happened, the limit and the request that
    set it, the peak, and a larger request to resubmit with (about 1.5 x the
    peak per slot). For a node-wide shortage (:attr:`OomEvent.node_wide`): that
    the job was not at fault and a larger request would not help.
    """
    job = _job_label(event, request_hint)
    victim = f"process {event.pid}" if event.pid else "a process"
    if event.pid and event.command:
        victim += f" ({event.command})"
    limit, peak = format_memory(event.limit), format_memory(event.peak)
    if event.node_wide:
        detail = f"peak use {peak} of {limit}" if event.limit > 0 else "it has none on this node"
        return (f"geco: job {job} on node {event.node} lost {victim} to the kernel's "
                f"out-of-memory killer, but the job was not over its memory limit ({detail}): "
                f"the node as a whole ran out of memory. This is not the job's fault and a "
                f"larger request would not help; if the job failed, resubmit it unchanged.")
    label = "Memory+swap limit" if event.limit_kind == "ram+swap" else "Memory limit"
    if request_hint is not None and not (request_hint.m_mem_free or request_hint.h_vmem):
        # no request: the limit is the node's default ([cgroup] memory_per_slot)
        slots = request_hint.slots
        default = -(-event.limit // slots)
        return (f"geco: job {job} on node {event.node} used more memory than this node gives "
                f"a job that requests none, and the kernel stopped {victim}. {label}: {limit} "
                f"(the node's default: {format_memory(default)} per slot x "
                f"{_plural(slots, 'slot')}); peak use: {peak}. Resubmit with a memory "
                f"request, for example -l "
                f"{'h_vmem' if event.limit_kind == 'ram+swap' else 'm_mem_free'}="
                f"{suggest_request(-(-event.peak // slots), default)}.")
    binding = _binding_requests(event, request_hint) if request_hint is not None else []
    head = (f"geco: job {job} on node {event.node} used more memory than it requested and "
            f"the kernel stopped {victim}.")
    if not binding or request_hint is None:
        return (f"{head} {label}: {limit}; peak use: {peak}. Resubmit with a larger memory "
                f"request (about {suggest_request(event.peak, event.limit)} for this node "
                f"in total).")
    slots = request_hint.slots
    name, per_slot = binding[0]
    suggestion = suggest_request(-(-event.peak // slots), per_slot)
    raise_names = [n for n, _ in binding]
    # h_vmem also caps RAM: below the new value it would become the limit
    if event.limit_kind == "ram" and "h_vmem" not in raise_names \
            and 0 < request_hint.h_vmem < (parse_memory(suggestion) or 0):
        raise_names.append("h_vmem")
    remedy = ",".join(f"{n}={suggestion}" for n in raise_names)
    return (f"{head} {label}: {limit} (-l {name}={format_memory(per_slot)} per slot x "
            f"{_plural(slots, 'slot')}); peak use: {peak}. Resubmit with a larger request, "
            f"for example -l {remedy}.")
