"""Issue 37, point 1 from the other side: a job's end never takes a pid the kernel will
not pin (``pidfd_open`` says EINVAL, or ENOENT on Linux 6.9 and later: a thread's id, or a
process half way through its exit) for a stuck process, which would keep the job's cgroups
and disable its queue."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

from geco.cgroup._fs import signal_pid

WAIT = 30.0

# a process whose second thread says its id and waits
_TWO_THREADS = ("import threading, sys, time\n"
                "def run():\n"
                "    print(threading.get_native_id(), flush=True)\n"
                "    time.sleep(600)\n"
                "threading.Thread(target=run, daemon=True).start()\n"
                "time.sleep(600)\n")


def test_a_pid_pidfd_open_refuses_with_einval_is_still_signalled_while_a_member() -> None:
    """Given a pid the kernel will not give a pidfd for (a thread's id), when the
    job's end SIGKILLs it as a member, then its process dies of SIGKILL (no error); and a
    pid that is no member any more is left alone."""
    child = subprocess.Popen([sys.executable, "-c", _TWO_THREADS], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        tid = int(child.stdout.readline())
        assert tid != child.pid
        try:
            os.close(os.pidfd_open(tid))
            raise AssertionError("this kernel pins a thread's id; the case is not made")
        except OSError as exc:
            assert exc.errno in (errno.EINVAL, errno.ENOENT), exc  # the case in point
        assert signal_pid(tid, signal.SIGKILL, lambda pid: False) is False
        assert child.poll() is None
        assert signal_pid(tid, signal.SIGKILL, lambda pid: pid == tid) is True
        assert child.wait(timeout=WAIT) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
