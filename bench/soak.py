"""Soak: N short jobs of every kind through the real Grid Engine, and what they left behind.

Run as root from the repo root (it starts the single-host Grid Engine, journald and gecod
the way the test fixtures do, and stops what it started):

    /opt/geco-dev/venv/bin/python -m bench.soak [--jobs N]

N job tasks (default 1,000) in the mix of ``tests/integration/soakkit.py`` -- serial, array
tasks, smp (``-pe smp 2``), mpi (``-pe mpi 2`` with a ``qrsh -inherit`` task) and OOM jobs
-- run through a queue with geco's starter on an execd with the exec() preload, gecod
containing and tearing down every job. Printed at the end, one table: job tasks run (per
kind), leaked cgroups, leaked resource/OOM files, leftover processes, uncontained tasks,
cores given to two jobs at once, queue error states, jobs held in error, OOM kills
journaled exactly once, gecod's RSS at the start and the end (bound: +20 MiB), wall time
and job tasks per second; beside it the floor measured in the same run: 20 bare
``qsub -b y /bin/true`` jobs through a queue without geco on the plain execd, and a bare
``python3 -c pass``. With ``$GECO_FIGURES_DIR`` set the figures also go to
``$GECO_FIGURES_DIR/soak.json``.

The run is ``tests/integration/test_soak.py`` with ``GECO_SOAK_JOBS=N`` (pytest prints the
table; the test's assertions -- zero leaks, zero errors, each OOM once, the RSS bound --
decide the exit status), so the bench and the CI test share one code path; CI runs 200.
While developing, serialise it with the other Grid Engine runs:
``flock /run/lock/geco-dev.lock /opt/geco-dev/venv/bin/python -m bench.soak``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST = REPO / "tests" / "integration" / "test_soak.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, metavar="N",
                        help="job tasks to run (default 1000; CI's test runs 200)")
    args = parser.parse_args()
    if args.jobs < 10:
        parser.error(f"--jobs must be at least 10 (one of each kind), got {args.jobs}")
    if os.geteuid() != 0:
        print("soak.py: must run as root (Grid Engine, cgroups, gecod)", file=sys.stderr)
        return 1
    env = {**os.environ, "GECO_SOAK_JOBS": str(args.jobs)}
    argv = [sys.executable, "-m", "pytest", str(TEST), "-q", "-s", "-p", "no:cacheprovider"]
    return subprocess.run(argv, cwd=REPO, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
