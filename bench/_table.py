"""The figures of a bench script as rows of one table (``bench/run`` prints them all).

A bench script given ``--json PATH`` writes its figures there besides printing its
own report; each row says what was measured, the goal (the issue's or the README's,
"-" where none is set), the value, and where one exists the machine's floor
measured in the same run (a bare interpreter start, a bare socket round trip, a
bare fork+exec), so a reader sees how far above the machine's limit geco is.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Row", "add_json_option", "read_rows", "write_rows"]


@dataclass(frozen=True)
class Row:
    """One figure: ``measured`` and ``floor`` in ``unit``; ``goal`` as words ("<= 40 ms")."""

    figure: str
    measured: float
    unit: str
    goal: str = "-"
    floor: float | None = None
    floor_label: str = ""

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
