"""Time geco's prolog and epilog on real Grid Engine jobs.

Run as root from the repo root (after scripts/install.sh):

    /opt/geco/venv/bin/python bench/bench_hooks.py [--jobs 20]
    /opt/geco/venv/bin/python bench/bench_hooks.py --since EPOCH

Brings up journald and the single-host Grid Engine with geco's hooks (the same
way the test fixtures do), submits N one-slot ``-b y /bin/true`` jobs as the
test user, and reads each hook's own timing from the journal
(``GECO_EVENT=prolog-done`` / ``epilog-done``). With ``--since`` it submits
nothing and reports every hook journaled since then (the jobs of a test run):

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


def hook_times(since: float, jobs: set[int] | None = None) -> dict[str, list[dict[str, str]]]:
    """``{hook: [its prolog-done/epilog-done journal entries]}`` since ``since`` (epoch
    seconds), of ``jobs`` only when given."""
    found: dict[str, list[dict[str, str]]] = {}
    for hook in ("prolog", "epilog"):
        out = harness.run(["journalctl", "-o", "json", "--no-pager", f"--since=@{int(since)}",
                           f"GECO_EVENT={hook}-done"], check=False).stdout
        entries = [json.loads(line) for line in out.splitlines() if line]
        found[hook] = [e for e in entries if jobs is None or int(e["JOB_ID"]) in jobs]
    return found


def report(title: str, times: dict[str, list[dict[str, str]]]) -> None:
    """Print the median and p90 of each hook's time in geco's code and since its exec."""
    print(title)
    print(f"{'hook':8} {'runs':>5} {'in hook p50':>12} {'p90':>7} "
          f"{'since exec p50':>15} {'p90':>7}")
    for hook, found in times.items():
        inside = [float(f["ELAPSED_SEC"]) * 1000 for f in found]
        total = [float(f["SINCE_EXEC_SEC"]) * 1000 for f in found]
        if not inside:
            print(f"{hook:8} {0:>5}  none journaled (a queue without it: gecod does its work)")
            continue
        print(f"{hook:8} {len(inside):>5} {statistics.median(inside):12.1f} "
              f"{percentile(inside, .9):7.1f} {statistics.median(total):15.1f} "
              f"{percentile(total, .9):7.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--since", type=float, metavar="EPOCH",
                        help="submit nothing: report the hooks journaled since then")
    args = parser.parse_args()
    if args.since is not None:
        report(f"geco hooks journaled since {time.ctime(args.since)}, ms",
               hook_times(args.since))
        return 0
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
    started = time.time()
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
    report(f"geco hooks on {len(jobs)} real Grid Engine jobs (-b y /bin/true, one slot), ms",
           hook_times(started, set(jobs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
