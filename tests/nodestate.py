"""The node as a test session found it: recorded at session start, put back at its end.

A node where ``demo.sh`` ran has Grid Engine's queue all.q with geco's starter only,
sge_execd with geco's exec() preload, and a gecod started by hand serving
``/run/geco/gecod.sock``. A test session changes all three: the clean slate stops that
gecod, the ``sge`` fixture configures the queue with prolog, epilog and starter
(integration/sge/setup.sh), ``execd_as_asked`` restarts execd with and without the
preload, and the tests' own gecods come and go.

tests/conftest.py, when it is the only geco test session on the machine:

- at session start, before the clean slate, :func:`record` writes what it finds to
  ``/run/geco-tests-node-state.json`` (not ``geco-test-node*``: the emulated cluster's
  hosts' run dirs): all.q's configuration (``qconf -sq``) and its instances' disabled and
  error states, setup.sh's settings (the fingerprint it keeps in
  ``geco-setup.state``), the LD_PRELOAD of the running sge_execd, and the gecod serving
  the site socket, started by hand as demo.sh does (its command line, environment,
  directory and log). A file already there is one an interrupted session left: it says
  how the node was before that session, and is kept. Nothing is recorded on a node with
  systemd as PID 1 (the QEMU guests, whose package lifecycle tests remove gecod on
  purpose);
- at session end (after Ctrl-C too), when no other session runs, :func:`restore` puts
  back what differs: gecod started again as it was started (demo.sh's way: its
  environment alone, its own session, appending to its log), setup.sh run with the
  recorded settings (queue hooks, execd's preload: execd is restarted only if that
  changed, which running jobs survive), then the queue's recorded configuration where it
  still differs and its instances' disabled states; then it removes the file. A session
  killed outright leaves the file: the next session's start keeps it, its end restores.

Not put back: a Grid Engine that was not running at session start (the ``sge`` fixture
stops the daemons it started; the queue's spooled configuration stays as the tests last
set it, which demo.sh's setup.sh rewrites in any case).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.cleanslate import is_geco_daemon, listener_pid
from tests.servicekit import CLEAN_ENV, SGE_SETUP, SGE_SPOOL

NODE_STATE = Path("/run/geco-tests-node-state.json")
QUEUE = "all.q"
SETUP_STATE = SGE_SPOOL / "geco-setup.state"
# setup.sh's fingerprint keys and the settings that give them (integration/sge/setup.sh)
SETUP_KNOBS = {
    "slots": "SGE_SLOTS", "mem": "SGE_MEM", "h_vmem_default": "SGE_H_VMEM_DEFAULT",
    "trace_max": "SGE_TRACE_LEVEL_MAX", "prolog": "GECO_PROLOG", "epilog": "GECO_EPILOG",
    "starter": "GECO_STARTER", "shepherd": "GECO_SHEPHERD_CMD",
    "execd_params": "SGE_EXECD_PARAMS", "schedule_interval": "SGE_SCHEDULE_INTERVAL",
    "execd_preload": "GECO_EXECD_PRELOAD",
}
# the queue attributes that are setup.sh's hooks (the rest is compared as a whole)
QUEUE_HOOKS = {"prolog": "GECO_PROLOG", "epilog": "GECO_EPILOG",
               "starter_method": "GECO_STARTER"}
# state letters a session leaves that stay (d: qmod -d, E: a failed hook); the others
# (u, a, ...) come and go with execd's reports
KEPT_STATES = "dE"


def _run(argv: list[str], *, timeout: float = 60.0,
         **kwargs: Any) -> subprocess.CompletedProcess[str] | None:
    """A command with Grid Engine's clean environment; None when it cannot run or hangs
    (no Grid Engine installed, a qmaster that does not answer)."""
    kwargs.setdefault("env", CLEAN_ENV)
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False, **kwargs)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _ok(proc: subprocess.CompletedProcess[Any] | None) -> bool:
    return proc is not None and proc.returncode == 0


# ---------------------------------------------------------------------------
# what is there
# ---------------------------------------------------------------------------

def queue_config(queue: str = QUEUE) -> dict[str, str] | None:
    """``qconf -sq <queue>`` as ``{key: value}`` (None when the qmaster does not answer)."""
    proc = _run(["qconf", "-sq", queue], timeout=30)
    if proc is None or proc.returncode != 0:
        return None
    out = proc.stdout.replace("\\\n", " ")
    return {k: " ".join(v.split()) for k, _, v in (line.partition(" ") for line in
                                                    out.splitlines()) if k}


def queue_states(queue: str = QUEUE) -> dict[str, str]:
    """``{instance: the lasting state letters}`` of the queue's instances (qstat -f)."""
    proc = _run(["qstat", "-f", "-q", queue], timeout=30)
    states: dict[str, str] = {}
    if proc is None or proc.returncode != 0:
        return states
    for cols in map(str.split, proc.stdout.splitlines()):
        # queue lines: name@host qtype resv/used/tot load arch [states]
        if len(cols) >= 5 and cols[0].startswith(f"{queue}@") and cols[2].count("/") == 2:
            letters = cols[5] if len(cols) > 5 else ""
            states[cols[0]] = "".join(c for c in KEPT_STATES if c in letters)
    return states


def execd_preload() -> str | None:
    """The LD_PRELOAD of the running sge_execd ("" none), None when none runs."""
    for pidfile in SGE_SPOOL.glob("execd/*/execd.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sge_execd":
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            found = [v for k, _, v in (e.partition(b"=") for e in environ) if k == b"LD_PRELOAD"]
            return os.fsdecode(found[0]) if found else ""
    return None


def setup_settings() -> dict[str, str]:
    """The settings setup.sh last ran with (its fingerprint), {} when it never did."""
    try:
        lines = SETUP_STATE.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.partition("=") for line in lines)
    return {k: v for k, _, v in pairs if k in SETUP_KNOBS}


def grid_engine() -> dict[str, Any] | None:
    """What a session changes of a running Grid Engine; None when it does not run."""
    preload = execd_preload()
    config = queue_config() if preload is not None else None
    if config is None or preload is None:
        return None
    return {"queue": config, "states": queue_states(), "execd_preload": preload,
            "setup": setup_settings()}


def gecod() -> dict[str, Any] | None:
    """How the gecod serving the site socket was started by hand; None when none serves,
    or one not worth starting again: a test's that an interrupted session left (its log is in
    pytest's temporary directory), or something that is not ``geco daemon``."""
    pid = listener_pid()
    if pid is None:
        return None
    if not is_geco_daemon(pid):
        return None
    proc = Path(f"/proc/{pid}")
    try:
        argv = [os.fsdecode(a) for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        environ = [os.fsdecode(e) for e in (proc / "environ").read_bytes().split(b"\0") if e]
        cwd, log = os.readlink(proc / "cwd"), os.readlink(proc / "fd" / "1")
    except OSError:
        return None
    if "/pytest-of-" in log:
        return None
    # from the geco script on: its interpreter comes from its #! line again
    start = next(i for i, a in enumerate(argv) if Path(a).name == "geco")
    return {"how": "by hand", "argv": argv[start:],
            "env": dict(e.partition("=")[::2] for e in environ), "cwd": cwd,
            # a file (demo.sh's /var/log/geco-demo-gecod.log) is appended to again
            "log": log if log.startswith("/") and not log.endswith(" (deleted)")
            else os.devnull}


# ---------------------------------------------------------------------------
# record and restore
# ---------------------------------------------------------------------------

def _write_atomically(path: Path, data: str) -> None:
    """A session killed while writing leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(data)
    tmp.replace(path)


def record(path: Path = NODE_STATE) -> list[str]:
    """Write the node's state to ``path`` unless an interrupted session's is there.

    Returns
    -------
    What was done, as phrases for the clean slate's line (nothing for a fresh record).
    """
    if path.exists():
        return [f"kept {path}, the node's state before an interrupted run (put back at the "
                "end)"]
    if Path("/run/systemd/system").is_dir():
        # systemd's node (the QEMU guests): gecod and execd are the package's units, which
        # its lifecycle tests install, remove and purge on purpose; the guest is thrown away
        return []
    _write_atomically(path, json.dumps({"sge": grid_engine(), "gecod": gecod()}, indent=1))
    return []


def _wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _geco_daemon_serving() -> bool:
    pid = listener_pid()
    return pid is not None and is_geco_daemon(pid)


def start_gecod(how: dict[str, Any], timeout: float = 60.0) -> list[str]:
    """Start gecod as :func:`gecod` found it started, and wait until it serves."""
    # demo.sh's way: the recorded environment alone, its own session (setsid -f forks, so
    # it is no child of this session), from its directory, appending to its log
    started: subprocess.CompletedProcess[Any] | None
    try:
        with open(how["log"], "ab") as out:
            started = subprocess.run(["/usr/bin/setsid", "-f", *how["argv"]], env=how["env"],
                                     cwd=how["cwd"], timeout=60, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=out, check=False)
    except (OSError, subprocess.TimeoutExpired):
        started = None
    what = f"started gecod again as it had been started ({' '.join(how['argv'])}, " \
           f"log {how['log']})"
    if _ok(started) and _wait(_geco_daemon_serving, timeout):
        return [what]
    return [f"could not start gecod again ({' '.join(how['argv'])}): "
            "nothing serves the site socket"]


def _setup_env(saved: dict[str, Any]) -> dict[str, str]:
    """setup.sh's settings that give the recorded Grid Engine back: its recorded
    fingerprint, with the queue's hooks and execd's preload as they were found."""
    env = dict(CLEAN_ENV)
    env.update({SETUP_KNOBS[k]: v for k, v in saved["setup"].items()})
    env.update({knob: saved["queue"].get(attr, "NONE") for attr, knob in QUEUE_HOOKS.items()})
    env["GECO_EXECD_PRELOAD"] = saved["execd_preload"]
    return env


def restore_grid_engine(saved: dict[str, Any]) -> tuple[list[str], bool]:
    """Put the recorded Grid Engine back where it differs; (phrases, all done)."""
    now = grid_engine()
    if now == saved:
        return [], True
    done: list[str] = []
    queue = now["queue"] if now else {}
    changed = sorted(k for k in saved["queue"].keys() | queue.keys()
                     if saved["queue"].get(k) != queue.get(k))
    proc = _run(["bash", str(SGE_SETUP)], env=_setup_env(saved), timeout=600)
    if not _ok(proc):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] if proc else ["hung"]
        return [f"could not put Grid Engine back: setup.sh failed ({' '.join(tail)})"], False
    # what setup.sh does not write (an attribute set by hand) from the record
    if queue_config() != saved["queue"]:
        with tempfile.NamedTemporaryFile("w", prefix="geco-tests-queue.", suffix=".q") as f:
            f.write("".join(f"{k} {v}\n" for k, v in saved["queue"].items()))
            f.flush()
            _run(["qconf", "-Mq", f.name])
    for instance, letters in saved["states"].items():
        left = queue_states().get(instance, "")
        if "E" in left and "E" not in letters:
            _run(["qmod", "-c", instance])
        if ("d" in left) != ("d" in letters):
            _run(["qmod", "-d" if "d" in letters else "-e", instance])
    if changed:
        done.append(f"put back {QUEUE}'s {', '.join(changed)}")
    if now is None or now["execd_preload"] != saved["execd_preload"]:
        done.append(f"sge_execd running with LD_PRELOAD={saved['execd_preload']}"
                    if saved["execd_preload"] else "sge_execd running without LD_PRELOAD")
    # the hooks and the preload are said above already
    others = sorted(k for k in SETUP_KNOBS.keys() - {"prolog", "epilog", "starter",
                                                     "execd_preload"}
                    if now is not None and now["setup"].get(k) != saved["setup"].get(k))
    if others:
        done.append(f"setup.sh's {', '.join(others)} as before")
    # setup.sh's fingerprint aside: it takes the hooks found in the queue, not recorded
    after = grid_engine()
    if after is None or any(after[k] != saved[k] for k in ("queue", "states", "execd_preload")):
        return [*done, f"but Grid Engine still differs: {after} (was {saved})"], False
    return done, True


def restore(path: Path = NODE_STATE) -> list[str]:
    """Put back what ``path`` recorded (see the module docstring) and remove it; it is
    kept when something could not be put back, for the next session's end to try again.

    Returns
    -------
    What was done, as phrases for one line (empty when the node was as recorded).
    """
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        path.unlink(missing_ok=True)
        return [f"removed {path}, unreadable ({e})"]
    done: list[str] = []
    ok = True
    # gecod first, as demo.sh does: an execd with the preload refuses jobs without it
    if saved["gecod"] is not None and not _geco_daemon_serving():
        done += start_gecod(saved["gecod"])
        ok = _geco_daemon_serving()
    if saved["sge"] is not None:
        more, sge_ok = restore_grid_engine(saved["sge"])
        done += more
        ok = ok and sge_ok
    if ok:
        path.unlink()
    else:
        done.append(f"kept {path} for the next session to try again")
    return done
