"""Time geco's hooks on real Grid Engine jobs, with and without gecod.

Run as root from the repo root (after scripts/install.sh):

    /opt/geco-dev/venv/bin/python -m bench.bench_hooks [--jobs 20] [--json PATH]
    /opt/geco-dev/venv/bin/python -m bench.bench_hooks --since EPOCH

Brings up journald and the single-host Grid Engine with geco's prolog, epilog and
starter (the same way the test fixtures do) and submits N one-slot ``-b y /bin/true``
jobs as the test user, in three configurations:

1. **hooks alone**: no gecod; the hook program runs the Python hooks, and the prolog
   asks qstat for the job's resources itself;
2. **gecod without the preload**: the hooks have gecod do their work, and gecod asks
   qstat for the prolog;
3. **with gecod and the preload**: gecod has read the job's resources and made its
   cgroups at the shepherd's exec, before the prolog starts.

The first and last configurations also run the same jobs with a hook that does nothing
(``bench/nohook.c``, compiled here, as prolog, epilog and starter of the same
queue): its "since exec" is the floor of each hook's figure, what Grid Engine and
the kernel's tick take before any code of the hook runs.

Each hook's own figures come from the journal (``GECO_EVENT=prolog-done`` and
``epilog-done``: ``ELAPSED_SEC`` in geco's code, ``SINCE_EXEC_SEC`` since the
process started; the starter's ``job-started`` carries its ``SINCE_EXEC_SEC``, as
the job replaces it). The kernel counts a process's start from its fork, in 10 ms
ticks rounded down, so "since exec" also holds what Grid Engine's shepherd does in
the child before the exec, and up to one tick more: an upper bound. For a prolog
that asked qstat, ``RESOURCES_SEC`` (qstat's time) is also shown. Printed beside:
``-X importtime`` totals per hook (the sum of its modules' own import times) and a
bare ``python -I -S -c pass``, measured in the same run.

With ``--since`` it submits nothing and reports every hook journaled since then
(the jobs of a test run), and the job starts gecod answered (``GECO_EVENT=quarantined``:
``ELAPSED_MS`` from accept to answer, ``LOOKUP_MS`` qstat's share of it), beside the
preload's wait for them (``[gecod] request_timeout``): how close a slow node comes to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import gecod, journald, percentile
from bench._table import Row, add_json_option, write_rows
from geco.wire import preload_config
from tests import servicekit as harness  # the test fixtures' service helpers
from tests.cleanslate import TEST_USER


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


def report_starts(answered: list[dict[str, str]]) -> None:
    """One line: the job starts gecod answered, accept to answer and qstat's share, ms,
    beside the preload's wait on this node (its preload.conf's ``timeout_ms``)."""
    elapsed = _ms(answered, "ELAPSED_MS", 1)
    lookup = _ms(answered, "LOOKUP_MS", 1)
    if not elapsed:
        print("job starts gecod answered: none journaled")
        return
    line = (f"job starts gecod answered: {len(elapsed)}, accept to answer p50 "
            f"{_median(elapsed):.1f} ms, p90 {percentile(elapsed, .9):.1f}, max {max(elapsed):.1f}")
    if lookup:
        line += (f"; qstat's share ({len(lookup)} asked) p50 {_median(lookup):.1f}, "
                 f"max {max(lookup):.1f}")
    print(f"{line}; the preload waits {_preload_wait()}")


def _preload_wait(conf: Path = preload_config.DEFAULT_PATH) -> str:
    try:
        lines = conf.read_text().splitlines()
    except OSError as exc:
        return f"(not known: {conf}: {exc.strerror})"
    said = [line.partition("=")[2] for line in lines if line.startswith("timeout_ms=")]
    return f"{said[0]} ms ({conf})" if said else f"(not known: no timeout_ms in {conf})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs in each of the two rounds")
    parser.add_argument("--since", type=float, metavar="EPOCH",
                        help="submit nothing: report the hooks journaled since then")
    add_json_option(parser)
    args = parser.parse_args()
    if args.since is not None:
        report(f"geco hooks journaled since {time.ctime(args.since)}, ms",
               hook_times(args.since))
        report_starts(_entries(args.since, None, "quarantined"))
        return 0
    if os.geteuid() != 0:
        print("bench_hooks: run as root (it starts Grid Engine)", file=sys.stderr)
        return 2
    with journald():
        return _run(args.jobs, args.json)


PYTHON = "/opt/geco-dev/venv/bin/python"
PRELOAD = "/usr/lib/geco/libgeco_preload.so"


def bare_start_ms(runs: int = 20) -> float:
    """The floor: median wall time of ``python -I -S -c pass``, in ms."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([PYTHON, "-I", "-S", "-c", "pass"], check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def import_ms(hook: str) -> float:
    """``-X importtime`` total of ``geco.hooks.<hook>`` as the installed hook imports it, ms."""
    code = ("import sys; v = sys.executable.rpartition('/bin/')[0]; "
            "sys.path.append('%s/lib/python%d.%d/site-packages' % (v, *sys.version_info[:2]));"
            f" import geco.hooks.{hook}")
    err = subprocess.run([PYTHON, "-I", "-S", "-X", "importtime", "-c", code], check=True,
                         capture_output=True, text=True).stderr
    return sum(int(line.split("|")[0].split(":")[1]) for line in err.splitlines()
               if line.startswith("import time:") and "self [us]" not in line) / 1000


NOHOOK = Path(__file__).resolve().parent / "nohook.c"
NOHOOKS = ("prolog", "epilog", "starter")


def nohooks_built(where: Path) -> dict[str, str]:
    """Build ``bench/nohook.c`` as ``where``'s prolog, epilog and starter (with a
    ``times.log`` that the job owner's starter may append to); return the queue's
    hook settings for them, as ``setup.sh`` takes them."""
    where.mkdir(mode=0o755)
    harness.run(["cc", "-O2", "-o", str(where / "nohook"), str(NOHOOK)])
    for hook in NOHOOKS:
        os.link(where / "nohook", where / hook)
    (where / "times.log").touch()
    (where / "times.log").chmod(0o666)  # bench_hooks' own file, in its own directory
    return {"GECO_PROLOG": f"root@{where}/prolog", "GECO_EPILOG": f"root@{where}/epilog",
            "GECO_STARTER": f"{where}/starter"}


def nohook_times(where: Path) -> dict[str, list[float]]:
    """``{hook: [since exec, ms]}`` the do-nothing hooks in ``where`` wrote; read once, then
    emptied for the next round."""
    times: dict[str, list[float]] = {hook: [] for hook in NOHOOKS}
    log = where / "times.log"
    for line in log.read_text().splitlines():
        hook, _, ms = line.partition(" ")
        times[hook].append(float(ms))
    log.write_text("")
    return times


def _round(owner: harness.JobOwner, workdir: Path, count: int) -> tuple[list[int], float]:
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
    return jobs, started


def _entries(since: float, jobs: list[int] | None, event: str) -> list[dict[str, str]]:
    """The ``event`` records journaled since ``since``, of ``jobs`` (None: every job's)."""
    out = harness.run(["journalctl", "-o", "json", "--no-pager", f"--since=@{int(since)}",
                       f"GECO_EVENT={event}"], check=False).stdout
    return [e for e in (json.loads(line) for line in out.splitlines() if line)
            if e.get("JOB_ID", "").isdigit() and (jobs is None or int(e["JOB_ID"]) in jobs)]


def _ms(entries: list[dict[str, str]], field: str, scale: float = 1000) -> list[float]:
    """``field`` of each entry that has it, in ms (``scale``: ms per the field's unit)."""
    return [float(e[field]) * scale for e in entries if e.get(field)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _setup(env: dict[str, str], preload: str) -> None:
    harness.run(["bash", str(harness.SGE_SETUP)], env=dict(env, GECO_EXECD_PRELOAD=preload),
                timeout=600)


def _run(count: int, json_path: Path | None) -> int:
    owner = harness.ensure_user(TEST_USER)
    env = dict(harness.CLEAN_ENV, SGE_TEST_USER=owner.name,
               GECO_PROLOG=harness.HOOK_LINES["prolog"], GECO_EPILOG=harness.HOOK_LINES["epilog"],
               GECO_STARTER=harness.HOOK_LINES["starter"])
    workdir = owner.make_dir("bench-hooks")
    with tempfile.TemporaryDirectory(prefix="geco-bench-hooks-") as tmp:
        os.chmod(tmp, 0o755)  # the job owner runs the starter from it
        where = Path(tmp) / "nohooks"
        nohooks = dict(env, **nohooks_built(where))
        _setup(env, "")
        alone, since_alone = _round(owner, workdir, count)
        _setup(nohooks, "")
        _round(owner, workdir, count)
        floors_alone = nohook_times(where)
        try:
            with gecod():
                _setup(env, "")
                asked, since_asked = _round(owner, workdir, count)
                _setup(env, PRELOAD)
                served, since_served = _round(owner, workdir, count)
                _setup(nohooks, PRELOAD)
                _round(owner, workdir, count)
                floors_served = nohook_times(where)
        finally:
            _setup(env, "")
    python = bare_start_ms()
    imports = {hook: import_ms(hook) for hook in ("prolog", "epilog", "starter")}
    rows: list[Row] = []
    print(f"geco hooks on 5 x {count} real Grid Engine jobs (-b y /bin/true, one slot), ms")
    print(f"  python -I -S -c pass, wall time                  {python:7.1f}")
    rows.append(Row("python -I -S -c pass (start to exit, wall time)", python, "ms"))
    for hook, ms in imports.items():
        print(f"  -X importtime total, geco.hooks.{hook:8}         {ms:7.1f}")
        rows.append(Row(f"{hook}: -X importtime total", ms, "ms"))
    # title, jobs, when, the do-nothing hooks' figures, the rows' tag, qstat asked at the prolog
    for title, jobs, since, floors, tag, qstat in (
            ("hooks alone (the prolog asks qstat)", alone, since_alone, floors_alone,
             "hooks alone", True),
            ("with gecod, without the preload (gecod asks qstat for the prolog)", asked,
             since_asked, floors_alone, "gecod asked qstat", True),
            ("with gecod and the preload", served, since_served, floors_served,
             "gecod knew the job", False)):
        print(f"{title}:")
        prolog = _entries(since, jobs, "prolog-done")
        read = {e["JOB_ID"]: e for e in _entries(since, jobs, "resources-read")}
        beyond_qstat = [float(e["SINCE_EXEC_SEC"]) * 1000
                        - float(read.get(e["JOB_ID"], {}).get("RESOURCES_SEC", "0")) * 1000
                        for e in prolog]
        figures = {
            "prolog since exec": _ms(prolog, "SINCE_EXEC_SEC"),
            "prolog in geco's code": _ms(prolog, "ELAPSED_SEC"),
            "prolog since exec, qstat's own time taken out": beyond_qstat,
            "epilog since exec": _ms(_entries(since, jobs, "epilog-done"), "SINCE_EXEC_SEC"),
            "starter since exec": _ms(_entries(since, jobs, "job-started"), "SINCE_EXEC_SEC"),
        }
        for hook in NOHOOKS:
            figures[f"{hook} that does nothing, since exec (floor)"] = floors[hook]
        for label, values in figures.items():
            if values:
                print(f"  {label:46} p50 {_median(values):7.1f}  p90 "
                      f"{percentile(values, .9):7.1f}  ({len(values)} jobs)")
            else:
                print(f"  {label:46} none journaled")
        goals = {"prolog since exec": None if qstat else "<= 40",
                 "prolog since exec, qstat's own time taken out": "<= 40" if qstat else None,
                 "epilog since exec": "<= 40", "starter since exec": "<= 25"}
        for label, goal in goals.items():
            if goal is not None and figures[label]:
                floor = _median(floors[label.partition(" ")[0]])
                rows.append(Row(f"{label} ({tag}), p50", _median(figures[label]), "ms", goal,
                                floor, "a hook that does nothing"))
    write_rows(json_path, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
