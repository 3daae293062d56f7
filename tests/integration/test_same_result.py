"""Issue 10: a job gives the same result with geco as without it.

Every case submits the same job to ``geco-test-same.q`` (geco's starter, the exec()
preload and gecod, no prolog or epilog: the recommended deployment) and to
``geco-test-plain.q`` (no hook of geco's), on the same host and the same sge_execd, and
compares what came of them: the job's output files, its accounting (``failed``,
``exit_status``), the client's exit code for qrsh/qlogin/``qsub -now y``, the queue
instance's state afterwards, and what a case observes itself (processes stopped by a
suspend, processes left after qdel). Only job ids, queue names and geco's ``GECO_*``
variables are normalised (see samekit). Nothing here states what the output should be
except where Grid Engine's documented behaviour is the point of the case.

sge_execd runs with the preload for this module (the ``gecod`` fixture), so a plain-queue
job is put into cgroups too, with a whole core per slot: at most 2 slots are busy at once
(samekit's docstring).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.samecases import BATCH, queues_with_scripts
from tests.integration.samekit import (
    CLIENT_RACES,
    QUEUES,
    Batch,
    Outcome,
    Same,
    assert_same,
    job_processes,
    on_terminal,
    run,
    wait_for_text,
    wait_until,
)

pytestmark = pytest.mark.sge

TOKEN = uuid.uuid4().hex[:6]  # makes qrsh/qlogin job names unique in qacct


@pytest.fixture(scope="module")
def same(sge: Any, gecod: Any, job_owner: Any) -> Iterator[Same]:
    """Both queues, gecod serving and sge_execd with the preload, a job directory."""
    with queues_with_scripts(sge, job_owner, "same") as kit:
        yield kit


@pytest.mark.parametrize("case", BATCH.values(), ids=BATCH.keys())
def test_a_batch_job_gives_the_same_result(same: Same, case: Batch) -> None:
    """Given the same qsub submission (script or -b y command, directives, -S, -v/-V, -cwd,
    -i, an array with -tc 1, -now y), when it runs in the geco queue and in the plain
    queue, then its output files, accounting, qsub's exit code (-now y) and the queue
    instance's state are the same."""
    same.compare(case, timeout=90)


MODE_CASES = {
    "script": Batch(("-cwd", "-N", "mode-script", "showbash.sh", "a b", "c$d")),
    "script-i-file": Batch(("-cwd", "-N", "mode-stdin", "-i", "input.txt", "showbash.sh")),
    "b-y": Batch(("-cwd", "-N", "mode-binary", "-b", "y", "/usr/bin/printf", "[%s]\\n", "a b",
                  "c$d")),
    "b-y-shell-no": Batch(("-cwd", "-N", "mode-noshell", "-b", "y", "-shell", "no",
                           "/usr/bin/printf", "[%s]\\n", "a b", "c$d")),
}


@pytest.mark.parametrize("kind", MODE_CASES)
@pytest.mark.parametrize("mode", ["posix_compliant", "unix_behavior", "script_from_stdin"])
def test_each_shell_start_mode_gives_the_same_result(same: Same, mode: str, kind: str) -> None:
    """Given both queues set to one shell_start_mode, when a #!/bin/bash script (with
    arguments, or with -i input), a -b y command and a -b y -shell no command run there,
    then the results are the same (posix_compliant: the queue's shell runs the script as
    a login shell; unix_behavior: its #! line decides; script_from_stdin: the shell reads
    it from stdin)."""
    with same.queue_attributes(shell_start_mode=mode):
        same.compare(MODE_CASES[kind])


# ---------------------------------------------------------------------------
# parallel jobs: qrsh -inherit
# ---------------------------------------------------------------------------

def test_qrsh_inherit_tasks_of_a_parallel_job_give_the_same_result(same: Same) -> None:
    """Given a `-pe mpi 2` job that starts tasks with `qrsh -inherit` (a command string,
    several words, -noshell, a failing task), when it runs in each queue (one after the
    other: 2 slots), then its output, .po/.pe files and accounting are the same."""
    same.compare(Batch(("-cwd", "-N", "mpi", "-pe", "mpi", "2", "mpi.sh")),
                 at_once=False)


# ---------------------------------------------------------------------------
# a running job: qdel, suspend/resume, -notify, h_rt/s_rt
# ---------------------------------------------------------------------------

def _started(same: Same, side: str, args: tuple[str, ...], name: str) -> int:
    """Submit a job and wait until its .o file says "ready" or "start"."""
    job, _ = same.qsub(QUEUES[side], args)
    out = same.path / f"{name}.o{job}"
    assert wait_until(lambda: out.exists() and re.search(r"^(ready|start)$", out.read_text(),
                                                         re.MULTILINE) is not None, 60), (
        f"job {job} in {QUEUES[side]} did not start: {same.error_reason(job)}")
    return job


def _leftovers(same: Same, job: int) -> list[str]:
    """Commands of the job's processes still alive a while after it left qstat."""
    wait_until(lambda: not job_processes(job, same.owner.uid), 15)
    left = []
    for pid in job_processes(job, same.owner.uid):
        with contextlib.suppress(OSError):
            left.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return sorted(left)


def test_qdel_of_a_running_job_gives_the_same_result(same: Same) -> None:
    """Given a running job whose three children count in the background, when it is
    deleted with qdel, then its accounting is the same and none of its processes is
    left, in both queues."""
    def case(side: str) -> Outcome:
        args = ("-cwd", "-N", "qdel", "counters.sh")
        job = _started(same, side, args, "qdel")
        before = len(job_processes(job, same.owner.uid))
        run(["qdel", str(job)])
        accounting = same.finish(job)
        return same.outcome(side, job, args, accounting, processes_before=before >= 4,
                            left=_leftovers(same, job))

    assert_same(same.both(case), "qdel of a running job")


def _all_stopped(same: Same, job: int) -> bool:
    states = job_processes(job, same.owner.uid)
    return bool(states) and all(s == "T" for s in states.values())


def _counts(same: Same, job: int) -> list[int]:
    counts = []
    for i in (1, 2, 3):
        try:
            counts.append(int((same.path / f"count.{job}.{i}").read_text() or 0))
        except (OSError, ValueError):
            counts.append(0)
    return counts


def test_suspend_and_resume_of_a_running_job_give_the_same_result(same: Same) -> None:
    """Given a running job whose three children count in the background, when it is
    suspended with qmod -sj, then every process of the job is stopped (state T in /proc),
    and after qmod -usj all three count on; the job ends normally, in both queues."""
    def case(side: str) -> Outcome:
        args = ("-cwd", "-N", "suspend", "counters.sh")
        job = _started(same, side, args, "suspend")
        wait_until(lambda: all(_counts(same, job)), 30)
        run(["qmod", "-sj", str(job)])
        stopped = wait_until(lambda: _all_stopped(same, job), 30)
        states = sorted(job_processes(job, same.owner.uid).values())
        frozen = _counts(same, job)
        run(["qmod", "-usj", str(job)])
        resumed = wait_until(lambda: all(a > b for a, b in zip(_counts(same, job), frozen,
                                                               strict=True)), 30)
        same.write(f"stop.{job}", "")
        accounting = same.finish(job)
        return same.outcome(side, job, args, accounting, all_stopped=stopped,
                            states_when_suspended=sorted(set(states)), resumed=resumed,
                            left=_leftovers(same, job))

    assert_same(same.both(case), "qmod -sj / -usj")


def test_notify_before_suspend_and_delete_gives_the_same_result(same: Same) -> None:
    """Given a -notify job that traps SIGUSR1 and SIGUSR2 and queues whose notify time is
    2 s, when it is suspended (qmod -sj: SIGUSR1, then SIGSTOP), resumed, and deleted
    (qdel: SIGUSR2, then SIGKILL), then its output (both traps) and accounting are the
    same in both queues."""
    def case(side: str) -> Outcome:
        args = ("-cwd", "-N", "notify", "-notify", "notify.py")
        job = _started(same, side, args, "notify")
        out = same.path / f"notify.o{job}"
        run(["qmod", "-sj", str(job)])
        usr1 = wait_for_text(out, "got SIGUSR1", 30)
        stopped = wait_until(lambda: _all_stopped(same, job), 30)
        run(["qmod", "-usj", str(job)])
        running = wait_until(lambda: not _all_stopped(same, job), 30)
        run(["qdel", str(job)])
        usr2 = wait_for_text(out, "got SIGUSR2", 30)
        accounting = same.finish(job)
        outcome = same.outcome(side, job, args, accounting, usr1=usr1, stopped=stopped,
                               resumed=running, usr2=usr2, left=_leftovers(same, job))
        outcome.outputs = {name: _once(text) for name, text in outcome.outputs.items()}
        return outcome

    with same.queue_attributes(notify="00:00:02"):
        assert_same(same.both(case), "-notify with qmod -sj and qdel")


def _once(text: str) -> str:
    """``text`` with a line repeated right after itself kept once. Grid Engine itself
    delivers a notify signal once or twice (seen in plain Grid Engine: "got USR1" once in
    some runs, twice in others; two that arrive before the handler runs are one), so
    which signals arrived and in which order is compared, not how often."""
    kept: list[str] = []
    for line in text.split("\n"):
        if not kept or line != kept[-1]:
            kept.append(line)
    return "\n".join(kept)


@pytest.mark.parametrize("limit", ["h_rt=5", "s_rt=5"])
def test_a_job_past_its_run_time_limit_ends_the_same_way(same: Same, limit: str) -> None:
    """Given a job that sleeps 60 s and says so when SIGUSR1 arrives, when it runs past
    -l h_rt=5 (SIGKILL: "failed 37", exit 137) or -l s_rt=5 (SIGUSR1, which ends it),
    then its output and accounting are the same in both queues."""
    same.compare(Batch(("-cwd", "-N", "limit", "-l", limit, "sleeper.py")), timeout=90)


# ---------------------------------------------------------------------------
# qrsh and qlogin
# ---------------------------------------------------------------------------

QRSH = {
    "command-string": ("echo hi there; echo err >&2; exit 3",),
    "words-joined-by-qrsh": ("/usr/bin/printf", "[%s]\\n", "a b", "c$d"),
    "noshell": ("-noshell", "/bin/echo", "a", "b"),
    "noshell-words": ("-noshell", "/usr/bin/printf", "[%s]\\n", "a b", "c$d"),
    "the-shell-that-runs-it": (
        "echo \"argv: $(tr '\\0' ' ' < /proc/$$/cmdline)\"; cat /proc/$PPID/comm; "
        "echo \"SHELL=$SHELL PWD=$PWD\"; exit 7",),
}


def _name(case: str) -> str:
    """A job name unique in qacct: ``s<token>-<case>``, without characters Grid Engine
    refuses in names."""
    return f"s{TOKEN}-{re.sub(r'[^A-Za-z0-9]', '', case)[:20]}"


@pytest.mark.parametrize("args", QRSH.values(), ids=QRSH.keys())
def test_qrsh_with_a_command_gives_the_same_result(same: Same, args: tuple[str, ...],
                                                   request: pytest.FixtureRequest) -> None:
    """Given `qrsh <command>` without a terminal (a command string, several words that
    qrsh joins for the owner's shell, -noshell), when it runs in each queue, then qrsh's
    stdout, stderr and exit code, the job's accounting and the queue's state are the
    same."""
    results = same.both_interactive(lambda side, name: same.qrsh(side, name, args)[1],
                                    _name(request.node.callspec.id))
    assert_same(results, f"qrsh {' '.join(args)}")


PTY_COMMAND = "tty >/dev/null && echo on-a-tty || echo no-tty; echo hi; exit 4"


@pytest.mark.parametrize("pty", ["y", "n"])
def test_qrsh_on_a_terminal_with_and_without_a_pty_gives_the_same_result(
        same: Same, pty: str) -> None:
    """Given `qrsh -pty y|n <command>` typed on a terminal, when it runs in each queue,
    then what the terminal shows and qrsh's exit code are the same."""
    def case(side: str, name: str) -> Outcome:
        term = on_terminal(same.client_argv("qrsh", "-q", QUEUES[side], "-N", name, "-pty",
                                            pty, PTY_COMMAND), cwd=same.path, timeout=60)
        return same.interactive_outcome(side, name, {"pty": term.transcript},
                                        -1 if term.code is None else term.code)[1]

    assert_same(same.both_interactive(case, _name(f"pty{pty}")), f"qrsh -pty {pty}",
                worked=lambda outcome: "\nhi\n" in f"\n{outcome.outputs['pty']}")


# what a login session is asked; the marker is computed, so the echo of the typed line
# never matches it
LOGIN_LINE = ('echo "MARK$((6*7)):$(tr \'\\0\' \' \' < /proc/$$/cmdline):'
              '$(shopt -q login_shell && echo login):${JOB_ID-nojobid}:$PWD"\n')
MARK = re.compile(r"MARK42:([^\n]*)")


def login_session(same: Same, side: str, client: str, name: str) -> tuple[int | None, Outcome]:
    """``qlogin`` or ``qrsh`` without a command on a terminal: wait for the shell, type
    :data:`LOGIN_LINE`, then ``exit 5``; the outcome holds the marker line and the exit
    code."""
    term = on_terminal(same.client_argv(client, "-q", QUEUES[side], "-N", name),
                       cwd=same.path, say=LOGIN_LINE, until="MARK42", then="exit 5\n",
                       timeout=60)
    found = MARK.search(term.transcript)
    return same.interactive_outcome(side, name, {}, -1 if term.code is None else term.code,
                                    marker=found.group(1).strip() if found else
                                    f"no marker in {term.transcript!r}",
                                    # Grid Engine's own race, if met (samekit.raced)
                                    race=next((race for race in CLIENT_RACES
                                               if race in term.transcript), ""))


@pytest.mark.parametrize("client", ["qlogin", "qrsh"])
def test_a_login_session_gives_the_same_result(same: Same, client: str) -> None:
    """Given `qlogin` or `qrsh` without a command on a terminal, when a line is typed and
    then `exit 5`, then the shell (a login shell, its argv, cwd) and the exit code are the
    same in both queues."""
    results = same.both_interactive(
        lambda side, name: login_session(same, side, client, name)[1], _name(f"login{client}"))
    assert_same(results, client, worked=lambda outcome: outcome.client == 5)


def test_no_queue_is_left_in_error_state(same: Same, sge: Any) -> None:
    """Given every case above, then neither test queue is in error state (each case also
    records its queue's state) and no job of the test user is left in them."""
    left = run(["qstat", "-u", same.owner.name, "-q", ",".join(QUEUES.values())]).stdout
    states = {q: s for q, s in sge.queue_states().items()
              if q.split("@")[0] in QUEUES.values()}
    assert left.strip() == ""
    assert {q: s for q, s in states.items() if "E" in s} == {}

