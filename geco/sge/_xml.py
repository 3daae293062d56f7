"""Values out of qstat's XML: text byte for byte, Grid Engine's whole numbers, units.

Shared by :mod:`geco.sge.qstat` (the job, its tasks, its placement) and
:mod:`geco.sge.requests` (the job's requests). Every failure is a
:class:`~geco.errors.QstatParseError` naming the element.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal

from lxml import etree

from geco.errors import QstatParseError
from geco.sge.pe_hostfile import U32, shown, u32

__all__ = ["MAX_UNIT_TEXT", "NO_LIMIT", "restore", "text", "unit_value", "whole"]

# Grid Engine prints INFINITY as DBL_MAX with %f; anything this big is "no limit".
NO_LIMIT = Decimal(2) ** 63
# the longest memory or time text read (Grid Engine prints e.g. "1073741824.000000")
MAX_UNIT_TEXT = 64
_DIGITS = re.compile(r"[0-9]+")


def restore(raw: str) -> str:
    """Undo the byte-for-byte (ISO-8859-1) decoding: UTF-8 text, other bytes as surrogates."""
    try:
        data = raw.encode("latin-1")
    except UnicodeEncodeError:
        # a character reference above U+00FF (&#x263a;) is a real character already
        data = b"".join(bytes([ord(c)]) if ord(c) < 256 else c.encode("utf-8") for c in raw)
    return data.decode("utf-8", "surrogateescape")


def text(parent: etree._Element, tag: str) -> str | None:
    """Return the text of ``parent``'s child ``tag`` ("" when empty), None when absent."""
    child = parent.find(tag)
    if child is None:
        return None
    return restore("".join(str(t) for t in child.itertext()))


def whole(value: str | None, element: str, *, minimum: int = 0) -> int:
    """Return ``value`` as a whole number from ``minimum`` to 2**32-1 or raise naming
    ``element`` (Grid Engine's integers are u_long32)."""
    if value is None:
        raise QstatParseError(f"{element} is missing; expected a whole number >= {minimum}",
                              element=element)
    stripped = value.strip()
    if not _DIGITS.fullmatch(stripped):
        raise QstatParseError(f"{element} must be a whole number >= {minimum}, got "
                              f"{shown(value)}", element=element)
    number = u32(stripped)
    if number is None:
        raise QstatParseError(f"{element} must be at most {U32} (a u_long32), got "
                              f"{shown(stripped)}", element=element)
    if number < minimum:
        raise QstatParseError(f"{element} must be a whole number >= {minimum}, got "
                              f"{shown(value)}", element=element)
    return number


def unit_value(value: str, parse: Callable[[str], int | float | None], what: str,
               element: str) -> int | float:
    """A memory or time value through :mod:`geco.units` (0 for INFINITY); raise naming
    ``what``. Grid Engine prints such a value in a few dozen characters: a longer one is
    refused before its digits become a number (10 MB of them would take minutes)."""
    if len(value) > MAX_UNIT_TEXT:
        raise QstatParseError(f"{what}: {element} must be at most {MAX_UNIT_TEXT} "
                              f"characters, got {shown(value)}", element=element)
    try:
        return parse(value) or 0
    except ValueError as exc:
        raise QstatParseError(f"{what}: {exc}", element=element) from None
