"""The figures a test run measured, printed as one table at its end (tests/conftest.py).

Tests append lines through the ``figures`` fixture; kits that are not tests
(``tests/fuzz/fuzzkit.py``) call :func:`add`.
"""

from __future__ import annotations

FIGURES: list[str] = []


def add(line: str) -> None:
    """Keep ``line`` for the table at the end of the run."""
    FIGURES.append(line)
