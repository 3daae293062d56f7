"""A qmod stand-in for tests that check what geco asks of Grid Engine when a node is sick,
without disabling a real queue (the real one is in the integration tests)."""

from __future__ import annotations

from pathlib import Path


def recording_qmod(base: Path) -> tuple[Path, Path]:
    """A qmod in ``base/bin`` that records its arguments (one line per run in
    ``base/qmod.args``) and succeeds; returns the script and the record."""
    record = base / "qmod.args"
    script = base / "bin" / "qmod"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {record}\necho changed\n")
    script.chmod(0o755)
    return script, record
