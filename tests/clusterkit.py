"""The emulated cluster of the multinode tests: ``integration/cluster/cluster.sh``, run."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["CLUSTER", "cluster"]

CLUSTER = Path(__file__).resolve().parents[1] / "integration" / "cluster" / "cluster.sh"


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``cluster.sh`` with ``args`` (up N, down, status, stop-gecod K, start-gecod K)."""
    return subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True,
                          timeout=600, check=False)
