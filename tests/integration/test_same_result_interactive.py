"""Issue 10, point 2: interactive jobs in a geco queue run, end normally, and are contained.

``qrsh <command>``, ``qrsh`` without a command (a login) and ``qlogin`` on
``geco-test-same.q`` (geco's starter, the exec() preload and gecod, no prolog or epilog)
are tried 20 times each. Every try must start, end with the exit code it asked for,
show from inside that it runs in the job's own cgroups (``/GECO/<job>.1`` for cpuset and
memory), bound to one core (``Cpus_allowed_list``, ``nproc``) with the job's memory limit
(``-l m_mem_free=300M``: ``memory.limit_in_bytes`` of its memory cgroup), have accounting
that says it ended normally, leave no queue instance in error state, and be gone from
the cgroup tree soon after (gecod tears a job down when its shepherd exits). A test reports
all failed tries of its kind together.

Grid Engine starts no starter_method for ``qlogin`` and ``qrsh`` without a command (its
builtin qlogin execs the owner's login shell with only SHELL, HOME, TERM, LOGNAME, TZ,
HZ and PATH): for those the preload alone contains the session, and ``JOB_ID`` is not
set inside -- in plain Grid Engine too. The job id is found with qacct (each try has a
unique job name).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.integration.livekit import job_cgroups
from tests.integration.samekit import (
    CLIENT_RACE,
    GECO,
    QUEUES,
    RACE_TRIES,
    Same,
    on_terminal,
    run,
    same_queues,
    screen_text,
    wait_until,
)

pytestmark = pytest.mark.sge

TRIES = 20
MEMORY = 300 << 20  # -l m_mem_free=300M, one slot
TOKEN = uuid.uuid4().hex[:6]

# What a try prints from inside, between two computed markers (the echo of a typed line
# never matches them): JOB_ID, its cgroups, its cpus, and its memory cgroup's limit.
INSIDE = ('echo "BEG""IN"; echo "JOB_ID=${JOB_ID-unset}"; sed "s/^/CG /" /proc/self/cgroup; '
          'grep Cpus_allowed_list /proc/self/status; echo "NPROC=$(nproc)"; '
          'm=$(sed -n "s/^[0-9]*:memory://p" /proc/self/cgroup); '
          'echo "LIMIT=$(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes 2>&1)"; '
          'echo "E""ND"')


@pytest.fixture(scope="module")
def same(sge: Any, gecod: Any, job_owner: Any) -> Iterator[Same]:
    """Both queues, gecod serving and sge_execd with the preload, a job directory."""
    with same_queues(sge, job_owner, "same-interactive") as kit:
        yield kit


def inside(text: str) -> dict[str, Any]:
    """What a try printed between BEGIN and END, parsed."""
    found = re.search(r"^BEGIN\n(.*?)^END$", text, re.MULTILINE | re.DOTALL)
    if not found:
        return {}
    lines = found.group(1).splitlines()
    cgroups = {}
    for line in lines:
        if line.startswith("CG "):
            _, controllers, path = line[3:].split(":", 2)
            for c in controllers.split(","):
                cgroups[c] = path
    fields = dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z_]+=", line))
    cpus = [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Cpus_allowed_list:")]
    return {"cgroups": cgroups, "cpus": cpus[0] if cpus else None, **fields}


def check(same: Same, kind: str, index: int) -> str | None:
    """One try of ``kind``; None when all is well, else what went wrong (with the output).

    A try whose client met Grid Engine's end-of-session race (its client says
    ``CLIENT_RACE`` though the job ran and was accounted as it should) is made
    again, up to ``RACE_TRIES`` times, as the comparisons with Grid Engine alone do:
    Grid Engine alone shows the same race, so it says nothing about geco.
    """
    for attempt in range(RACE_TRIES):
        problems, raced = _one_try(same, kind, index, attempt)
        if not raced:
            break
    return problems


def _one_try(same: Same, kind: str, index: int, attempt: int) -> tuple[str | None, bool]:
    name = f"i{TOKEN}-{kind}-{index}" + (f"-again{attempt}" if attempt else "")
    queue = QUEUES[GECO]
    base = ["-q", queue, "-N", name, "-l", "m_mem_free=300M"]
    code: int | None
    if kind == "qrsh-command":
        proc = run(same.client_argv("qrsh", *base, INSIDE + "; exit 6"), cwd=same.path,
                   check=False, timeout=90, stdin=subprocess.DEVNULL)
        transcript, code, expected = proc.stdout + proc.stderr, proc.returncode, 6
    else:
        client = "qlogin" if kind == "qlogin" else "qrsh"
        term = on_terminal(same.client_argv(client, *base), cwd=same.path,
                           say=INSIDE + "\n", until="\nEND\n", then="exit 5\n", timeout=90)
        transcript, code, expected = screen_text(term.transcript), term.code, 5
    job, accounting = same.accounting_of(name, queue)
    state = same.queue_state(queue)
    seen = inside(transcript)
    problems = []
    if code != expected:
        problems.append(f"client exit code {code}, not {expected}")
    if job is None:
        problems.append("no accounting record")
    elif [(a[1], a[2]) for a in accounting] != [("0", str(expected))]:
        problems.append(f"accounting (taskid, failed, exit_status) {accounting}")
    if "E" in state:
        problems.append(f"queue instance state {state!r}")
    if job and not wait_until(lambda: not job_cgroups(f"{job}.1"), 20):
        problems.append(f"its cgroups are still there 20 s after its end: "
                        f"{sorted(map(str, job_cgroups(f'{job}.1').values()))}")
    if not seen:
        problems.append("no BEGIN/END block from inside")
    else:
        key = f"/GECO/{job}.1"
        if seen["cgroups"].get("cpuset") != key or seen["cgroups"].get("memory") != key:
            problems.append(f"cgroups {seen['cgroups']}, not {key}")
        if not seen["cpus"] or not re.fullmatch(r"\d+", seen["cpus"]):
            problems.append(f"Cpus_allowed_list {seen['cpus']!r}, not one core")
        if seen.get("NPROC") != "1":
            problems.append(f"nproc {seen.get('NPROC')!r}")
        if seen.get("LIMIT") != str(MEMORY):
            problems.append(f"memory limit {seen.get('LIMIT')!r}, not {MEMORY}")
        # qlogin and qrsh without a command get no JOB_ID (Grid Engine's builtin qlogin)
        wanted_id = str(job) if kind == "qrsh-command" else "unset"
        if seen.get("JOB_ID") != wanted_id:
            problems.append(f"JOB_ID {seen.get('JOB_ID')!r}, not {wanted_id}")
    if not problems:
        return None, False
    raced = (problems == [f"client exit code {code}, not {expected}"]
             and CLIENT_RACE in transcript)
    return (f"try {index} (job {job}): {'; '.join(problems)}\n    output: {transcript!r}",
            raced)


@pytest.mark.parametrize("kind", ["qrsh-command", "qrsh-login", "qlogin"])
def test_interactive_jobs_in_the_geco_queue_run_contained_and_end_normally(
        same: Same, kind: str) -> None:
    """Given the geco queue, when `qrsh <command>`, `qrsh` (login) or `qlogin` is run 20
    times (two at a time: one core each), then every try runs inside /GECO/<job>.1 (cpuset
    and memory) on one core with the job's memory limit, ends with its own exit code and
    accounting "failed 0", its cgroups are removed, and no queue instance goes into error
    state."""
    same.enable()
    same.wait_idle()
    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(lambda i: check(same, kind, i), range(1, TRIES + 1))
                    if f]
    assert not failures, (f"{len(failures)} of {TRIES} {kind} tries failed:\n"
                          + "\n".join(failures))
