"""The job's ``pe_hostfile``: which hosts run it, with how many slots, and the master.

sge_execd writes one into the job's spool dir for every job, serial ones too
(``<host> <slots> <queue> <processors>`` per queue instance, the master host
first). It is the placement Son of Grid Engine 8.1.9 gives nowhere else: its
``qstat -xml -j`` prints no granted hosts. Read without lxml, so a hook that
only needs the placement never loads an XML parser.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from geco.errors import QstatParseError

__all__ = ["MAX_SLOTS", "U32", "Placement", "merge", "parse_pe_hostfile", "shown", "u32"]

# Grid Engine's integers (job and task numbers, slots, JB_type) are u_long32
U32 = 2**32 - 1
# the most slots one host may have: the resource file holds them as a 32-bit signed int
MAX_SLOTS = 2**31 - 1
_DIGITS_B = re.compile(rb"[0-9]+")


@dataclass(frozen=True, slots=True)
class Placement:
    """Slots one host grants a task.

    Attributes
    ----------
    host: host name as Grid Engine prints it.
    slots: slots on that host, summed over its queue instances.
    is_master: True for the host that runs the job script (and the prolog).
    """

    host: str
    slots: int
    is_master: bool


def shown(text: str) -> str:
    """Quote a value for a message, cut to 40 characters (a job's text can be megabytes)."""
    return repr(text[:40]) + ("..." if len(text) > 40 else "")


def u32(digits: str) -> int | None:
    """ASCII digits as an int, None beyond a u_long32 (int() refuses thousands of digits)."""
    significant = digits.lstrip("0")
    value = int(significant or "0") if len(significant) <= 10 else None
    return value if value is not None and value <= U32 else None


def merge(entries: Iterable[tuple[str, int, bool]]) -> list[Placement]:
    """Sum slots per host (first appearance keeps its place), master host first."""
    slots: dict[str, int] = {}
    master: dict[str, bool] = {}
    for host, count, is_master in entries:
        slots[host] = slots.get(host, 0) + count
        master[host] = master.get(host, False) or is_master
        if slots[host] > MAX_SLOTS:
            raise QstatParseError(f"the slots of host {shown(host)} add up to {slots[host]}, "
                                  f"more than {MAX_SLOTS}", host=shown(host))
    hosts = list(slots)
    if hosts and not any(master.values()):
        master[hosts[0]] = True
    hosts.sort(key=lambda h: not master[h])  # stable: master first, others keep their order
    return [Placement(h, slots[h], master[h]) for h in hosts]


def parse_pe_hostfile(text: bytes) -> list[Placement]:
    """Parse a ``pe_hostfile``: one ``host slots queue processors`` line per queue instance.

    Parameters
    ----------
    text:
        The file's bytes, e.g. ``b"vm 2 all.q@vm UNDEFINED\\n"``. The first line
        is the master host; blank lines are ignored; a host on several lines
        (several queue instances) gets their slots added up.

    Returns
    -------
    list[Placement]
        One record per host, the master first, the others in file order.

    Raises
    ------
    QstatParseError
        naming the line number and content of a malformed line, or when the
        file lists no host.
    """
    entries: list[tuple[str, int, bool]] = []
    for number, raw in enumerate(text.split(b"\n"), start=1):
        fields = raw.split()
        if not fields:
            continue
        line = shown(raw.strip().decode("utf-8", "backslashreplace"))
        well_formed = 2 <= len(fields) <= 4 and _DIGITS_B.fullmatch(fields[1]) is not None
        slots = u32(fields[1].decode()) if well_formed else None
        if not well_formed or slots == 0:
            raise QstatParseError(f"pe_hostfile line {number} must be 'host slots queue "
                                  f"processors' with slots >= 1, got {line}", line=number)
        if slots is None:
            raise QstatParseError(f"pe_hostfile line {number}: slots must be at most {U32} "
                                  f"(a u_long32), got {line}", line=number)
        host = fields[0].decode("utf-8", "surrogateescape")
        entries.append((host, slots, not entries))
    if not entries:
        raise QstatParseError("pe_hostfile lists no host; expected 'host slots queue "
                              "processors' lines")
    return merge(entries)
