"""What gecod's usage samples cost: per job per sample, for 1,000 jobs, on disk, and a report.

Run from the repo root as root (it makes cgroups):

    /opt/geco-dev/venv/bin/python -m bench.bench_usage [--jobs 200] [--rounds 5] [--json PATH]

* ``--jobs`` real cgroup v1 job cgroups (``geco-test-bench-usage``, one cpu, a memory
  limit, no process) are sampled by gecod's own :class:`geco.usage.sampler.Sampler`
  (one round = one sample of every job): the best round's time per job, beside the
  floor of reading one counter file per job; projected to 1,000 jobs at the default
  interval as a share of one core (goal: <= 0.1%).
* Disk per job-day: a job's file after a day at the default interval (2,880 samples,
  the default ``max_samples``: no more is ever kept).
* ``geco usage JOB --json`` for an ended job with a full file, as a user runs it (a new
  interpreter; goal <= 200 ms), beside a bare ``python3 -I -S -c pass``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import REPO, run_in_cgroups, v1_backend
from bench._table import Row, add_json_option, write_rows
from geco import jobfiles
from geco.cgroup import Limits, V1Backend
from geco.config import Config
from geco.jobkey import JobKey
from geco.usage import samples
from geco.usage.sampler import Sampler

DAY = 86400.0


class _NoLoop:
    def add_timer(self, delay: float, callback: object, repeat: float | None = None) -> None:
        raise AssertionError("the bench runs rounds itself")


def _best(runs: int, work: object) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best


def _process(argv: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    add_json_option(parser)
    args = parser.parse_args()
    backend = v1_backend("geco-test-bench-usage", V1Backend)
    rows: list[Row] = []
    base = Path(tempfile.mkdtemp(prefix="geco-bench-usage-"))
    base.chmod(0o755)
    cfg = Config()._replace(state_dir=base / "state", execd_spool_dir=base / "spool")

    def body() -> None:
        keys = [JobKey(100_000 + i, 1) for i in range(args.jobs)]
        for key in keys:
            backend.create(key, Limits(cpus="0", mems="0", memory=256 << 20))
        sampler = Sampler(_NoLoop(), backend, cfg)  # type: ignore[arg-type]
        try:
            sampler.sample_all()  # the headers, read once per job
            round_s = _best(args.rounds, sampler.sample_all)
        finally:
            sampler.close()
        counters = [backend.paths(k)["memory"] / "memory.usage_in_bytes" for k in keys]
        floor_s = _best(args.rounds, lambda: [c.read_bytes() for c in counters])
        per_job = round_s / len(keys)
        rows.append(Row("usage sample, per job", per_job * 1e6, "us",
                        floor=floor_s / len(keys) * 1e6,
                        floor_label="one counter file read per job"))
        share = per_job * 1000 / cfg.usage_interval * 100
        rows.append(Row(f"usage samples of 1,000 jobs every {cfg.usage_interval:g} s, "
                        "share of one core", share, "%", goal="<= 0.1"))

    code = run_in_cgroups("bench_usage", backend, body)
    if code:
        return code
    # a day of samples at the default interval, for a job that ended
    key = JobKey(7, 1)
    header = samples.Header(7, 1, owner="root", job_name="day", host="bench", cores=2,
                            memory=1 << 30, started=1000.0)
    for i in range(int(DAY / cfg.usage_interval)):
        samples.append(cfg.usage_dir, header, samples.Sample(
            1000.0 + i * cfg.usage_interval, i * 1_000_000, 0, 300 << 20, 310 << 20, 2, 0),
            max_samples=cfg.usage_max_samples)
    size = jobfiles.samples(cfg.usage_dir, key).stat().st_size
    rows.append(Row("usage samples on disk per job-day", size / 1024, "KiB",
                    goal=f"<= {cfg.usage_max_samples * samples.RECORD.size / 1024 + 4:.0f}"))
    config = base / "geco.toml"
    config.write_text(f'[paths]\nstate_dir = "{cfg.state_dir}"\n'
                      f'execd_spool_dir = "{cfg.execd_spool_dir}"\n')
    env = {"PYTHONPATH": str(REPO), "GECO_CONFIG": str(config), "PATH": "/usr/bin:/bin"}
    report_s = _process([sys.executable, "-m", "geco.cli", "usage", "7", "--json"], 5, env)
    bare_s = _process([sys.executable, "-I", "-S", "-c", "pass"], 5)
    rows.append(Row("geco usage for an ended job (a day of samples)", report_s * 1000, "ms",
                    goal="<= 200", floor=bare_s * 1000, floor_label="python3 -I -S -c pass"))
    for row in rows:
        floor = f" (floor {row.floor:.1f} {row.unit}: {row.floor_label})" if row.floor else ""
        print(f"{row.figure}: {row.measured:.3f} {row.unit}{floor}; goal {row.goal}")
    write_rows(args.json, rows)
    subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
