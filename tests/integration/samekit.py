"""What the differential tests share: the same submissions to a queue with geco and to one
without, on the same host and the same sge_execd, and their results side by side.

``geco-test-same.q`` runs geco the recommended way with the exec() preload: no prolog or
epilog, ``starter_method /usr/libexec/geco/starter`` (gecod sets a job up at its
shepherd's exec and tears it down when the shepherd exits). ``geco-test-plain.q`` has no
hook of geco's at all: what Grid Engine itself does. Both are copies of all.q with 2
slots. sge_execd runs with the preload, so gecod puts every job's shepherd -- also a
plain-queue job's -- into the job's cgroups and gives each slot a whole core: on this
2-core machine at most 2 slots may be busy at once in both queues together, else gecod
bounces a job. So a 1-slot case runs its two submissions at once (one per queue),
a 2-slot case one queue after the other, and every case starts only once both queues
are idle (:meth:`Same.wait_idle`).

A case's result is an :class:`Outcome`: the job's output files, its accounting
(``failed``, ``exit_status``), the client's exit code (qrsh, qlogin), the state of its
queue instance afterwards and what a case observes itself (``extra``). Only what must
differ is normalised: job ids (``<JOB>``), queue names (``<QUEUE>``) and geco's own
``GECO_*`` variables (their lines dropped). :func:`assert_same` compares the two sides
and prints both on a difference.

Knobs (environment): ``GECO_TEST_SHOW_SAME=1`` prints every comparison, also those that
pass (with ``pytest -s``); ``GECO_TEST_SAME_STARTER=<path>`` puts another starter_method
into the geco queue (a candidate starter, or an older one to compare with).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

GECO = "geco"
PLAIN = "plain"
QUEUES = {GECO: "geco-test-same.q", PLAIN: "geco-test-plain.q"}
STARTER = "/usr/libexec/geco/starter"
# what a test user's client runs with (runuser adds HOME, USER, LOGNAME, SHELL)
CLIENT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
GECO_LINE = re.compile(r"^(?:declare -x |export )?GECO_[A-Z0-9_]*=.*(?:\n|$)", re.MULTILINE)
# qstat's "error reason" line: "<date> <time> [uid:pid]: <text>"
ERROR_REASON = re.compile(r"^error reason\s+\d+:\s+.*?\[\d+:\d+\]:\s*(.*)$", re.MULTILINE)

T = TypeVar("T")

# Races inside Grid Engine's qrsh/qlogin client at a session's end, met on either queue
# (plain Grid Engine too); a try that meets one in a job that ran to its end is run again:
# * once a session has ended, the client asks qmaster about the job; when qmaster has
#   already removed the finished job, the client prints the first and exits 1 instead of
#   with the job's exit status (source/clients/qsh/qsh.c, the polling loop);
# * the builtin interactive job support's connection to the shepherd (shepherd_ijs) may be
#   closed by the shepherd before the client's last read: commlib prints the second on
#   the client's stderr, the client exits 0 all the same (seen on the plain queue).
CLIENT_RACE = "request could not be scheduled, try again later"
CLIENT_RACES = (CLIENT_RACE, 'commlib error: got pipe error (closing "')
RACE_TRIES = 3


def run(argv: Sequence[str], *, timeout: float = 60, check: bool = True,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a command (clean environment unless ``env`` is given); raise on failure."""
    kwargs.setdefault("env", CLIENT_ENV)
    # errors=replace: qstat -j shows a qrsh job's QRSH_COMMAND, its words split by 0xff
    proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                          timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}\n"
                           f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}")
    return proc


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one submission came to, normalised (see the module docstring).

    Attributes
    ----------
    outputs: the job's output files by (normalised) name -- ``name.o<JOB>``, ``.e``, per
        array task ``.o<JOB>.<task>``, a PE job's ``.po``/``.pe`` -- or, for a qrsh/qlogin
        client, ``stdout``/``stderr`` (``pty`` for what a terminal showed).
    accounting: per qacct record (task order): ``(taskid, failed, exit_status)``; a job held
        in error state or not finished in time reads ``("-", "never finished", why)``.
    client: exit code of qrsh/qlogin/qsub -now (None for a plain qsub).
    queue_state: the state letters of the job's queue instance afterwards ("" = fine).
    extra: what the case observed itself (processes stopped, left behind, ...).
    """

    outputs: dict[str, str] = field(default_factory=dict)
    accounting: list[tuple[str, str, str]] = field(default_factory=list)
    client: int | None = None
    queue_state: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def normalise(text: str, jobs: Sequence[int], queue: str) -> str:
    """``text`` with the job ids, the queue's name and GECO_* variable lines replaced."""
    for job in jobs:
        text = re.sub(rf"(?<![0-9]){job}(?![0-9])", "<JOB>", text)
    text = text.replace(queue, "<QUEUE>")
    return GECO_LINE.sub("", text)


def normalised_records(records: Sequence[tuple[str, str, str]], jobs: Sequence[int],
                       queue: str) -> list[tuple[str, str, str]]:
    return [(normalise(a, jobs, queue), normalise(b, jobs, queue), normalise(c, jobs, queue))
            for a, b, c in records]


def _swap(action: Callable[[str, str], Outcome], name: str, side: str) -> Outcome:
    return action(side, name)


def raced(outcome: Outcome) -> bool:
    """True when the client met one of Grid Engine's end-of-session races
    (``CLIENT_RACES``) in a job that ran to its end (accounting ``failed 0``)."""
    said = " ".join([*outcome.outputs.values(), *map(str, outcome.extra.values())])
    return any(race in said for race in CLIENT_RACES) \
        and [a[1] for a in outcome.accounting] == ["0"]


def unraced(attempt: Callable[[int], dict[str, Outcome]]) -> dict[str, Outcome]:
    """``attempt(n)`` for n = 0, 1, ... until neither side's outcome :func:`raced`, at
    most ``RACE_TRIES`` times; the last try's outcomes."""
    for tried in range(RACE_TRIES):
        results = attempt(tried)
        if not any(raced(outcome) for outcome in results.values()):
            break
    return results


def describe(outcome: Outcome) -> str:
    """The outcome as readable text, each output file verbatim."""
    lines = []
    for name, text in outcome.outputs.items():
        lines.append(f"  {name}:")
        lines += [f"    | {line}" for line in text.split("\n")]
    lines.append(f"  accounting (taskid, failed, exit_status): {outcome.accounting}")
    if outcome.client is not None:
        lines.append(f"  client exit code: {outcome.client}")
    lines.append(f"  queue state: {outcome.queue_state!r}")
    lines += [f"  {key}: {value!r}" for key, value in outcome.extra.items()]
    return "\n".join(lines)


def assert_same(results: Mapping[str, Outcome], what: str = "",
                worked: Callable[[Outcome], bool] | None = None) -> None:
    """Assert that geco's outcome equals plain Grid Engine's, and that no queue is in error;
    on a difference print both sides and name the fields that differ. ``worked`` tells
    whether the case did what it is about on plain Grid Engine (a session that never
    started would be "the same" on both sides and prove nothing)."""
    geco, plain = results[GECO], results[PLAIN]
    if worked is not None and not worked(plain):
        raise AssertionError(f"{what}: the case did not work on plain Grid Engine, so the "
                             f"comparison would prove nothing\n--- plain Grid Engine "
                             f"({QUEUES[PLAIN]})\n{describe(plain)}\n--- with geco "
                             f"({QUEUES[GECO]})\n{describe(geco)}")
    differ = [name for name in ("outputs", "accounting", "client", "queue_state", "extra")
              if getattr(geco, name) != getattr(plain, name)]
    errors = {side: r.queue_state for side, r in results.items() if "E" in r.queue_state}
    if os.environ.get("GECO_TEST_SHOW_SAME") == "1":  # pytest -s: see what was compared
        print(f"\n=== {what}\n--- with geco\n{describe(geco)}\n--- plain\n{describe(plain)}")
    if differ or errors:
        diffs: list[str] = []
        for name in sorted(set(geco.outputs) | set(plain.outputs)):
            ours, theirs = geco.outputs.get(name), plain.outputs.get(name)
            if ours != theirs:
                diffs += difflib.unified_diff(
                    (theirs or "").splitlines(), (ours or "").splitlines(),
                    f"{name} (plain)" if theirs is not None else "(no such file: plain)",
                    f"{name} (geco)" if ours is not None else "(no such file: geco)",
                    lineterm="", n=1)
        raise AssertionError(
            f"{what or 'the case'}: geco and plain Grid Engine differ in "
            f"{', '.join(differ) or 'nothing'}"
            f"{f'; queue instances in error state: {errors}' if errors else ''}\n"
            f"--- with geco ({QUEUES[GECO]})\n{describe(geco)}\n"
            f"--- plain Grid Engine ({QUEUES[PLAIN]})\n{describe(plain)}"
            + ("\n--- the outputs' differences\n" + "\n".join(diffs) if diffs else ""))


# ---------------------------------------------------------------------------
# a submission
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """One qsub submission, the same for both queues.

    Attributes
    ----------
    args: qsub's arguments after ``-q <queue>`` (script or command and its arguments last;
        the job's files are found by its id).
    env: added to the submitting client's environment (what ``-V`` exports).
    tasks: array task ids (``-t``); empty for a plain job.
    worked: what Grid Engine is documented to do here, checked on the plain side (see
        :func:`assert_same`); None: nothing is stated.
    """

    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    tasks: tuple[int, ...] = ()
    worked: Callable[[Outcome], bool] | None = field(default=None, compare=False)


class Same:
    """Both queues, a job directory of the test user, and the helpers that drive them."""

    def __init__(self, sge: Any, owner: Any, path: Path) -> None:
        self.sge = sge
        self.owner = owner
        self.path = path

    # -- files and queues ----------------------------------------------------------

    def write(self, name: str, text: str, mode: int = 0o755) -> Path:
        """Write a file of the test user into the job directory."""
        path = self.path / name
        path.write_text(text)
        os.chown(path, self.owner.uid, self.owner.gid)
        path.chmod(mode)
        return path

    def instance(self, queue: str) -> str:
        return f"{queue}@{self.sge.host}"

    @contextlib.contextmanager
    def queue_attributes(self, **values: str) -> Iterator[None]:
        """Set queue attributes on both queues for the with-block, then restore them."""
        saved = {}
        for queue in QUEUES.values():
            conf = queue_config(queue)
            saved[queue] = {attr: conf[attr] for attr in values}
        try:
            for queue in QUEUES.values():
                for attr, value in values.items():
                    run(["qconf", "-mattr", "queue", attr, value, queue])
            yield
        finally:
            for queue, attrs in saved.items():
                for attr, value in attrs.items():
                    run(["qconf", "-mattr", "queue", attr, value, queue], check=False)

    def used_slots(self) -> int:
        """Slots in use in both queues together (qstat -f)."""
        used = 0
        for line in run(["qstat", "-f", "-q", ",".join(QUEUES.values())]).stdout.splitlines():
            cols = line.split()
            if len(cols) >= 3 and cols[0] in {self.instance(q) for q in QUEUES.values()}:
                used += int(cols[2].split("/")[1])
        return used

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no slot of either queue is in use (the cores gecod hands out are
        free again once it has torn the last job down; its allocation waits for that)."""
        deadline = time.monotonic() + timeout
        while self.used_slots():
            assert time.monotonic() < deadline, f"test queues still busy after {timeout} s"
            time.sleep(0.2)

    def queue_state(self, queue: str) -> str:
        """The queue instance's state letters; an error state (E) or a disabled instance
        (d) is recorded by the caller and cleared here, so no later case inherits it."""
        state = str(self.sge.queue_states().get(self.instance(queue), "?"))
        if "E" in state:
            run(["qmod", "-c", self.instance(queue)], check=False)
        if "d" in state:
            run(["qmod", "-e", self.instance(queue)], check=False)
        return state

    # -- batch jobs ----------------------------------------------------------------

    def qsub(self, queue: str, args: Sequence[str], env: Mapping[str, str] | None = None,
             timeout: float = 60) -> tuple[int, subprocess.CompletedProcess[str]]:
        """Submit as the test user from the job directory; return the job id and qsub."""
        proc = run(["runuser", "-u", self.owner.name, "--", "qsub", "-q", queue, *args],
                   cwd=self.path, env={**CLIENT_ENV, **(env or {})}, timeout=timeout,
                   check=False)
        found = re.search(r"^Your (?:immediate )?job(?:-array)? (\d+)[ .]", proc.stdout,
                          re.MULTILINE)
        if not found:
            raise RuntimeError(f"qsub printed no job id (exit {proc.returncode}):\n"
                               f"{proc.stdout}{proc.stderr}")
        return int(found.group(1)), proc

    def finish(self, job: int, tasks: int = 1, timeout: float = 60) -> list[tuple[str, str, str]]:
        """Wait until the job has left qstat, then return its accounting (see
        :attr:`Outcome.accounting`). A job held in error state or not finished in
        time is deleted, and that is what the result says."""
        deadline = time.monotonic() + timeout
        while self.sge.is_known(job):
            why = self.error_reason(job)
            if why is None and time.monotonic() > deadline:
                why = f"still in qstat after {timeout} s"
            if why is not None:
                run(["qdel", "-f", str(job)], check=False)
                return [("-", "never finished", why)]
            time.sleep(0.2)
        while True:
            records = self.sge.accounting(job)
            if len(records) >= tasks or time.monotonic() > deadline:
                return sorted((r.get("taskid", "?"), r.get("failed", "?"),
                               r.get("exit_status", "?")) for r in records)
            time.sleep(0.2)

    def error_reason(self, job: int) -> str | None:
        """Why the job is held in error state (Eqw), or None."""
        for line in run(["qstat", "-u", self.owner.name], check=False).stdout.splitlines():
            cols = line.split()
            if len(cols) > 4 and cols[0] == str(job) and "E" in cols[4]:
                detail = run(["qstat", "-j", str(job)], check=False).stdout
                return "; ".join(ERROR_REASON.findall(detail)) or f"state {cols[4]}"
        return None

    def output_dir(self, args: Sequence[str]) -> Path:
        """Where Grid Engine writes the job's files: the job directory with -cwd, else home."""
        return self.path if "-cwd" in args else self.owner.home

    def outputs(self, directory: Path, job: int, queue: str, *, remove: bool = False
                ) -> dict[str, str]:
        """The job's output files in ``directory`` by normalised name, normalised."""
        found = {}
        pattern = re.compile(rf"\.(?:o|e|po|pe){job}(?:\.\d+)?$")
        for path in sorted(directory.iterdir()):
            if pattern.search(path.name):
                found[normalise(path.name, [job], queue)] = normalise(
                    path.read_text(errors="replace"), [job], queue)
                if remove:
                    path.unlink()
        return found

    def batch(self, side: str, case: Batch, timeout: float = 60) -> Outcome:
        """Submit ``case`` to one side's queue, wait for it, and return its outcome."""
        queue = QUEUES[side]
        job, proc = self.qsub(queue, case.args, case.env)
        accounting = self.finish(job, max(1, len(case.tasks)), timeout)
        outcome = self.outcome(side, job, case.args, accounting)
        if "-now" in case.args:  # qsub waited for the job to be scheduled
            outcome.client = proc.returncode
        return outcome

    def outcome(self, side: str, job: int, args: Sequence[str],
                accounting: list[tuple[str, str, str]], **extra: Any) -> Outcome:
        """A finished batch job's outcome (files read; those in the home dir removed)."""
        queue = QUEUES[side]
        directory = self.output_dir(args)
        outputs = self.outputs(directory, job, queue, remove=directory == self.owner.home)
        return Outcome(outputs, normalised_records(accounting, [job], queue), None,
                       self.queue_state(queue), extra)

    def enable(self) -> None:
        """Enable a test queue instance someone disabled (``qmod -d *@host``)."""
        states = self.sge.queue_states()
        for queue in QUEUES.values():
            if "d" in states.get(self.instance(queue), ""):
                run(["qmod", "-e", self.instance(queue)], check=False)

    def both(self, action: Callable[[str], T], *, at_once: bool = True) -> dict[str, T]:
        """Run ``action(side)`` for both sides: at once (two 1-slot jobs fill the machine's
        two cores), or geco's first and then plain's (for jobs of 2 slots)."""
        self.enable()
        self.wait_idle()
        if not at_once:
            results = {}
            for side in (GECO, PLAIN):
                results[side] = action(side)
                self.wait_idle()
            return results
        with ThreadPoolExecutor(2) as pool:
            futures = {side: pool.submit(action, side) for side in (GECO, PLAIN)}
            return {side: future.result() for side, future in futures.items()}

    def compare(self, case: Batch, *, at_once: bool = True, timeout: float = 60) -> None:
        """Submit the case to both queues and assert the outcomes are the same (a try in
        which a client inside the job -- ``qrsh -inherit`` -- met one of Grid Engine's
        races is run again, see :func:`unraced`)."""
        results = unraced(lambda _: self.both(lambda side: self.batch(side, case, timeout),
                                              at_once=at_once))
        assert_same(results, f"qsub {' '.join(case.args)}", case.worked)

    # -- interactive jobs ----------------------------------------------------------

    def both_interactive(self, action: Callable[[str, str], Outcome],
                         name: str) -> dict[str, Outcome]:
        """:meth:`both` for an interactive client, ``action(side, job name)``: a try in
        which either side's client met an end-of-session race of Grid Engine's
        (``CLIENT_RACES``)
        although its job ran to its end is run again under a new name, up to
        ``RACE_TRIES`` times; the last try's outcomes are returned."""
        return unraced(lambda attempt: self.both(functools.partial(
            _swap, action, f"{name}{attempt}" if attempt else name)))


    def client_argv(self, *argv: str) -> list[str]:
        return ["runuser", "-u", self.owner.name, "--", *argv]

    def accounting_of(self, name: str, queue: str, timeout: float = 30
                      ) -> tuple[int | None, list[tuple[str, str, str]]]:
        """Job id and accounting of the (uniquely named) job that ran in ``queue``; a job
        Grid Engine holds in error state instead (its client has given up) is deleted."""
        deadline = time.monotonic() + timeout
        while True:
            records = [r for r in self.sge.accounting(name) if r.get("qname") == queue]
            if records:
                break
            held = self.job_named(name, queue)
            why = self.error_reason(held) if held else None
            if held and why:
                run(["qdel", "-f", str(held)], check=False)
                return held, [("-", "never finished", why)]
            if time.monotonic() > deadline:
                if held:
                    run(["qdel", "-f", str(held)], check=False)
                return held, [("-", "no accounting record", f"still in qstat: {held}")]
            time.sleep(0.2)
        job = int(records[0]["jobnumber"])
        found = sorted((r.get("taskid", "?"), r.get("failed", "?"), r.get("exit_status", "?"))
                       for r in records)
        # a job that exited 100 has its record and is held in error state (Eqw) as well
        if not wait_until(lambda: not self.sge.is_known(job), 5, 0.2):
            found.append(("-", "held after its end", self.error_reason(job) or "in qstat"))
            run(["qdel", "-f", str(job)], check=False)
        return job, found

    def job_named(self, name: str, queue: str) -> int | None:
        """The id of the job named ``name`` that qstat lists with ``-q queue``, or None."""
        out = run(["qstat", "-j", name], check=False).stdout
        for block in re.split(r"^=+$", out, flags=re.MULTILINE):
            number = re.search(r"^job_number:\s+(\d+)", block, re.MULTILINE)
            queues = re.search(r"^hard_queue_list:\s+(\S+)", block, re.MULTILINE)
            if number and queues and queue in queues.group(1).split(","):
                return int(number.group(1))
        return None

    def interactive_outcome(self, side: str, name: str, outputs: Mapping[str, str],
                            client: int, **extra: Any) -> tuple[int | None, Outcome]:
        """The outcome of a qrsh/qlogin job named ``name`` (unique) on ``side``."""
        queue = QUEUES[side]
        job, accounting = self.accounting_of(name, queue)
        jobs = [job] if job else []
        return job, Outcome({k: normalise(v, jobs, queue) for k, v in outputs.items()},
                            normalised_records(accounting, jobs, queue),
                            client, self.queue_state(queue),
                            {k: normalise(v, jobs, queue) if isinstance(v, str) else v
                             for k, v in extra.items()})

    def qrsh(self, side: str, name: str, args: Sequence[str], timeout: float = 60
             ) -> tuple[int | None, Outcome]:
        """``qrsh -q <queue> -N <name> args`` as the test user, stdin empty (no terminal)."""
        proc = run(self.client_argv("qrsh", "-q", QUEUES[side], "-N", name, *args),
                   cwd=self.path, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        return self.interactive_outcome(side, name, {"stdout": proc.stdout,
                                                     "stderr": proc.stderr}, proc.returncode)


# ---------------------------------------------------------------------------
# a terminal for qlogin, qrsh without a command and qrsh -pty y
# ---------------------------------------------------------------------------

@dataclass
class Terminal:
    """What a client driven through a pseudo-terminal showed, and its exit code."""

    transcript: str
    code: int | None  # None: still running at the deadline (killed)


PROMPT = r"\$ $"  # a shell prompt at the end of what the terminal shows


def on_terminal(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                say: str = "", until: str = "", then: str = "", timeout: float = 60
                ) -> Terminal:
    """Run ``argv`` on a new pseudo-terminal as its controlling terminal (what
    ``pty.fork()`` gives, without forking this threaded process: ``setsid -c``) and talk
    to it: once the terminal shows a shell prompt (:data:`PROMPT`), type ``say`` (a line),
    again every 5 s until the terminal shows ``until``, then type ``then``; read until the
    client closes the terminal (EOF) or ``timeout`` seconds passed (then it is killed).

    Nothing is typed before the prompt: a line typed while Grid Engine's builtin qlogin
    is still connecting ends the session at once (client exit 0, qacct "failed 100"), in
    plain Grid Engine too.
    """
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(["setsid", "-w", "-c", *argv], stdin=slave, stdout=slave,
                                stderr=slave, cwd=cwd, env={**CLIENT_ENV, "TERM": "xterm",
                                                            **(env or {})})
    finally:
        os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    said_at = -1e9
    done_saying = not say
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not done_saying:
                if until and until.encode() in out.replace(b"\r\n", b"\n"):
                    done_saying = True
                    if then:
                        os.write(master, then.encode())
                elif now - said_at >= 5 and re.search(PROMPT, out.decode(errors="replace")):
                    os.write(master, say.encode())
                    said_at = now
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every slave fd is closed
                    break
                if not chunk:
                    break
                out += chunk
        else:
            proc.kill()
        try:
            code: int | None = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
    finally:
        os.close(master)
    if code is not None and time.monotonic() >= deadline:
        code = None
    return Terminal(out.decode(errors="replace").replace("\r\n", "\n"), code)


def screen_text(transcript: str) -> str:
    """A terminal transcript as the lines a user saw: escape sequences (colours, bracketed
    paste, window titles) dropped, and of a line rewritten after a carriage return only
    what was written last."""
    text = re.sub(r"\x1b\][^\x07]*\x07|\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]", "", transcript)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


# ---------------------------------------------------------------------------
# a job's processes
# ---------------------------------------------------------------------------

def job_processes(job: int, uid: int) -> dict[int, str]:
    """``{pid: state letter}`` of the processes of ``uid`` whose environment says
    ``JOB_ID=<job>`` (a batch job's processes in either queue, found the same way)."""
    marker = f"JOB_ID={job}\0".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if environ.startswith(marker) or b"\0" + marker in environ:
            found[int(entry.name)] = stat.rsplit(")", 1)[1].split()[0]
    return found


def wait_until(condition: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def wait_for_text(path: Path, text: str, timeout: float = 60) -> bool:
    """Wait until the file exists and contains ``text``."""
    return wait_until(lambda: path.exists() and text in path.read_text(errors="replace"),
                      timeout)


# ---------------------------------------------------------------------------
# the two queues
# ---------------------------------------------------------------------------

def queue_config(queue: str) -> dict[str, str]:
    """``qconf -sq <queue>`` as ``{key: value}``."""
    out = run(["qconf", "-sq", queue]).stdout.replace("\\\n", " ")
    return {k: " ".join(v.split()) for k, _, v in
            (line.partition(" ") for line in out.splitlines()) if k}


@contextlib.contextmanager
def same_queues(sge: Any, owner: Any, prefix: str) -> Iterator[Same]:
    """Add ``geco-test-same.q`` (geco's starter, no prolog/epilog) and
    ``geco-test-plain.q`` (no hooks), copies of all.q with 2 slots; delete them afterwards
    (``sge.temporary_queue``). The caller holds the ``gecod`` fixture (gecod serving,
    execd with the preload)."""
    starters = {GECO: os.environ.get("GECO_TEST_SAME_STARTER") or STARTER, PLAIN: "NONE"}
    with contextlib.ExitStack() as stack:
        for side, queue in QUEUES.items():
            stack.enter_context(sge.temporary_queue(queue, prolog="NONE", epilog="NONE",
                                                    slots="2", starter_method=starters[side]))
        same = Same(sge, owner, owner.make_dir(prefix))
        wait_until(lambda: all(same.instance(q) in sge.queue_states()
                               for q in QUEUES.values()), 30)
        yield same
