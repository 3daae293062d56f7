"""What per-job tracing costs gecod per log record, and the starter per job.

Run from the repo root (root, for the traced case: trace files are chown'd):

    /opt/geco-dev/venv/bin/python -m bench.bench_trace [--records 100000] [--json PATH]

gecod's ``geco`` logger gets its usual stderr handler (seed format, level
error, writing to /dev/null) and, in all but the first row, a
:class:`geco.job.trace.TraceRouter`. Each row logs info records carrying job
fields (as gecod's journal events do) and prints the time per record (the
best of 5 runs; the traced row runs once, a tenth as many records):

* ``no router``            the baseline;
* ``router, no job``       a record without job fields;
* ``router, no file``      a job without a resource file (not on this node);
* ``router, level 0``      a job whose resource file has no trace level (the common case);
* ``router, level 3``      a traced job: the line is written to its trace file.

The ``router cost`` column is the row minus the baseline. Then the starter's
part: the ``stat`` of the trace file that decides, for an untraced job, that
nothing else is read, and the import time of geco.job.trace.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._table import Row, add_json_option, write_rows

REPO = Path(__file__).resolve().parent.parent

from geco import jobfiles, log  # noqa: E402
from geco.config import Config  # noqa: E402
from geco.job import trace  # noqa: E402
from geco.jobkey import JobKey  # noqa: E402
from geco.resourceset import NodeResources, ResourceSet  # noqa: E402
from geco.sge import resourcefile  # noqa: E402


def _per_record(records: int, job_id: int | None, repeats: int = 5) -> float:
    """Seconds per record: the best of ``repeats`` runs (the least disturbed one)."""
    lg = log.get("daemon")
    extra = log.job_fields(job_id, 1, "bench", PID=1234) if job_id is not None else None
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(records):
            lg.info("job %s: quarantined pid %d", job_id, 1234, extra=extra)
        best = min(best, (time.perf_counter() - started) / records)
    return best


def _handle_alone(router: trace.TraceRouter, n: int) -> list[tuple[str, float]]:
    """Seconds per call of the router's handle() for each untraced case."""
    lg = log.get("daemon")
    out = []
    for name, job_id in (("no job", None), ("no file", 1), ("level 0", 2)):
        extra = log.job_fields(job_id, 1, "bench") if job_id is not None else {}
        # geco.log's loggers hand records to the standard library's logger of their name
        record = logging.getLogger(lg.name).makeRecord(lg.name, logging.INFO, __file__, 1, "x",
                                                       (), None, extra=extra)
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(n):
                router.handle(record)
            best = min(best, (time.perf_counter() - started) / n)
        out.append((name, best))
    return out


# the starter's job-started record, timed in a fresh process: its first journal
# record pays for the socket, as the starter's does
_JOB_STARTED = """
import sys, time
from geco import log
log.setup("error", identifier="geco-bench-starter")
started = time.perf_counter()
log.get("starter").info("job %s started in its cgroups on %s: cores %s, running %s",
                        "0.1", "n1", "0", "/bin/true",
                        extra=log.job_fields(None, None, "bench-job-started", CPUS="0",
                                             COMMAND="/bin/true"))
print((time.perf_counter() - started) * 1e6)
"""


def _import_time(pycache: Path) -> int:
    """geco.job.trace's own import time in a fresh process, with its byte code compiled
    (as an installed package has it), after the modules every hook imports anyway."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    argv = [sys.executable, "-X", f"pycache_prefix={pycache}", "-X", "importtime", "-c",
            "import geco.config, geco.log, geco.sge.execd; import geco.job.trace"]
    runs = []
    for _ in range(6):  # the first run compiles
        out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO,
                             env=env).stderr
        own = [line for line in io.StringIO(out) if line.rstrip().endswith(" geco.job.trace")]
        runs.append(int(own[-1].split(":")[1].split("|")[1]))
    return sorted(runs[1:])[2]


def _job_started() -> float | None:
    if log.journal_socket() is None:
        return None
    runs = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", _JOB_STARTED], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout
        runs.append(float(out))
    return sorted(runs)[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    add_json_option(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="geco-bench-trace-"))
    cfg = Config(state_dir=base / "state", trace_dir=base / "trace")
    owner = "root" if os.geteuid() == 0 else ""
    for job_id, level in ((2, 0), (3, 3)):
        resourcefile.write(cfg.resources_dir, ResourceSet(job_id, 1, trace_level=level, owner=owner,
                                                       nodes=(NodeResources("n1"),)))
    devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
    log.setup("error", identifier="gecod", stream=devnull, journal=False)
    geco = logging.getLogger("geco")
    n = args.records
    try:
        rows: list[tuple[str, float]] = [("no router", _per_record(n, 2))]
        router = trace.TraceRouter(cfg)
        alone = _handle_alone(router, n)
        geco.addHandler(router)
        rows.append(("router, no job", _per_record(n, None)))
        rows.append(("router, no file", _per_record(n, 1)))
        rows.append(("router, level 0", _per_record(n, 2)))
        if os.geteuid() == 0:
            rows.append(("router, level 3", _per_record(max(1, n // 10), 3, repeats=1)))
        geco.removeHandler(router)
        router.close()
        # the baseline again, after the others: the least disturbed of its two runs counts
        rows[0] = ("no router", min(rows[0][1], _per_record(n, 2)))
        baseline = rows[0][1]
        print(f"per log record ({n} records, Python {sys.version.split()[0]}):")
        print(f"  {'case':<18} {'total':>10} {'router cost':>12}")
        for name, seconds in rows:
            extra = "" if name == "no router" else f"{(seconds - baseline) * 1e6:10.2f} us"
            print(f"  {name:<18} {seconds * 1e6:8.2f} us {extra:>12}")
        print("TraceRouter.handle() alone, same record again and again (best of 5):")
        for name, seconds in alone:
            print(f"  {name:<18} {seconds * 1e6:8.2f} us")
        traced = cfg.trace_dir / "3.1.trace"
        if traced.exists():
            print(f"  (level 3 file: {sum(1 for _ in traced.open())} lines)")

        # the starter's fast path: one stat of a trace file that does not exist
        path = jobfiles.trace(cfg.trace_dir, JobKey(2, 1))
        started = time.perf_counter()
        for _ in range(n):
            path.exists()
        stat_us = (time.perf_counter() - started) / n * 1e6
        print(f"starter, untraced job: trace file stat {stat_us:.2f} us")
        job_started = _job_started()
        print("starter, job-started record: no journald here" if job_started is None else
              f"starter, job-started record to journald (fresh process, socket included): "
              f"median {job_started:.0f} us of 5 runs")
        import_us = _import_time(base / "pycache")
        print(f"import geco.job.trace (+ geco.resourceset) in a hook: median {import_us} us "
              "of 5 runs; only the prolog, the epilog and a traced job's starter import it")
        table = [Row(f"log record in gecod, trace router, {name.removeprefix('router, ')}",
                     seconds * 1e6, "us", "-", baseline * 1e6, "no router")
                 for name, seconds in rows[1:]]
        table.append(Row("starter, untraced job: trace file stat", stat_us, "us"))
        if job_started is not None:
            table.append(Row("starter, job-started record to journald (fresh process)",
                             job_started, "us"))
        table.append(Row("import geco.job.trace (+ geco.resourceset), cumulative",
                         import_us, "us"))
        write_rows(args.json, table)
    finally:
        log.setup("error", journal=False)
        devnull.close()
        shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
