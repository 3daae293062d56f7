"""What a job's private /tmp and /dev/shm cost: its namespace made, and removed.

Run from the repo root as root, after scripts/install.sh (it runs the installed
``geco-mntns``):

    /opt/geco-dev/venv/bin/python -m bench.bench_private_tmp [--runs 50] [--json PATH]

* make: :func:`geco.job.privatetmp.make` as gecod calls it at a job's start (its
  directories, the helper: a namespace with /tmp, /var/tmp and /dev/shm, pinned), the
  median of ``--runs``: what private /tmp adds to a job's start on each host (the
  preload's setns before the shepherd is microseconds); goal <= 5 ms;
* remove: :func:`geco.job.privatetmp.remove` (the pin dropped, the directories deleted);
  goal <= 5 ms;
* both beside the floor measured in the same run: a bare ``unshare --mount`` running
  ``mount -t tmpfs`` (util-linux, two programs, one mount).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._common import median_time
from bench._table import Row, add_json_option, write_rows
from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey

M = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    add_json_option(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="geco-bench-tmp-"))
    base.chmod(0o755)
    cfg = Config(state_dir=base / "state")
    keys = iter(JobKey(500_000 + i, 1) for i in range(args.runs))
    made: list[JobKey] = []

    def make() -> None:
        key = next(keys)
        privatetmp.make(cfg, key, 256 * M, 0)
        made.append(key)

    try:
        make_ms = 1000 * median_time(args.runs, make)
        gone = iter(list(made))
        remove_ms = 1000 * median_time(args.runs, lambda: privatetmp.remove(cfg, next(gone)))
        floor_ms = 1000 * median_time(args.runs, lambda: subprocess.run(
            ["unshare", "--mount", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
             "/dev/shm"], check=True))
    finally:
        for key in made:
            privatetmp.remove(cfg, key)
        subprocess.run(["umount", "-l", str(cfg.state_dir / "mntns")], check=False,
                       capture_output=True)
        subprocess.run(["rm", "-rf", str(base)], check=False)
    floor = "unshare --mount + mount -t tmpfs"
    rows = [Row("private /tmp: a job's namespace made (added to its start)", make_ms, "ms",
                goal="<= 5",
                floor=floor_ms, floor_label=floor),
            Row("private /tmp: a job's namespace removed", remove_ms, "ms", goal="<= 5",
                floor=floor_ms, floor_label=floor)]
    for row in rows:
        print(f"{row.figure}: {row.measured:.2f} {row.unit} (floor {row.floor:.2f} ms: "
              f"{row.floor_label}); goal {row.goal}")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
