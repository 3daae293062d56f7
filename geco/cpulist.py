"""The kernel's cpu lists: ``cpuset.cpus``, ``cpuset.mems``, ``/sys/.../online``.

``parse_cpulist(b"0-3,8\\n") == frozenset({0, 1, 2, 3, 8})`` and
``format_cpulist({0, 1, 2, 3, 8}) == "0-3,8"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MAX_CPU", "format_cpulist", "parse_cpulist"]

# Linux's NR_CPUS tops out at 8192; a bound keeps "0-4294967295" from eating the memory.
MAX_CPU = 65535


_ITEM = re.compile(rb"(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?")


def _shown(raw: bytes) -> str:
    """Bytes quoted as Python shows them, without the b prefix: '0-3\\n', '\\xff'."""
    return repr(raw)[1:]


def _malformed(raw: bytes, offset: int, why: str) -> ValueError:
    return ValueError(f"cpu list {_shown(raw)} is malformed at offset {offset}: {why}")


def parse_cpulist(text: str | bytes) -> frozenset[int]:
    """Parse a kernel cpu list (``cpuset.cpus``, ``cpuset.mems``, ``/sys/.../online``).

    Grammar (the kernel's ``bitmap_parselist``, minus the ``N`` shorthand)::

        cpulist := "" | item ("," item)*      one trailing newline allowed
        item    := num | num "-" num [":" used "/" group]

    ``a-b:u/g`` takes the first ``u`` of every ``g`` numbers in ``a-b``
    (``0-7:1/4`` = 0,4).

    Parameters
    ----------
    text: the list, as read from the file (bytes) or typed by a person (str).

    Returns
    -------
    The set of numbers; empty for ``""`` or ``"\\n"`` (a fresh cpuset).

    Raises
    ------
    ValueError
        naming the text and the offset when anything else is in it: spaces,
        empty items, a range that runs backwards, a number above ``MAX_CPU``.
    """
    if isinstance(text, str):
        try:
            raw = text.encode("ascii")
        except UnicodeEncodeError as exc:
            raise ValueError(f"cpu list {text!r} is malformed at offset {exc.start}: "
                             "only ASCII digits, '-', ',', ':' and '/' may appear") from None
    else:
        raw = bytes(text)
    body = raw[:-1] if raw.endswith(b"\n") else raw
    if not body:
        return frozenset()
    cpus: set[int] = set()
    offset = 0
    for item in body.split(b","):
        m = _ITEM.fullmatch(item)
        if m is None:
            what = _shown(item) if item else "an empty item"
            raise _malformed(raw, offset, f"expected a number or a range like 0-3, got {what}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi > MAX_CPU:
            raise _malformed(raw, offset, f"numbers must be <= {MAX_CPU}, got {hi}")
        if hi < lo:
            raise _malformed(raw, offset, f"range {lo}-{hi} runs backwards")
        if m[3] is None:
            cpus.update(range(lo, hi + 1))
        else:
            used, group = int(m[3]), int(m[4])
            if not 0 < used <= group:
                raise _malformed(raw, offset,
                                 f"group {used}/{group} must have 0 < used <= group size")
            cpus.update(n for n in range(lo, hi + 1) if (n - lo) % group < used)
        offset += len(item) + 1
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format numbers in the kernel's canonical list syntax: ``{0,1,2,3,8}`` → ``"0-3,8"``.

    Runs of two or more become ``a-b`` (as the kernel prints them); the empty
    set is ``""``. ``parse_cpulist(format_cpulist(s)) == s`` for every set.

    Raises
    ------
    ValueError
        when a number is negative.
    """
    ordered = sorted(set(cpus))
    if ordered and ordered[0] < 0:
        raise ValueError(f"cpu numbers must be >= 0, got {ordered[0]}")
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
