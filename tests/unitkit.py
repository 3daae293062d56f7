"""systemd's units as the QEMU machine's tests look at them (tests/vm_sge)."""

from __future__ import annotations

from tests.integration import livekit as kit

__all__ = ["SLOW", "main_pid", "systemctl"]

SLOW = 300.0  # the emulated machine is ~8x slower than the host: generous waits


def systemctl(*args: str, check: bool = True) -> str:
    """``systemctl ARGS``' output, stripped (raises on failure unless ``check`` is off)."""
    return kit.sh(["systemctl", *args], check=check, timeout=SLOW).stdout.strip()


def main_pid(unit: str) -> int:
    """The unit's main process (0 when it has none)."""
    return int(systemctl("show", "-p", "MainPID", "--value", unit))
