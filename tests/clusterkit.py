"""The emulated cluster of the multinode tests: ``integration/cluster/cluster.sh``, run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["CLUSTER", "ON_CLUSTER", "PE", "PORT", "QUEUE", "WAIT_ON_EVERY_HOST", "cluster",
           "exchange_from", "submit_pe"]

CLUSTER = Path(__file__).resolve().parents[1] / "integration" / "cluster" / "cluster.sh"
QUEUE = "geco-test-cluster.q"
PE = "geco-test-cluster"
# what a job must request to run in QUEUE (cluster.sh's FORCED complex)
ON_CLUSTER = ("-l", "geco_test_cluster=TRUE")
PORT = 6446
# A job script of a -pe job: a task on every host of the job (qrsh -inherit) and the master
# itself each touch up.<host> in the job's dir and wait until the test touches "go" there.
WAIT_ON_EVERY_HOST = """#!/bin/bash
wait_here='touch up.$(hostname); while [ ! -e go ]; do sleep 0.2; done'
for h in $(awk 'NR > 1 { print $1 }' "$PE_HOSTFILE"); do
  qrsh -inherit "$h" "cd $PWD && $wait_here" &
done
eval "$wait_here"
wait
"""
PYTHON = "/opt/geco-dev/venv/bin/python"
# run in a host's network namespace: one frame from stdin to host:port, the reply to stdout
_EXCHANGE = """
import socket, sys, time
from geco.wire.messages import CLUSTER_MAX_PAYLOAD
from geco.wire.reader import read_frame
host, port = sys.argv[1], int(sys.argv[2])
with socket.create_connection((host, port), timeout=10) as sock:
    sock.sendall(sys.stdin.buffer.read())
    reply = read_frame(sock, time.monotonic() + 10, CLUSTER_MAX_PAYLOAD)
sys.stdout.buffer.write(reply)
"""


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``cluster.sh`` with ``args`` (up N, down, status, stop-gecod K, start-gecod K,
    run K command...)."""
    return subprocess.run(["bash", str(CLUSTER), *args], capture_output=True, text=True,
                          timeout=600, check=False)


def submit_pe(sge: Any, owner: Any, name: str, script: str, *extra: str,
              output: str = "out") -> tuple[int, Path]:
    """Submit ``script`` as ``owner`` from a fresh dir of theirs: a 3-slot -pe job, one slot
    per host, its master on geco-node1, stdout and stderr merged into ``output`` there.
    Returns the job id and the dir."""
    out = owner.make_dir(name)
    path = out / "pe.sh"
    path.write_text(script)
    os.chown(path, owner.uid, owner.gid)
    job = sge.submit("-q", QUEUE, *ON_CLUSTER, "-pe", PE, "3", "-masterq",
                     f"{QUEUE}@geco-node1", "-cwd", "-o", output, "-j", "y", *extra,
                     str(path), cwd=out)
    return job, out


def exchange_from(k: int, frame: bytes, host: str, port: int = PORT) -> bytes:
    """Send ``frame`` to ``host``'s cluster channel from emulated host ``k`` (its network
    namespace: a host the channel lets in) and return the reply's frame.

    Raises
    ------
    RuntimeError
        naming what the sender printed when it got no reply.
    """
    sent = subprocess.run(["nsenter", f"--net=/run/netns/geco-test-n{k}", PYTHON, "-c",
                           _EXCHANGE, host, str(port)], input=frame, capture_output=True,
                          timeout=60, check=False)
    if sent.returncode != 0:
        raise RuntimeError(f"no reply from {host}:{port}: {sent.stderr.decode(errors='replace')}")
    return sent.stdout
