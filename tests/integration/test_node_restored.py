"""The node as the tests found it (tests/nodestate.py): a node where demo.sh ran -- all.q
with geco's starter only, sge_execd with geco's preload, gecod started by hand -- is
changed by a session as the suite changes it, and put back by the end of the session,
also when that session was killed and the next one ends."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests import nodestate
from tests.cleanslate import is_geco_daemon, listener_pid, stop_leftover_gecod, stop_process
from tests.servicekit import HOOK_LINES

pytestmark = pytest.mark.sge

PRELOAD = "/usr/lib/geco/libgeco_preload.so"
DEMO_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.1)


def start_gecod_as_demo_does(log: Path) -> int:
    """``geco daemon`` started by demo.sh's own line; its pid."""
    subprocess.run(["sh", "-c", f"(cd / && env -i PATH={DEMO_PATH} setsid /usr/bin/geco daemon "
                    f"</dev/null >>{log} 2>&1 &)"], check=True, timeout=60)
    wait_until(lambda: (p := listener_pid()) is not None and is_geco_daemon(p), 60,
               "gecod serving the site socket")
    pid = listener_pid()
    assert pid is not None
    return pid


def started_how(pid: int) -> dict[str, Any]:
    """What of a process says how it was started."""
    proc = Path(f"/proc/{pid}")
    stat = (proc / "stat").read_text().rpartition(")")[2].split()
    environ = [e for e in (proc / "environ").read_bytes().decode().split("\0") if e]
    return {"geco daemon": is_geco_daemon(pid), "ppid": int(stat[1]), "sid": int(stat[3]),
            "cwd": os.readlink(proc / "cwd"), "env": environ,
            "log": os.readlink(proc / "fd" / "1")}


@contextlib.contextmanager
def demo_node(sge: Any) -> Any:
    """The node as demo.sh leaves it for the block: gecod started its way, then the queue
    with geco's starter only and sge_execd with the preload; afterwards no gecod, and the
    session's own Grid Engine settings again."""
    logs = Path(tempfile.mkdtemp(prefix="geco-test-demo-"))  # not pytest's: a test's gecod
    try:
        pid = start_gecod_as_demo_does(logs / "gecod.log")
        sge.configure(GECO_PROLOG="", GECO_EPILOG="", GECO_STARTER=HOOK_LINES["starter"],
                      GECO_EXECD_PRELOAD=PRELOAD)
        yield pid, logs / "gecod.log"
    finally:
        with contextlib.suppress(Exception):
            left = listener_pid()
            if left is not None and is_geco_daemon(left):
                stop_process(left)
        sge.configure()
        shutil.rmtree(logs, ignore_errors=True)


def test_a_demo_node_a_killed_session_changed_is_put_back_by_the_next_sessions_end(
        sge: Any, tmp_path: Path) -> None:
    """Given the node as demo.sh leaves it, when a session records it, changes it as the
    suite does (the clean slate stops gecod, setup.sh gives all.q prolog, epilog and
    starter and execd no preload) and is killed, and the next session starts and ends,
    then the next start keeps the record as it was, and its end puts all.q's hooks,
    execd's preload and gecod back -- gecod started as demo.sh starts it, in its own
    session, with its environment alone, from /, appending to its log -- says so in one
    line and removes the record; a second restore has nothing to do."""
    record = tmp_path / "node.json"  # not the session's own (nodestate.NODE_STATE)
    with demo_node(sge) as (demo_pid, log):
        before = nodestate.grid_engine()
        first = nodestate.record(record)
        saved = record.read_bytes()
        stopped = stop_leftover_gecod()  # the clean slate's step, as at session start
        sge.configure()  # the sge fixture's settings: the hooks, no preload
        changed, serving = nodestate.grid_engine(), listener_pid()
        # killed here: the next session
        kept, kept_as_is = nodestate.record(record), record.read_bytes() == saved
        done = nodestate.restore(record)
        after, pid = nodestate.grid_engine(), listener_pid()
        how = started_how(pid) if pid is not None else {}
        again, left = nodestate.restore(record), record.exists()

    assert before is not None and changed is not None and after is not None
    assert (before["queue"]["prolog"], before["queue"]["epilog"],
            before["queue"]["starter_method"], before["execd_preload"]) == (
        "NONE", "NONE", HOOK_LINES["starter"], PRELOAD)
    assert first == [] and stopped and serving is None
    assert (changed["queue"]["prolog"], changed["execd_preload"]) == (HOOK_LINES["prolog"], "")
    assert kept == [f"kept {record}, the node's state before an interrupted run (put back at "
                    "the end)"] and kept_as_is
    assert after == before
    assert pid is not None and pid != demo_pid
    assert how == {"geco daemon": True, "ppid": how["ppid"], "sid": pid, "cwd": "/",
                   "env": [f"PATH={DEMO_PATH}"], "log": str(log)}
    assert how["ppid"] != os.getpid()
    assert [p.split(" (")[0] for p in done] == [
        "started gecod again as it had been started", "put back all.q's epilog, prolog",
        f"sge_execd running with LD_PRELOAD={PRELOAD}"], done
    assert again == [] and not left


def test_a_node_as_recorded_is_left_alone_and_nothing_is_said(sge: Any, tmp_path: Path) -> None:
    """Given a record of the node as it is (no gecod, the session's queue and execd), when
    it is restored, then nothing is done or said, and the record is gone."""
    record = tmp_path / "node.json"
    first = nodestate.record(record)
    recorded = record.exists()
    done = nodestate.restore(record)

    assert first == [] and recorded
    assert done == [] and not record.exists()
