"""Run a Grid Engine client (qstat, qconf, qmod) the one way geco runs them.

argv-only, stdin ``/dev/null``, cwd ``/``, in a session of its own (killed with all it
started when it outlives its timeout), with the site's Grid Engine environment
(:mod:`geco.sge.siteenv`) and nothing of the caller's, which in a root hook is the
job's. Used by :mod:`geco.sge.qstat` (``qstat -xml``, with retries), :mod:`geco.sge.qmod`
(``qmod -d``, once), :mod:`geco.sge.complexes` and gecod's allow list (``qconf``, once).

Outcomes: :func:`run_once` says why a run failed; :func:`run_qstat` and :func:`run_qconf`
raise :class:`~geco.errors.QstatError` naming the command and why (not found, timed out,
the qmaster unreachable, its exit status and the first line of its stderr). A
``<comunication_error>`` answer (what a client prints, with exit status 0, when it
cannot reach the qmaster) is a failure, never output.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from geco import log
from geco.config import Config
from geco.errors import QstatError
from geco.sge.siteenv import SgeEnv, discover

__all__ = ["beside_qstat", "excerpt", "find_command", "run_once", "run_qconf", "run_qstat"]

_log = log.get("sge.command")

# What a Grid Engine client prints, with exit status 0, when it cannot reach the
# qmaster (SoGE's spelling): a transient failure, never a document about the job.
_COMM_ERROR = re.compile(rb"<comunication_error\b")
_COMM_ERROR_TEXT = re.compile(rb"<AN_text>([^<]*)</AN_text>")
_BACKOFF_CAP = 10.0        # seconds; retries sleep 1, 2, 4, 8, 10, 10, ...
_DRAIN_TIMEOUT = 2.0       # seconds to collect output after killing a timed-out qstat
_STDERR_SHOWN = 200        # characters of stderr's first line put into an error


def excerpt(data: bytes) -> str:
    """The first line of a command's output (80 bytes at most), for an error."""
    first = data.strip().split(b"\n", 1)[0][:80]
    return first.decode("utf-8", "backslashreplace")


def find_command(name: str, env: SgeEnv, *, what: str, remedy: str) -> str:
    """Return the Grid Engine client to run: ``name`` itself when it holds a ``/``, else its
    path in the site's fixed PATH (never the caller's PATH, which a job's owner may set).

    Parameters
    ----------
    name: the configured command (``qstat``, ``/opt/sge/bin/lx-amd64/qmod``).
    env: the site's Grid Engine environment (:func:`geco.sge.siteenv.discover`).
    what: the command's role for the error (``qstat``, ``qmod``).
    remedy: the error's advice on where to give its full path.

    Raises
    ------
    QstatError
        when a bare name is not found there.
    """
    found = env.which(name)
    if found is None:
        raise QstatError(f"{what} command {name!r} not found in {env.path}; {remedy}",
                         command=name)
    return found


def beside_qstat(config: Config, name: str) -> str:
    """Another Grid Engine client (``qmod``, ``qconf``): next to a fully given qstat (a site
    that names /opt/sge/bin/lx-amd64/qstat has them in the same directory), else ``name``
    (looked up as :func:`find_command` does)."""
    configured = Path(config.qstat)
    return str(configured.with_name(name)) if configured.is_absolute() else name


def _command(config: Config, env: SgeEnv) -> str:
    return find_command(config.qstat, env, what="qstat",
                        remedy="set [qstat] command in geco.toml to its full path")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the timed-out qstat and anything it started (its own session, see Popen)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


def run_once(argv: list[str], timeout: float,
             env: SgeEnv) -> tuple[bytes | None, str, int | None]:
    """Run a Grid Engine client (qstat, qconf, qmod) once, the way :func:`run_qstat` runs qstat.

    argv-only, stdin ``/dev/null``, cwd ``/``, its own session (killed with
    all it started after ``timeout`` seconds), ``env``'s environment and
    nothing of the caller's.

    Returns
    -------
    (stdout, or None when it failed, printed nothing or printed a
    ``<comunication_error>``; why it failed; exit status, None when it timed out)

    Raises
    ------
    OSError
        when the command cannot be started (not found, not executable).
    """
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env.environ(), cwd="/",
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # subprocess.run would kill only the direct child and then wait for EOF on
            # the pipes, which a grandchild (wrapper scripts) keeps open: a hang.
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=_DRAIN_TIMEOUT)
            return None, f"timed out after {timeout:g} s", None
    status = proc.returncode
    if status == 0 and _COMM_ERROR.search(out[:256]):
        # qstat -xml exits 0 with this when the qmaster cannot be reached
        said = _COMM_ERROR_TEXT.search(out)
        text = (html.unescape(said.group(1).decode("utf-8", "backslashreplace")) if said
                else excerpt(out))
        return None, f"cannot reach the qmaster: {text[:_STDERR_SHOWN]}", 0
    if status == 0 and out.strip():
        return out, "", 0
    if status < 0:
        try:
            why = f"killed by signal {signal.Signals(-status).name}"
        except ValueError:
            why = f"killed by signal {-status}"
    else:
        why = f"exit status {status}"
    line = err.strip().split(b"\n", 1)[0].decode("utf-8", "backslashreplace")[:_STDERR_SHOWN]
    if status == 0:
        why += " but no output"
    why += f", stderr: {line}" if line else ", no stderr"
    return None, why, status


def run_qconf(args: list[str], config: Config) -> str:
    """Run ``qconf`` (beside qstat, in the site's environment) once with ``args`` and
    return what it printed.

    Raises
    ------
    QstatError
        naming what failed (not found, timed out, the qmaster unreachable, its exit).
    """
    env = discover(config)
    command = find_command(beside_qstat(config, "qconf"), env, what="qconf",
                           remedy="set [qstat] command in geco.toml to the full path of "
                                  "qstat: qconf is taken from the same directory")
    try:
        out, why, _ = run_once([command, *args], config.qstat_timeout, env)
    except OSError as exc:
        raise QstatError.from_oserror(f"cannot run qconf {' '.join(args)}", exc,
                                      path=command) from exc
    if out is None:
        raise QstatError(f"qconf {' '.join(args)} failed: {why}")
    return out.decode(errors="replace")


def run_qstat(args: list[str], config: Config, *, env: SgeEnv | None = None,
              sleep: Callable[[float], None] = time.sleep) -> bytes:
    """Run ``qstat`` with ``args`` and return its standard output.

    The command is ``[config.qstat, *args]`` as an argv list (never a shell),
    with stdin ``/dev/null``, cwd ``/``, its own session, and the site's
    environment (:mod:`geco.sge.siteenv`: the ``SGE_*`` variables qstat needs, a
    fixed PATH where a bare ``qstat`` is looked up, ``LC_ALL=C``), never the
    caller's, which is a job's in the prolog.

    Each attempt may take ``config.qstat_timeout`` seconds (then qstat and its
    children are killed). A timeout, a non-zero exit (qmaster down, commlib
    errors such as "can't connect"), a ``<comunication_error>`` document (what
    ``qstat -xml`` prints, with exit status 0, when the qmaster cannot be
    reached) or empty output is retried
    ``config.qstat_retries`` times, sleeping 1, 2, 4, ... seconds (at most 10)
    in between.

    Parameters
    ----------
    args: qstat's arguments, e.g. ``["-xml", "-j", "42"]``.
    config: settings (``qstat``, ``qstat_timeout``, ``qstat_retries``, the ``[qstat]``
        Grid Engine environment).
    env: the site's Grid Engine environment; default: :func:`geco.sge.siteenv.discover`.
    sleep: the sleep function (tests pass a recorder).

    Returns
    -------
    bytes
        The output of the first successful attempt.

    Raises
    ------
    QstatError
        at once when qstat cannot be executed (not found, not executable);
        after the last retry naming the command, the attempts, the last exit
        status and the first line of its stderr.
    """
    env = env or discover(config)
    argv = [_command(config, env), *args]
    attempts = config.qstat_retries + 1
    why, status = "", None
    for attempt in range(1, attempts + 1):
        try:
            out, why, status = run_once(argv, config.qstat_timeout, env)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise QstatError.from_oserror(f"cannot execute {argv[0]}", exc,
                                          command=argv[0]) from exc
        except OSError as exc:
            # fork/exec ran out of something (EAGAIN, ENOMEM): may pass, so retry
            out, why, status = None, f"cannot start: {exc}", None
        if out is not None:
            return out
        if attempt < attempts:
            delay = min(2.0 ** (attempt - 1), _BACKOFF_CAP)
            _log.warning("%s failed (%s); attempt %d of %d, retrying in %g s",
                         shlex.join(argv), why, attempt, attempts, delay)
            sleep(delay)
    raise QstatError(f"{shlex.join(argv)} failed {attempts} time(s); last: {why}",
                     attempts=attempts, exit_status=status)
