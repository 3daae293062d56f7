"""Session fixtures that start the real services geco works with.

A clean slate first
    At session start, when no other geco test session runs on this machine (a shared
    lock on ``/run/lock/geco-test-session.users``, held for the whole session; an
    exclusive one could be had first), :func:`cleanslate.clean_slate` undoes what
    ``demo.sh`` or an interrupted session left: a gecod serving the site socket, a
    rewritten ``/etc/geco/geco.toml``, jobs of the test user, test queues, job cgroups
    of jobs that no longer run. What it did is one line of pytest's output, e.g.
    ``geco tests: stopped gecod pid 1234 left serving /run/geco/gecod.sock (by demo.sh
    or an interrupted run); restored /etc/geco/geco.toml``.

The node as it was, at the end
    Before the clean slate, :func:`nodestate.record` notes what the session will change:
    all.q's configuration, the LD_PRELOAD sge_execd runs with, the gecod serving the site
    socket and how it was started (``/run/geco-tests-node-state.json``). At session end
    (after Ctrl-C too), when no other geco test session runs, :func:`nodestate.restore`
    puts back what differs -- on a node where ``demo.sh`` ran: its starter-only queue, execd
    with the preload, its gecod -- and says so in one line. A session killed outright
    leaves the file; the next session keeps it and restores it at its end.

``journal``
    A running journald. An existing one (``/run/systemd/journal/socket`` that
    accepts a datagram) is used as it is; otherwise ``/lib/systemd/systemd-journald``
    is started by hand -- it needs no systemd as PID 1: it creates its sockets
    (``socket``, ``stdout``, ``dev-log``, ``io.systemd.journal`` in
    ``/run/systemd/journal/``) and its runtime journal in ``/run/log/journal/`` itself
    -- and stopped again, by its pid, at session end. ``journal.entries(JOB_ID="42")``
    returns the entries of this session that match, as journalctl's JSON objects.

``sge``
    A running single-host Grid Engine, brought up by ``integration/sge/setup.sh``
    (returns in ~0.3 s when it already runs with the same settings). geco's hooks
    are configured for each of ``/usr/libexec/geco/{prolog,epilog,starter}`` that
    exists (``scripts/install.sh`` puts them there; ``GECO_TEST_HOOKS=0`` configures
    none, ``GECO_TEST_HOOKS=starter`` only the starter, as on a node whose execd has
    the preload); a test that needs them calls ``sge.require_hooks()`` and fails loudly
    when they are missing.

    Lifetime: daemons that were running before the session are left running. Daemons
    this session started are stopped at its end with ``teardown.sh --no-wait``: jobs
    deleted and execd stopped (~2 s, so no job process outlives the session), qmaster
    told to shut down without waiting the ~10 s it takes (setup.sh waits for it
    should the next session come sooner). ``GECO_KEEP_SGE=1`` keeps them running
    for quick re-runs. Sessions that overlap share one cluster: a session never stops
    daemons another running session uses.

``journal_log``
    The ``journal``, with geco's loggers sending INFO and up to it while the test runs.

``restored_geco_logger``
    The ``geco`` logger restored afterwards (handlers, level, propagation,
    ``logging.raiseExceptions``) -- for tests that call ``geco.log.setup()``. The plain
    helpers behind these (:func:`restored_logger`, :func:`handler_on`,
    :class:`RecordingHandler`) are in ``tests/logkit.py``; those behind ``journal``,
    ``job_owner`` and ``sge`` (commands run clean, journald, the test user) in
    ``tests/servicekit.py``, which bench/ uses too.

``job_owner``
    The unprivileged user ``gecotest`` (uid >= 1000; Grid Engine refuses jobs of
    system accounts) with its home directory, and ``job_owner.make_dir()`` for
    job directories it can write.

``job_dir``
    ``sge`` with geco's hooks, and a fresh job directory of ``job_owner`` holding
    tests/integration/probe.py, one per test module (:class:`tests.jobdirkit.JobDir`:
    submit, output, the probe's reports); for tests/integration and tests/vm_sge.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests import figurekit, nodestate
from tests.cleanslate import TEST_USER, clean_slate, report_line
from tests.jobdirkit import PROBE, JobDir
from tests.logkit import handler_on, restored_logger
from tests.servicekit import (
    CLEAN_ENV,
    HOOK_LINES,
    JOURNAL_SOCKET,
    LIBEXEC,
    LOCK_DIR,
    POLL,
    SGE_CELL_COMMON,
    SGE_SETUP,
    SGE_SPOOL,
    SGE_TEARDOWN,
    JobOwner,
    Journal,
    ensure_user,
    journald_alive,
    run,
    sge_env,
    shared_use,
    sole_user,
    start_journald,
    stop,
)

# The session's own children too (a test's subprocess.run(["qdel", ...])) run Grid
# Engine's clients as CLEAN_ENV gives every other child.
os.environ.update(sge_env(os.environ.get("PATH", "")))

# Property tests judge what is drawn, never how fast: beside a whole suite (or a busy
# machine) one draw may take seconds, which Hypothesis' deadline and its too_slow health
# check would call a failure. (The QEMU guests run their tests without Hypothesis.)
with contextlib.suppress(ImportError):
    from hypothesis import HealthCheck, settings

    settings.register_profile("geco", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("geco")

# ---------------------------------------------------------------------------
# figures: what the tests measured, one table at the end of the run
# ---------------------------------------------------------------------------

@pytest.fixture
def figures() -> list[str]:
    """Lines a test appends to be printed under "figures" at the end of the run (pytest's
    own output of a passing test is hidden): VM boot and run times, hook times, JOB_STARTED
    under a flood, fuzz and soak figures."""
    return figurekit.FIGURES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if figurekit.FIGURES:
        terminalreporter.section("figures")
        for line in figurekit.FIGURES:
            terminalreporter.write_line(line)
    # what the run waited for: the host's tests or a VM boot behind them (vmrun)
    path = figurekit.critical_path()
    if path:
        terminalreporter.section("critical path")
        for line in path:
            terminalreporter.write_line(line)


@pytest.hookimpl(hookwrapper=True)  # old-style: the VM's Debian pytest 7.2 runs this too
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Time the tests run on this host (a ``vm`` test only waits for its boot)."""
    start = time.monotonic()
    yield
    if item.get_closest_marker("vm") is None:
        figurekit.host_test_ran(start, time.monotonic(), item.location[0])


# ---------------------------------------------------------------------------
# two sessions side by side (./test.sh with no arguments)
# ---------------------------------------------------------------------------

# GECO_TEST_LANE=side: only the tests of tests/unit and tests/fuzz that use none of the
# node's services (their fixtures' closure names none of NODE_SERVICES): CPU-bound, and
# beside the rest, which mostly waits on Grid Engine; =main: every other test. Unset: all.
LANE = os.environ.get("GECO_TEST_LANE", "")
SIDE_DIRS = tuple(Path(__file__).parent / name for name in ("unit", "fuzz"))
NODE_SERVICES = frozenset({"journal", "sge", "job_owner"})


def _on_the_side(item: pytest.Item) -> bool:
    return (any(item.path.is_relative_to(where) for where in SIDE_DIRS)
            and not NODE_SERVICES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this lane's tests (GECO_TEST_LANE), the others deselected."""
    if LANE not in ("side", "main"):
        return
    keep, drop = [], []
    for item in items:
        (keep if _on_the_side(item) == (LANE == "side") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# ---------------------------------------------------------------------------
# a clean slate at session start
# ---------------------------------------------------------------------------

# the session lock, held shared for the whole session (pytest_sessionstart)
_SESSION_LOCK = pytest.StashKey[IO[bytes]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Run the clean slate when this is the only geco test session (see the docstring),
    after the terminal reporter printed its header (trylast: after its own hook)."""
    figurekit.session_started()
    if LANE == "side":  # touches nothing of the node: no clean slate, and none kept from main
        return
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK_DIR / "geco-test-session.users", "ab")  # noqa: SIM115 -- session-long
    session.config.add_cleanup(lock.close)
    done: list[str] = []
    if os.geteuid() == 0:
        session.config.stash[_SESSION_LOCK] = lock
        # recorded first: the clean slate stops the gecod demo.sh left
        done = nodestate.record() + clean_slate() if sole_user(lock) else [
            "no clean slate: another geco test session runs on this machine"]
    # shared from here on; a session that starts while we hold it exclusively waits here
    fcntl.flock(lock, fcntl.LOCK_SH)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if done and reporter is not None:
        reporter.write_line(report_line(done))


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown (runner's own hook)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Put the node back as the session found it (see the docstring), when no other geco
    test session runs: the last one to end restores what the first one recorded."""
    lock = session.config.stash.get(_SESSION_LOCK, None)
    if lock is None or lock.closed or not sole_user(lock):
        return
    done = nodestate.restore()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if done and reporter is not None:
        reporter.write_line(report_line(done))


# ---------------------------------------------------------------------------
# journald
# ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def journal() -> Iterator[Journal]:
    """A running journald for the whole session (see the module docstring)."""
    with shared_use("journald") as lock:
        if journald_alive():
            yield Journal(JOURNAL_SOCKET, None)
            return
        run_dir_existed = JOURNAL_SOCKET.parent.exists()
        proc = start_journald()
        try:
            yield Journal(JOURNAL_SOCKET, proc.pid)
        finally:
            if sole_user(lock):
                stop(proc)
                # Its socket files outlive it; left behind they look like a journal
                # (geco.log checks for the socket) that refuses every message.
                if not run_dir_existed:
                    shutil.rmtree(JOURNAL_SOCKET.parent, ignore_errors=True)


# ---------------------------------------------------------------------------
# geco's loggers
# ---------------------------------------------------------------------------

@pytest.fixture
def restored_geco_logger() -> Iterator[logging.Logger]:
    """Undo geco.log.setup() afterwards: it replaces the handlers of the whole ``geco`` tree."""
    with restored_logger("geco") as logger:
        yield logger


@pytest.fixture
def journal_log(journal: Journal, request: pytest.FixtureRequest) -> Iterator[Journal]:
    """geco's loggers send INFO and up to the session's journald while the test runs, as
    ``geco-test-<module>`` (``geco-test-oom`` for test_oom.py)."""
    from geco import log_handlers  # here, not at the top: the services above need no geco

    module = request.module.__name__.rpartition(".")[2].removeprefix("test_")
    handler = log_handlers.JournalHandler(f"geco-test-{module}", str(journal.socket))
    handler.setLevel(logging.INFO)
    try:
        with handler_on("geco", handler):
            yield journal
    finally:
        handler.close()


# ---------------------------------------------------------------------------
# test user
# ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def job_owner() -> JobOwner:
    """The unprivileged test user ``gecotest`` (name, uid, gid, home)."""
    return ensure_user(TEST_USER)


# ---------------------------------------------------------------------------
# Grid Engine
# ---------------------------------------------------------------------------

_SUBMITTED = re.compile(r"^Your job(?:-array)? (\d+)[ .]", re.MULTILINE)
# wait_finished's look for a job that cannot end (two qstats more) once in this many
# seconds: it only has a failing test fail sooner
STUCK_EVERY = 2.0


@dataclass
class GridEngine:
    """Helpers around the single-host cluster (all commands run as root unless stated)."""

    host: str
    hooks: frozenset[str]  # geco hooks configured in the queue: prolog, epilog, starter
    wanted: frozenset[str]  # the hooks the session asked for (GECO_TEST_HOOKS)
    owner: JobOwner
    queue: str = "all.q"
    setup_env: dict[str, str] = field(default_factory=dict)  # what setup.sh was run with
    execd_preload: str = ""  # the LD_PRELOAD setup.sh last gave sge_execd ("" none)

    def configure(self, **knobs: str) -> None:
        """Re-run setup.sh with extra knobs (e.g. ``GECO_EXECD_PRELOAD=...``); it restarts
        only what changed (execd for its LD_PRELOAD). Running jobs survive."""
        env = {**self.setup_env, **knobs}
        proc = run(["bash", str(SGE_SETUP)], env=env, timeout=600, check=False)
        if proc.returncode != 0:
            pytest.fail(f"integration/sge/setup.sh {knobs} failed ({proc.returncode}):\n"
                        f"{proc.stdout}{proc.stderr}")
        self.execd_preload = env.get("GECO_EXECD_PRELOAD", "")

    def execd_with(self, preload: str) -> None:
        """sge_execd running with ``preload`` as its LD_PRELOAD ("" none), restarted only
        when it is not: a restart waits for execd's first report (~5 s), and most test
        modules in a row ask for the same."""
        if preload != self.execd_preload or not _alive(self.execd_pidfile, "sge_execd"):
            self.configure(GECO_EXECD_PRELOAD=preload)

    @property
    def execd_pidfile(self) -> Path:
        return SGE_SPOOL / "execd" / self.host / "execd.pid"

    def require_hooks(self) -> None:
        """Fail the calling test unless geco's hooks the session asked for are configured."""
        missing = sorted(self.wanted - self.hooks)
        if missing:
            pytest.fail(f"geco hooks not configured in {self.queue}: {', '.join(missing)} "
                        f"missing in {LIBEXEC} (sge_hooks/ + scripts/install.sh)")

    def submit(self, *qsub_args: str, cwd: Path | str | None = None,
               user: str | None = None) -> int:
        """Submit a job with ``qsub`` as *user* (default the test user) and return its id.

        Parameters
        ----------
        *qsub_args: qsub's arguments as an argv list (no shell involved).
        cwd: directory qsub runs in (what ``-cwd`` means); default the user's home.
        user: submitting user; ``root`` submits directly.

        Returns
        -------
        The job id (for an array job, the job id shared by its tasks).

        Raises
        ------
        RuntimeError: qsub failed or printed no job id.
        """
        name = user or self.owner.name
        argv = ["qsub", *qsub_args]
        if name != "root":
            # runuser sets HOME/USER/LOGNAME/SHELL; the rest is CLEAN_ENV, so nothing of
            # pytest's environment reaches the job through qsub's SGE_O_* variables
            argv = ["runuser", "-u", name, "--", *argv]
        home = Path(pwd.getpwnam(name).pw_dir)
        out = run(argv, cwd=str(cwd or home)).stdout
        found = _SUBMITTED.search(out)
        if not found:
            raise RuntimeError(f"qsub printed no job id: {out!r}")
        return int(found.group(1))

    def is_known(self, job_id: int) -> bool:
        """True while qstat lists the job (pending, running, or in error)."""
        return run(["qstat", "-j", str(job_id)], check=False).returncode == 0

    def wait_finished(self, job_id: int, timeout: float = 60.0, *,
                      accounting: bool = True) -> list[dict[str, str]]:
        """Wait until the job (all its tasks) has left qstat, then for its accounting.

        A job that cannot finish on its own -- in error state (``Eqw``: a hook failed),
        or pending while every queue instance is in error state -- fails at once
        instead of after *timeout*; like a timed-out job it is deleted first, so that
        it does not run later, in another test's time, once the queue is cleared.

        Parameters
        ----------
        job_id: the job.
        timeout: seconds for both waits together.
        accounting: also wait until ``qacct -j`` has a record (setup.sh writes
            accounting at once, so this costs ~nothing); False for a job that never
            ran (deleted while pending), which never gets one.

        Returns
        -------
        The accounting records (see :meth:`accounting`), or [] without *accounting*.

        Raises
        ------
        RuntimeError: the job is stuck; the message has qstat's reasons.
        TimeoutError: with qstat's view of the job (its scheduling info says why).
        """
        deadline = time.monotonic() + timeout
        look_for_stuck = 0.0  # its two qstats every STUCK_EVERY s, not at every look
        while self.is_known(job_id):
            stuck = None
            if time.monotonic() >= look_for_stuck:
                stuck = self._stuck(job_id)
                look_for_stuck = time.monotonic() + STUCK_EVERY
            if stuck or time.monotonic() > deadline:
                detail = run(["qstat", "-j", str(job_id)], check=False).stdout
                run(["qdel", "-f", str(job_id)], check=False)
                if stuck:
                    raise RuntimeError(f"job {job_id} cannot finish: {stuck}\n{detail}")
                raise TimeoutError(f"job {job_id} still in qstat after {timeout} s:\n{detail}")
            time.sleep(POLL)
        if not accounting:
            return []
        while True:
            records = self.accounting(job_id)
            if records:
                return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} left qstat but qacct has no record "
                                   f"after {timeout} s")
            time.sleep(POLL)

    def _stuck(self, job_id: int) -> str | None:
        """Why the job can never finish on its own, or None."""
        states = set()
        for line in run(["qstat", "-u", "*"], check=False).stdout.splitlines():
            cols = line.split()
            if len(cols) > 4 and cols[0] == str(job_id):
                states.add(cols[4])
        if any("E" in st for st in states):
            return f"job state {'/'.join(sorted(states))} (error: see 'error reason' below)"
        queues = self.queue_states()
        if states <= {"qw", "hqw"} and queues and all("E" in st for st in queues.values()):
            why = run(["qstat", "-f", "-explain", "E"], check=False).stdout
            return f"pending while every queue instance is in error state E:\n{why}"
        return None

    def accounting(self, job_id: int) -> list[dict[str, str]]:
        """Return ``qacct -j <job>`` as one dict per task (``failed``, ``exit_status``, ...).

        Values are qacct's text, stripped (``failed`` may read ``"100 : assumedly after job"``).
        """
        proc = run(["qacct", "-j", str(job_id)], check=False)
        if proc.returncode != 0:
            return []
        records: list[dict[str, str]] = []
        for block in re.split(r"^=+$", proc.stdout, flags=re.MULTILINE):
            record = {}
            for line in block.splitlines():
                key, _, value = line.partition(" ")
                if key:
                    record[key] = value.strip()
            if record:
                records.append(record)
        return records

    def queue_states(self) -> dict[str, str]:
        """Return ``{queue instance: state letters}`` from ``qstat -f`` (``""`` = normal)."""
        states = {}
        for line in run(["qstat", "-f"]).stdout.splitlines():
            cols = line.split()
            # queue lines: name@host qtype resv/used/tot load arch [states]
            if len(cols) >= 5 and "@" in cols[0] and cols[2].count("/") == 2:
                states[cols[0]] = cols[5] if len(cols) > 5 else ""
        return states

    def qstat_xml(self, job_id: int) -> bytes:
        """Return ``qstat -xml -j <job>`` as bytes (the input geco's qstat parser takes)."""
        return subprocess.run(["qstat", "-xml", "-j", str(job_id)], capture_output=True,
                              env=CLEAN_ENV, timeout=60, check=True).stdout

    def queue_config(self) -> dict[str, str]:
        """Return ``qconf -sq <queue>`` as ``{key: value}``."""
        out = run(["qconf", "-sq", self.queue]).stdout.replace("\\\n", " ")
        return {k: " ".join(v.split()) for k, _, v in
                (line.partition(" ") for line in out.splitlines()) if k}

    @contextlib.contextmanager
    def temporary_queue(self, name: str, **attributes: str) -> Iterator[str]:
        """A copy of the queue on this host with ``attributes`` changed, named ``name``
        (``geco-test-*``: the clean slate deletes one an interrupted session left). The
        test user's jobs in it are deleted with it; anyone else's stay."""
        assert name.startswith("geco-test-"), name
        run(["qconf", "-dq", name], check=False)  # left by a killed run
        conf = {**self.queue_config(), **attributes, "qname": name}
        with tempfile.NamedTemporaryFile("w", prefix=f"{name}.", suffix=".conf") as f:
            f.write("".join(f"{k} {v}\n" for k, v in conf.items()))
            f.flush()
            run(["qconf", "-Aq", f.name])
        try:
            yield name
        finally:
            listing = run(["qstat", "-u", self.owner.name, "-q", name], check=False).stdout
            jobs = sorted({line.split()[0] for line in listing.splitlines()[2:] if line.strip()})
            if jobs:
                run(["qdel", "-f", *jobs], check=False)
            run(["qconf", "-dq", name], check=False)


def _alive(pidfile: Path, comm: str) -> bool:
    """True when the pid in ``pidfile`` is a live process named ``comm``."""
    try:
        pid = pidfile.read_text().strip()
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except OSError:
        return False


def _sge_daemons_running() -> bool:
    """True when a qmaster and an execd of this machine are alive (per SGE's pid files)."""
    execds = SGE_SPOOL.glob("execd/*/execd.pid")
    return (_alive(SGE_SPOOL / "qmaster" / "qmaster.pid", "sge_qmaster")
            and any(_alive(p, "sge_execd") for p in execds))


@pytest.fixture(autouse=True)
def execd_as_asked(request: pytest.FixtureRequest) -> None:
    """sge_execd with geco's exec() preload for a test that asks for the ``gecod`` fixture
    (tests/integration/conftest.py: gecod serving), without it for any other test of Grid
    Engine (the hooks alone; a preload with no gecod refuses every job). Per test, as a
    test module may hold both kinds; execd is restarted only where the kind changes."""
    if "sge" not in request.fixturenames:
        return
    sge: GridEngine = request.getfixturevalue("sge")
    sge.execd_with(request.getfixturevalue("gecod").preload
                   if "gecod" in request.fixturenames else "")


@pytest.fixture(scope="session")
def sge(job_owner: JobOwner) -> Iterator[GridEngine]:
    """A running single-host Grid Engine with geco's hooks (see the module docstring)."""
    # GECO_TEST_HOOKS=0: plain Grid Engine, to tell a Grid Engine problem from a geco one
    wanted = frozenset({"0": (), "starter": ("starter",)}.get(
        os.environ.get("GECO_TEST_HOOKS", "1"), HOOK_LINES))
    hooks = frozenset(h for h in wanted if (LIBEXEC / h).exists())
    env = dict(CLEAN_ENV, SGE_TEST_USER=job_owner.name)
    if "SGE_MEM" in os.environ:  # a machine's capacity (the VM guests': vmrun.SGE_MEM)
        env["SGE_MEM"] = os.environ["SGE_MEM"]
    for hook, knob in (("prolog", "GECO_PROLOG"), ("epilog", "GECO_EPILOG"),
                       ("starter", "GECO_STARTER")):
        if hook in hooks:
            env[knob] = HOOK_LINES[hook]
    with shared_use("sge") as lock:
        was_running = _sge_daemons_running()
        proc = run(["bash", str(SGE_SETUP)], env=env, timeout=600, check=False)
        if proc.returncode != 0:
            pytest.fail(f"integration/sge/setup.sh failed ({proc.returncode}):\n"
                        f"{proc.stdout}{proc.stderr}")
        # the name Grid Engine uses for this host; setup.sh writes it there
        host = (SGE_CELL_COMMON / "act_qmaster").read_text().strip()
        try:
            yield GridEngine(host, hooks, wanted, job_owner, setup_env=env)
        finally:
            if (not was_running and os.environ.get("GECO_KEEP_SGE") != "1"
                    and sole_user(lock)):
                run(["bash", str(SGE_TEARDOWN), "--no-wait"], timeout=120, check=False)


@pytest.fixture(scope="module")
def job_dir(sge: GridEngine, job_owner: JobOwner, request: pytest.FixtureRequest) -> JobDir:
    """The cluster with geco's hooks, and a fresh job directory for this test module."""
    sge.require_hooks()
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    path = job_owner.make_dir(prefix)
    shutil.copy(PROBE, path / "probe.py")
    os.chown(path / "probe.py", job_owner.uid, job_owner.gid)
    return JobDir(path, sge, job_owner)
