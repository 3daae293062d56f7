"""The prolog, epilog and starter Grid Engine runs are a small C program that has gecod do
their work.

``/usr/libexec/geco/prolog`` and ``epilog`` (``hook/geco_hook.c``) send gecod a HOOK
on its privileged socket; ``starter`` asks it (STARTER, peer-credentialed) how to start
the job and execs it. gecod runs the Python hooks' own code and journals it under the
hook's name. When gecod does not (it is down, the job is traced, anything goes wrong),
the program runs the Python hook (``geco-prolog``, ``geco-epilog``, ``geco-starter``),
which does the work itself. Either way the job runs, prints and is accounted the same
(``test_same_result*.py`` compare the starter with Grid Engine alone); the journal says
who did the work (its ``_PID``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from geco import config
from geco.wire import address
from geco.wire.frame import PEERCRED, PUBLIC_KEY, decode, decode_ack, encode
from geco.wire.messages import Ack, AckStatus, Hook, HookName, MsgType, Starter, StarterReply
from geco.wire.reader import read_frame
from tests.cleanslate import listener_pid

pytestmark = pytest.mark.sge

LIBEXEC = Path("/usr/libexec/geco")
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def hook_entries(journal: Any, job: int) -> dict[str, dict[str, Any]]:
    """The job's prolog-done, job-started and epilog-done journal entries, by hook."""
    events = {"prolog": "prolog-done", "starter": "job-started", "epilog": "epilog-done"}
    return {hook: journal.wait_for(JOB_ID=str(job), GECO_EVENT=event)[0]
            for hook, event in events.items()}


def test_without_the_preload_gecod_asks_qstat_once_for_the_prolog(
        sge: Any, gecod_service: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod but no preload in sge_execd (gecod has not seen the job before its
    prolog), when a job runs, then gecod does the prolog's work, asking qstat for the job
    itself (the resources-read record says qstat, once), and the job runs normally in its
    cgroups. (First in this module: the ``gecod`` fixture below adds the preload.)"""
    job = job_dir.submit("asked")
    [record] = sge.wait_finished(job, timeout=120)
    done = hook_entries(journal, job)
    [read] = journal.entries(JOB_ID=str(job), GECO_EVENT="resources-read")
    report = job_dir.reports("asked", job)[0]

    assert record["exit_status"] == "0" and record["failed"] == "0"
    assert report["cgroups"]["memory"].endswith(f"{job}.1")
    assert read["SOURCE"] == "qstat" and int(read["_PID"]) == listener_pid()
    assert int(done["prolog"]["_PID"]) == listener_pid()


def test_gecod_does_the_prolog_and_epilog_and_the_job_is_as_without_it(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod and the preload, when a job runs, then its prolog's, starter's and
    epilog's work is journaled by gecod (its pid) under the hooks' names, once each, with
    the story the Python hooks tell (resources-read, job-contained, job-started, job-end),
    and the job prints, exits and is accounted normally, in its cgroups, with the GECO_*
    variables of what the kernel enforces."""
    job = job_dir.submit("viagecod")
    [record] = sge.wait_finished(job, timeout=120)
    done = hook_entries(journal, job)
    server = listener_pid()
    story = [e.get("GECO_EVENT") for e in journal.entries(JOB_ID=str(job))]
    report = job_dir.reports("viagecod", job)[0]

    assert record["exit_status"] == "0" and record["failed"] == "0"
    assert report["cgroups"]["memory"].endswith(f"{job}.1")
    assert report["env"]["GECO_CPUS"] == done["starter"]["CPUS"]
    assert report["env"]["GECO_NCPUS"] == str(len(report["cpus"]))
    for hook, entry in done.items():
        assert entry["SYSLOG_IDENTIFIER"] == f"geco-{hook}"
        assert int(entry["_PID"]) == server, entry
    assert done["prolog"]["EXIT_STATUS"] == done["epilog"]["EXIT_STATUS"] == "0"
    for event in ("resources-read", "job-contained", "prolog-done", "job-started", "job-end",
                  "epilog-done"):
        assert story.count(event) == 1, story


def test_a_traced_job_gets_its_hooks_from_python_with_its_trace(
        sge: Any, gecod: Any, job_dir: Any, journal: Any) -> None:
    """Given gecod and the preload, when a job asks for a trace, then gecod leaves its
    prolog and epilog to the Python ones (not gecod's pid), which write the trace."""
    job = job_dir.submit("traced", "-l", "geco_trace_level=3")
    [record] = sge.wait_finished(job, timeout=120)
    done = hook_entries(journal, job)

    trace = (config.load(config.DEFAULT_PATH).trace_dir / f"{job}.1.trace").read_text()

    assert record["exit_status"] == "0"
    assert "geco-prolog" in trace and "geco-epilog" in trace
    for hook in ("prolog", "epilog"):
        assert done[hook]["SYSLOG_IDENTIFIER"] == f"geco-{hook}"
        assert int(done[hook]["_PID"]) != listener_pid(), done[hook]
        # journald names the process only while it still runs (a hook may be gone by then)
        assert done[hook].get("_COMM", f"geco-{hook}") == f"geco-{hook}"


def _root_socket() -> str:
    cfg = config.load(config.DEFAULT_PATH)
    root = address.privileged(cfg.gecod_privileged_socket, address.parse(cfg.gecod_socket))
    assert root.path is not None
    return root.path


def _ask(hook: Hook) -> Ack:
    secret = Path(config.load(config.DEFAULT_PATH).gecod_key_file).read_bytes()
    frame = encode(MsgType.HOOK, hook, secret)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(_root_socket())
        s.sendall(frame)
        reply = read_frame(s, time.monotonic() + 30)
    return decode_ack(reply, secret, frame[12:28])


def test_a_hook_request_for_another_pid_or_from_no_hook_is_not_done(
        gecod: Any, journal: Any) -> None:
    """Given root's own process (no job's shepherd above it), when it sends gecod a HOOK
    naming another pid, then gecod refuses it and journals why; naming itself, gecod
    does nothing (the Python hook would refuse it the same way)."""
    since = time.time()
    other = _ask(Hook(777, 1, 1, HookName.PROLOG))
    mine = _ask(Hook(777, 1, os.getpid(), HookName.EPILOG))
    refusals = journal.entries(since, GECO_EVENT="quarantine-refused", REQUEST="HOOK")

    assert other.status is AckStatus.REFUSED
    assert mine.status is AckStatus.FAILED
    assert any(f"HOOK must name its sender (pid {os.getpid()})" in e["MESSAGE"]
               for e in refusals), refusals
    assert {e["GECO_EVENT"] for e in journal.entries(since, JOB_ID="777")} == {
        "quarantine-refused"}


def _ask_starter(ask: Starter) -> StarterReply:
    cfg = config.load(config.DEFAULT_PATH)
    public = address.parse(cfg.gecod_socket)
    assert public.path is not None
    frame = encode(MsgType.STARTER, ask, PUBLIC_KEY,
                   flags=PEERCRED)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(public.path)
        s.sendall(frame)
        reply = decode(read_frame(s, time.monotonic() + 30),
                       PUBLIC_KEY, peercred=True)
    assert reply.type is MsgType.STARTER_REPLY
    message = reply.message
    assert isinstance(message, StarterReply)
    return message


def test_a_starter_request_from_outside_the_job_or_for_another_pid_gets_no_answer(
        gecod: Any, journal: Any) -> None:
    """Given a process in no job's cgroups, when it asks gecod how job 777 would start, or
    asks for another pid, then gecod gives no program (the starter would decide, and
    refuse, itself), journals the forged pid, and journals no job-started."""
    since = time.time()
    words = ("/bin/sh", "posix_compliant", "false", "/tmp/x")
    outside = _ask_starter(Starter(777, 1, os.getpid(), words, ("/tmp/x",)))
    other = _ask_starter(Starter(777, 1, 1, words, ("/tmp/x",)))
    events = [e["GECO_EVENT"] for e in journal.entries(since, JOB_ID="777")]
    refusals = journal.entries(since, GECO_EVENT="quarantine-refused", REQUEST="STARTER")

    assert (outside.status, outside.program) == (AckStatus.REFUSED, "")
    assert (other.status, other.program) == (AckStatus.REFUSED, "")
    assert any(f"STARTER must name its sender (pid {os.getpid()})" in e["MESSAGE"]
               for e in refusals), refusals
    assert "job-started" not in events


def test_the_hook_program_reads_no_config_from_the_jobs_environment(
        gecod: Any, tmp_path: Path) -> None:
    """Given a job environment that points GECO_PRELOAD_CONF at a config of its own (its
    own socket), when root's prolog runs, then nothing connects to that socket: the
    program asked the site's gecod, which found no job's shepherd above it, and the
    Python prolog refused the same way (exit 99, its reason on stderr)."""
    fake = tmp_path / "fake.sock"
    (tmp_path / "preload.conf").write_text(f"socket=path:{fake}\nkey_file=/dev/null\n")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(fake))
        listener.listen(8)
        listener.setblocking(False)
        out = subprocess.run([str(LIBEXEC / "prolog"), "777", "1"], capture_output=True,
                             text=True, timeout=120, cwd="/",
                             env={**CLEAN_ENV,
                                  "GECO_PRELOAD_CONF": str(tmp_path / "preload.conf")})
        with pytest.raises(BlockingIOError):
            listener.accept()

    assert out.returncode == 99
    assert "the hook's parent is not an sge_shepherd" in out.stderr


@pytest.mark.parametrize("name", ["prolog", "epilog", "starter"])
def test_the_hook_program_under_another_name_says_so(name: str, tmp_path: Path) -> None:
    """Given the hook program run under a name that is no hook, then it says which names
    it answers to and exits 99 (a job is re-queued, never run unprepared)."""
    odd = tmp_path / "postlog"
    odd.symlink_to(LIBEXEC / name)
    out = subprocess.run([str(odd), "1", "1"], capture_output=True, text=True, timeout=60)

    assert out.returncode == 99
    assert out.stderr == ("geco hook: run it as prolog, epilog or starter (a link or copy "
                          "named so), not as postlog\n")
