"""The figures of a bench script as rows of one table (``bench/run`` prints them all).

A bench script given ``--json PATH`` writes its figures there besides printing its
own report: a JSON list of ``{"figure", "goal", "measured", "unit", "floor",
"floor_label"}``. Each row says what was measured, the goal (the issue's or the
README's, "-" where none is set), the value, and where one exists the machine's
floor measured in the same run (a bare interpreter start, a bare socket round
trip, a bare fork+exec), so a reader sees how far above the machine's limit geco
is. :func:`table` renders rows as ``bench/run`` prints them (plain or Markdown).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["HEADS", "Row", "add_json_option", "cells", "read_rows", "table", "write_rows"]

HEADS = ("figure", "goal", "measured", "floor", "ratio")


@dataclass(frozen=True)
class Row:
    """One figure: ``measured`` and ``floor`` in ``unit``; ``goal`` as words ("<= 40"),
    in ``unit`` too, or "-" where none is set."""

    figure: str
    measured: float
    unit: str
    goal: str = "-"
    floor: float | None = None
    floor_label: str | None = None

    @property
    def ratio(self) -> float | None:
        """measured / floor, where a floor exists."""
        return self.measured / self.floor if self.floor else None


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the figures there, as bench/run reads them")


def write_rows(path: Path | None, rows: list[Row]) -> None:
    """Write ``rows`` to ``path`` (nothing when None)."""
    if path is not None:
        path.write_text(json.dumps([asdict(r) for r in rows], indent=1))


def read_rows(path: Path) -> list[Row]:
    return [Row(**r) for r in json.loads(path.read_text())]


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def cells(row: Row) -> list[str]:
    """The row's cells under :data:`HEADS`."""
    goal = f"{row.goal} {row.unit}" if row.goal != "-" else "-"
    floor = _number(row.floor, row.unit)
    if row.floor is not None and row.floor_label:
        floor += f" ({row.floor_label})"
    ratio = "-" if row.ratio is None else f"{row.ratio:.{1 if row.ratio >= 1 else 2}f}x"
    return [row.figure, goal, _number(row.measured, row.unit), floor, ratio]


def table(lines: list[list[str]], markdown: bool = False) -> str:
    """``lines`` of cells (from :func:`cells`, or any five strings) under :data:`HEADS`:
    columns padded to their width, or a Markdown table."""
    if markdown:
        out = ["| " + " | ".join(HEADS) + " |", "|" + "---|" * len(HEADS)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |"
                for line in lines]
        return "\n".join(out)
    widths = [max(len(c) for c in col) for col in zip(HEADS, *lines, strict=False)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [list(HEADS), *lines])
