"""Time geco's prolog and epilog on real Grid Engine jobs.

Run as root from the repo root (after scripts/install.sh):

    /opt/geco/venv/bin/python bench/bench_hooks.py [--jobs 20]

Brings up journald and the single-host Grid Engine with geco's hooks (the same
way the test fixtures do), submits N one-slot ``-b y /bin/true`` jobs as the
test user, and reads each hook's own timing from the journal
(``GECO_EVENT=prolog-done`` / ``epilog-done``):

* ``in hook``     time spent in geco's code (configuration, qstat, cgroups),
* ``since exec``  from the hook process's exec (the /bin/sh wrapper) to the end,
                  Python start-up included; /proc start times have 10 ms steps.

Prints the median and p90 of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _common import journald, percentile

from tests import conftest as harness  # the test fixtures' service helpers


def _journal_fields(job: int, event: str) -> dict[str, str] | None:
    out = harness.run(["journalctl", "-o", "json", "--no-pager", f"JOB_ID={job}",
                       f"GECO_EVENT={event}"], check=False).stdout
    lines = [json.loads(line) for line in out.splitlines() if line]
    return lines[-1] if lines else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_hooks: run as root (it starts Grid Engine)", file=sys.stderr)
        return 2
    with journald():
        return _run(args.jobs)


def _run(count: int) -> int:
    owner = harness.ensure_user(harness.TEST_USER)
    env = dict(harness.CLEAN_ENV, SGE_TEST_USER=owner.name,
               GECO_PROLOG=harness.HOOK_LINES["prolog"], GECO_EPILOG=harness.HOOK_LINES["epilog"],
               GECO_STARTER=harness.HOOK_LINES["starter"])
    harness.run(["bash", str(harness.SGE_SETUP)], env=env, timeout=600)
    workdir = owner.make_dir("bench-hooks")
    jobs = []
    for _ in range(count):
        out = harness.run(["runuser", "-u", owner.name, "--", "qsub", "-b", "y", "-cwd",
                           "-o", "/dev/null", "-e", "/dev/null", "/bin/true"],
                          cwd=str(workdir)).stdout
        jobs.append(int(out.split()[2]))
    deadline = time.monotonic() + 60 + 5 * count
    pending = set(jobs)
    while pending and time.monotonic() < deadline:
        pending = {j for j in pending
                   if harness.run(["qstat", "-j", str(j)], check=False).returncode == 0}
        time.sleep(0.5)
    harness.run(["journalctl", "--sync"], check=False)
    rows = []
    for hook in ("prolog", "epilog"):
        found = [f for j in jobs if (f := _journal_fields(j, f"{hook}-done"))]
        inside = [float(f["ELAPSED_SEC"]) * 1000 for f in found]
        total = [float(f["SINCE_EXEC_SEC"]) * 1000 for f in found]
        rows.append((hook, len(found), inside, total))
    print(f"geco hooks on {len(jobs)} real Grid Engine jobs (-b y /bin/true, one slot), ms")
    print(f"{'hook':8} {'jobs':>5} {'in hook p50':>12} {'p90':>7} "
          f"{'since exec p50':>15} {'p90':>7}")
    for hook, n, inside, total in rows:
        if not inside:
            print(f"{hook:8} {n:>5}  no journal entries: are the hooks configured?")
            continue
        print(f"{hook:8} {n:>5} {statistics.median(inside):12.1f} {percentile(inside, .9):7.1f}"
              f" {statistics.median(total):15.1f} {percentile(total, .9):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
