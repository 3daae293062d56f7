"""The fuzz tests' figures: printed in the run's "figures" table and, when
``$GECO_FIGURES_DIR`` is set, written to ``$GECO_FIGURES_DIR/fuzz.json``.

Not to be imported (pytest finds it by name); the helpers are in ``fuzzkit.py``.
"""

from __future__ import annotations

import pytest

from tests.fuzz import fuzzkit


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # the lines themselves are in the run's one "figures" table (tests/conftest.py)
    path = fuzzkit.write_figures()
    if path is not None:
        terminalreporter.write_line(f"fuzz figures written to {path}")
