"""The emulated cluster of the multinode tests: ``integration/cluster/cluster.sh``, run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["CLUSTER", "PE", "QUEUE", "cluster", "submit_pe"]

CLUSTER = Path(__file__).resolve().parents[1] / "integration" / "cluster" / "cluster.sh"
QUEUE = "geco-test-cluster.q"
PE = "geco-test-cluster"


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``cluster.sh`` with ``args`` (up N, down, status, stop-gecod K, start-gecod K,
    run K command...)."""
    return subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True,
                          timeout=600, check=False)


def submit_pe(sge: Any, owner: Any, name: str, script: str, *extra: str,
              output: str = "out") -> tuple[int, Path]:
    """Submit ``script`` as ``owner`` from a fresh dir of theirs: a 3-slot -pe job, one slot
    per host, its master on geco-node1, stdout and stderr merged into ``output`` there.
    Returns the job id and the dir."""
    out = owner.make_dir(name)
    path = out / "pe.sh"
    path.write_text(script)
    os.chown(path, owner.uid, owner.gid)
    job = sge.submit("-q", QUEUE, "-pe", PE, "3", "-masterq", f"{QUEUE}@geco-node1", "-cwd",
                     "-o", output, "-j", "y", *extra, str(path), cwd=out)
    return job, out
