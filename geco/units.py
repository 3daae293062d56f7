"""Grid Engine's memory and time values, as exact numbers.

Grid Engine writes memory as a number with an optional multiplier letter
(``sge_types(5)``, "memory_specifier"): ``K``/``M``/``G``/``T`` are powers of
1024, ``k``/``m``/``g``/``t`` powers of 1000, no letter means bytes; and time
as seconds or ``hours:minutes:seconds`` (a zero part may be left empty,
``1::1``). Both accept ``INFINITY`` for "no limit".

Memory is returned as whole bytes (``int``), computed with :class:`~decimal.Decimal`
so ``1.5G`` is exactly 1610612736 and never a float's neighbour. "No limit" is
``None``, not 0, so a caller cannot mistake it for a request of zero bytes;
:class:`geco.resourceset.ResourceSet` then stores 0, its own "none".

Not accepted: the hexadecimal and octal integers ``sge_types(5)`` also allows.
geco reads ``CE_doubleval`` (Grid Engine's own parse) first and needs these
functions only for values Grid Engine printed itself, which are decimal.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from decimal import Decimal

__all__ = ["decimal_value", "format_memory", "parse_memory", "parse_time"]

_MEMORY_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTkmgt]?)")
_FACTOR = {"": 1,
           "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4,
           "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_TIME_PART_RE = re.compile(r"[0-9]*")
_SECONDS_RE = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_UNITS = ("K", "M", "G", "T")


def _is_infinity(text: str) -> bool:
    return text.strip().lower() == "infinity"


def parse_memory(text: str) -> int | None:
    """Return the number of bytes ``text`` stands for.

    Parameters
    ----------
    text:
        A non-negative decimal number (``500``, ``1.5``) with an optional
        suffix ``K M G T`` (x 1024^n) or ``k m g t`` (x 1000^n); surrounding
        blanks are ignored.

    Returns
    -------
    int | None
        Whole bytes (a fraction of a byte is dropped), or None for
        ``INFINITY`` (any case), Grid Engine's "no limit".

    Raises
    ------
    ValueError
        naming the text when it is not of that form.
    """
    if _is_infinity(text):
        return None
    match = _MEMORY_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError("memory size must be a number with an optional K/M/G/T or k/m/g/t "
                         f"suffix, got {text!r}")
    from decimal import Decimal  # here, not above: hooks import this module, rarely use it

    return int(Decimal(match["number"]) * _FACTOR[match["suffix"]])


def format_memory(n: int) -> str:
    """Return ``n`` bytes for a human, in powers of 1024: ``"200M"``, ``"1.5G"``, ``"512"``.

    At most two decimals are shown, trailing zeros dropped, so the text reads
    back through :func:`parse_memory` to within 1 % of ``n``.

    Raises
    ------
    ValueError
        if ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"memory size must be >= 0 bytes, got {n}")
    unit, hundredths = "", n * 100
    for candidate in _UNITS:
        scaled = _hundredths(n, _FACTOR[candidate])
        # compare the *rounded* value, so 1 GiB - 1 byte prints "1G", not "1024M"
        if scaled < 100:
            break
        unit, hundredths = candidate, scaled
    whole, fraction = divmod(hundredths, 100)
    text = f"{whole}.{fraction:02d}".rstrip("0").rstrip(".")
    return f"{text}{unit}"


def _hundredths(n: int, factor: int) -> int:
    """``n / factor`` in hundredths, rounded half to even (exact: whole numbers only)."""
    q, r = divmod(n * 100, factor)
    return q + (2 * r > factor or (2 * r == factor and q % 2 == 1))


def parse_time(text: str) -> float | None:
    """Return the seconds a Grid Engine time value stands for.

    Parameters
    ----------
    text:
        Seconds (``60``, ``90.5``) or ``hours:minutes:seconds`` with whole
        numbers, an empty part meaning 0 (``1:30:00``, ``1::1``).

    Returns
    -------
    float | None
        Seconds, or None for ``INFINITY`` (any case), "no limit".

    Raises
    ------
    ValueError
        naming the text when it is neither form.
    """
    if _is_infinity(text):
        return None
    stripped = text.strip()
    if _SECONDS_RE.fullmatch(stripped):
        from decimal import Decimal

        return float(Decimal(stripped))
    parts = stripped.split(":")
    if len(parts) == 3 and all(_TIME_PART_RE.fullmatch(p) for p in parts):
        hours, minutes, seconds = (int(p) if p else 0 for p in parts)
        return float(hours * 3600 + minutes * 60 + seconds)
    raise ValueError(f"time must be seconds or hours:minutes:seconds, got {text!r}")


def decimal_value(text: str) -> Decimal:
    """Return ``text`` as an exact finite decimal number (helper for Grid Engine's ``%f`` output).

    Raises
    ------
    ValueError
        naming the text when it is not a plain decimal number.
    """
    from decimal import Decimal, InvalidOperation

    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite():
        raise ValueError(f"must be a decimal number, got {text!r}")
    return value
