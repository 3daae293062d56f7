"""The pid-reuse guard fails closed: a Unix socket peer gecod could not pin is refused.

gecod opens a pidfd of every Unix socket peer when it connects
(:mod:`geco.daemon.server`); the quarantine moves the pid only when that pidfd
shows afterwards that the pid still named the peer. When ``pidfd_open``
failed (fd limit, a kernel without it) the request carries ``pidfd=-1``, and
nothing could tell the peer from a newcomer with its pid: refused, before any
/proc, spool or cgroup is looked at (the backend here is never touched).
"""

from __future__ import annotations

import os
from typing import cast

import pytest

from geco.cgroup import Backend
from geco.config import Config
from geco.daemon.context import GecodContext, Peer
from geco.daemon.quarantine import Request, quarantine
from geco.wire.messages import AckStatus, MsgType


@pytest.mark.parametrize("kind", [MsgType.JOB_STARTED, MsgType.QUARANTINE_SELF])
def test_a_unix_socket_peer_without_a_pidfd_is_refused(kind: MsgType) -> None:
    """Given a request from a Unix socket peer that gecod holds no pidfd of, when it is
    decided, then REFUSED with the reason, and nothing is moved."""
    pid = os.getpid()
    ctx = GecodContext(Config(), cast(Backend, None))  # a rule that touched it would raise
    req = Request(kind, 42, 1, pid, Peer(pid, 0, 0), pidfd=-1)

    outcome = quarantine(req, ctx)

    assert (outcome.status, outcome.reason) == (
        AckStatus.REFUSED,
        f"gecod could not pin process {pid} (pidfd_open failed when it connected), so it "
        "cannot tell it from a process that reuses its pid; refused")
    assert outcome.limits is None and not outcome.created
