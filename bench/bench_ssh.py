"""Time an ssh login to its first command, with geco's PAM lines and without, in one run.

Run as root from the repo root (after scripts/install.sh):

    /opt/geco-dev/venv/bin/python -m bench.bench_ssh [--logins 20] [--json PATH]

Brings up journald and the single-host Grid Engine with geco's hooks (as the test
fixtures do), starts gecod and one ``sleep`` job of the test user, and two real sshds on
127.0.0.1 (tests/sshkit.py): one with Debian's PAM stack alone, one with geco's
two lines added (``pam_geco.so``: gecod lets the user in, and moves the session
into the job) and geco's preload in sshd (the session's process asks gecod once
more before it runs the command). Logins
``ssh user@127.0.0.1 true`` alternate between the two in pairs; each figure is the
client's wall time from start to exit. The sshd without geco's lines is the floor;
what geco adds is the median of the pairs' differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench._common import gecod, journald, percentile
from bench._table import Row, add_json_option, write_rows
from tests import servicekit as harness  # the test fixtures' service helpers
from tests.cleanslate import TEST_USER
from tests.sshkit import GECO_PAM_STACK, PLAIN_PAM_STACK, Sshd, running_sshd

GOAL_MS = 50  # the issue's: geco adds at most this much to a login, p50


def _login_ms(server: Sshd, user: str) -> float:
    started = time.perf_counter()
    out = server.ssh(user, "true")
    elapsed = (time.perf_counter() - started) * 1000
    if out.returncode != 0:
        raise RuntimeError(f"ssh login failed ({out.returncode}): {out.stderr.strip()}")
    return elapsed


def _job_running(owner: harness.JobOwner) -> int:
    out = harness.run(["runuser", "-u", owner.name, "--", "qsub", "-b", "y", "-o", "/dev/null",
                       "-e", "/dev/null", "sleep", "3600"], cwd=str(owner.home)).stdout
    job = int(out.split()[2])
    procs = Path(f"/sys/fs/cgroup/memory/GECO/{job}.1/cgroup.procs")
    deadline = time.monotonic() + 120
    while not (procs.exists() and procs.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} got no cgroups in 120 s")
        time.sleep(0.2)
    return job


def _run(logins: int, json_path: Path | None) -> int:
    owner = harness.ensure_user(TEST_USER)
    env = dict(harness.CLEAN_ENV, SGE_TEST_USER=owner.name,
               GECO_PROLOG=harness.HOOK_LINES["prolog"], GECO_EPILOG=harness.HOOK_LINES["epilog"],
               GECO_STARTER=harness.HOOK_LINES["starter"])
    harness.run(["bash", str(harness.SGE_SETUP)], env=env, timeout=600)
    job = _job_running(owner)
    times: dict[str, list[float]] = {"plain": [], "geco": []}
    try:
        with running_sshd("geco-bench-sshd-plain", PLAIN_PAM_STACK, (owner.name,)) as plain, \
                running_sshd("geco-bench-sshd", GECO_PAM_STACK, (owner.name,),
                             preload=True) as geco:
            _login_ms(plain, owner.name)  # warm both (host keys, page cache)
            _login_ms(geco, owner.name)
            # pairs in ABBA order: drift on a busy host and which one goes first cancel out
            for i in range(logins):
                for name in (("plain", "geco") if i % 2 == 0 else ("geco", "plain")):
                    times[name].append(_login_ms(plain if name == "plain" else geco,
                                                 owner.name))
    finally:
        harness.run(["qdel", "-f", str(job)], check=False)
    plain_p50, geco_p50 = (statistics.median(times[k]) for k in ("plain", "geco"))
    added = statistics.median(g - p for g, p in zip(times["geco"], times["plain"], strict=True))
    print(f"ssh login to a first command (ssh user@127.0.0.1 true), {logins} logins each, ms")
    for name, label in (("plain", "Debian's PAM stack alone"),
                        ("geco", "with geco's PAM lines and preload")):
        print(f"  {label:40} p50 {statistics.median(times[name]):7.1f}  "
              f"p90 {percentile(times[name], .9):7.1f}")
    print(f"  geco adds, p50 of the paired differences {added:7.1f}  (goal <= {GOAL_MS})")
    write_rows(json_path, [
        Row("ssh login to a first command, with geco's PAM lines and preload, p50", geco_p50,
            "ms",
            f"<= floor + {GOAL_MS}", plain_p50, "the same sshd without geco's lines"),
        Row("ssh login: time geco adds, p50 of paired differences", added, "ms",
            f"<= {GOAL_MS}"),
    ])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logins", type=int, default=30, help="logins to each sshd")
    add_json_option(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_ssh: run as root (it starts Grid Engine and sshd)", file=sys.stderr)
        return 2
    with journald(), gecod():
        return _run(args.logins, args.json)


if __name__ == "__main__":
    sys.exit(main())
