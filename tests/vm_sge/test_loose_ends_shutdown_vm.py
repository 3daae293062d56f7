"""gecod at the node's poweroff: the guest half (issue 37, point 6).

Meant to run INSIDE the QEMU machine, last in the Grid Engine boot
(tests/system/test_sge_systemd_vm.py), whose guest then powers off in order
(``systemctl poweroff``, :data:`tests.system.vmrun.ORDERLY_POWEROFF`) with gecod, Grid
Engine and a job running. What systemd says of
gecod's stop cannot be read after the poweroff from inside: a witness unit, ordered
``Before=gecod.service`` and so stopped after it, writes systemd's own account of that
stop (``Result``, how the main process ended, when the stop began and when it exited)
to the guest command's stdout on run-in-vm's control share, which stays mounted until
the witness is stopped (``RequiresMountsFor=``). The host test reads it there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration import livekit as kit

# run-in-vm's control share in the guest (integration/vm/run-in-vm.sh: runinvm-guest);
# the guest command's stdout is a file there, which the host reads after the poweroff
CONTROL = Path("/run/runinvm")
WITNESS = "geco-shutdown-witness.service"
WITNESS_SCRIPT = Path("/run/geco-shutdown-witness.sh")
# what the witness writes: systemd's account of gecod's stop, one line (tests/system/
# vmrun.py: unit_stopped reads it)
PROPERTIES = ("Result", "ExecMainCode", "ExecMainStatus", "ActiveExitTimestampMonotonic",
              "InactiveEnterTimestampMonotonic")


def _why_not() -> str:
    if os.environ.get("RUNINVM") != "1":
        return ("this test arms a witness of the guest's poweroff: it runs only in the "
                "throw-away VM (tests/system/test_sge_systemd_vm.py)")
    if Path("/proc/1/comm").read_text().strip() != "systemd":
        return "systemd is not PID 1 here"
    return ""


pytestmark = [pytest.mark.vm, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_gecod_runs_with_a_job_and_a_witness_of_its_stop_at_the_poweroff(sge: Any) -> None:
    """Given gecod running with a job contained, when the guest powers off in order (the
    boot's last act), then a witness unit stopped after gecod tells the host how systemd
    ended gecod (armed here: active, ordered after gecod's stop, on the control share)."""
    assert _systemctl("is-active", "gecod.service").stdout.strip() == "active"
    # a job that runs through the poweroff, contained (its cgroups made by gecod)
    job = sge.submit("-b", "y", "-o", "/dev/null", "-e", "/dev/null", "sleep", "3600")
    key = f"{job}.1"
    kit.wait_for_cgroups(key, timeout=120)
    fields = " ".join(f"-p {name}" for name in PROPERTIES)
    WITNESS_SCRIPT.write_text(
        "#!/bin/sh\n"
        f"echo \"guest shutdown: gecod.service $(systemctl show gecod.service {fields} "
        f"| tr '\\n' ' ')\" >> {CONTROL}/stdout\n"
        # gecod's own last lines: the unit's also hold the hooks it ran for the queue
        "journalctl -b SYSLOG_IDENTIFIER=gecod -n 6 --no-pager -o short-monotonic "
        f"| sed 's/^/guest shutdown: journal: /' >> {CONTROL}/stdout\n")
    WITNESS_SCRIPT.chmod(0o755)
    Path(f"/run/systemd/system/{WITNESS}").write_text(
        "[Unit]\nDescription=geco's tests: how systemd stopped gecod at the poweroff\n"
        f"Before=gecod.service\nRequiresMountsFor={CONTROL}\n"
        "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
        f"ExecStop=/bin/sh {WITNESS_SCRIPT}\n")  # /run is mounted noexec
    assert _systemctl("daemon-reload").returncode == 0
    started = _systemctl("start", WITNESS)
    assert started.returncode == 0, started.stderr
    assert _systemctl("is-active", WITNESS).stdout.strip() == "active"
    assert (CONTROL / "stdout").is_file()
    assert _systemctl("is-active", "gecod.service").stdout.strip() == "active"
    assert kit.job_cgroups(key)
