"""No user can stall the cluster channel: parallel jobs start, report and end under attack.

Three emulated hosts (``integration/cluster/cluster.sh``), each with its own gecod whose
cluster channel lets in the cluster's execution hosts only. The attacker
(:data:`stallkit.ATTACKER`, an ordinary account on every host) does what issue 32
found stalled the channel, each for at least :data:`ATTACK_SECONDS` and until the test
has seen it bite (:func:`stallkit.attack_until`):

* from geco-node2, one of the cluster's own hosts: 64 idle connections each to
  geco-node1's and geco-node3's cluster ports (re-opened as they are closed: they once
  filled the channel, and PREPARE, RELEASE and CALLERID went unanswered) and frames
  MAC'd with a key of their own naming the other user's job (once journaled one warning
  each, under that job's id); from this machine, which is no execution host, idle
  connections too;
* a job of theirs over geco-node2 and geco-node3 whose stderr file on its master is a
  FIFO nobody reads, its task on geco-node3 killed for its memory every few hundred ms:
  each kill's words are relayed to geco-node2's gecod, which once waited on the FIFO in
  one of its four cluster workers.

Meanwhile the other user's 3-host parallel job starts at its first try (every host
prepared, JOB_STARTED and PREPARE answered within a second), `geco status --job` shows
all of its hosts and it ends with every host's figures; during the relayed reports,
that user's jobs on geco-node1 (at least :data:`VICTIM_JOBS`, one after another) start
at once and geco-node2 answers its look-ups within a second. No queue goes into error.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.wire.frame import decode, encode
from geco.wire.messages import CLUSTER_MAX_PAYLOAD, MsgType, NodeRequest
from tests.clusterkit import (
    ON_CLUSTER,
    PE,
    QUEUE,
    WAIT_ON_EVERY_HOST,
    cluster,
    exchange_from,
    submit_pe,
)
from tests.integration.livekit import no_queue_in_error, processes_of, wait_until
from tests.servicekit import JobOwner, Journal, ensure_user
from tests.stallkit import (
    ALLOCATE,
    ATTACKER,
    attack_until,
    geco_ms,
    goal_ms,
    tcp_garbage,
    tcp_idle,
    unfifo,
)

pytestmark = pytest.mark.sge

ATTACK_SECONDS = 10.0  # at least; then until the attack and the victim showed enough
FORGED = 100  # frames of the attacker's key, more than
OOM_KILLS = 10  # on the attacker's slave, at least
VICTIM_JOBS = 4  # on geco-node1 during the relayed reports, at least
GECO = "/usr/bin/geco"
STATE = Path("/run/geco-test-cluster")
NODE1, NODE2, NODE3 = "10.77.1.11", "10.77.2.11", "10.77.3.11"
PORT = 6446


@pytest.fixture(scope="module")
def attacker() -> JobOwner:
    return ensure_user(ATTACKER)


def _ms(records: list[dict[str, Any]]) -> list[float]:
    return [float(r["ELAPSED_MS"]) for r in records]


def _node1_job(sge: Any, cwd: Path) -> int:
    """A one-slot job of the test user's on geco-node1 (it starts, and ends); its id once
    it ended."""
    job = sge.submit("-q", f"{QUEUE}@geco-node1", *ON_CLUSTER, "-b", "y", "-o", "/dev/null",
                     "-e", "/dev/null", "true", cwd=cwd)
    sge.wait_finished(job, timeout=120)
    return job


def _started_ms(journal: Any, job: int) -> float:
    """gecod's own time for the job's JOB_STARTED (stallkit.geco_ms)."""
    [started] = journal.wait_for(20, JOB_ID=str(job), GECO_EVENT="quarantined",
                                 REQUEST="JOB_STARTED")
    return geco_ms(started)


def _from_node2(journal: Journal, since: float) -> tuple[list[dict[str, Any]],
                                                        list[dict[str, Any]], int]:
    """The refusals of geco-node2's connections, journaled one by one and in their windows'
    summaries, and how many those count between them."""
    records = [e for e in journal.entries(since, GECO_EVENT="cluster-refused")
               if e.get("PEER", "").startswith(f"{NODE2}:")]
    summaries = journal.entries(since, GECO_EVENT="cluster-refused-summary", PEER=NODE2)
    return records, summaries, len(records) + sum(int(e["REFUSED"]) for e in summaries)


def _outsiders(journal: Journal, since: float) -> list[dict[str, Any]]:
    """This machine's connections to the cluster port, refused as no cluster host's."""
    return [e for e in journal.entries(since, GECO_EVENT="cluster-refused", REASON="not-allowed")
            if e.get("PEER", "").startswith("10.77.1.1:")]  # this machine's side


def test_a_parallel_job_starts_and_ends_while_a_user_floods_the_cluster_ports(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any, attacker: JobOwner,
        figures: list[str]) -> None:
    """Given the attacker holding 64 idle connections each to geco-node1's and geco-node3's
    cluster ports from geco-node2, sending frames of a key of their own that name the other
    user's job, and holding idle connections from this machine (no execution host), for
    at least 10 s and until each of those was seen refused or closed (over 100 forged
    frames sent), when that user's 3-host job runs meanwhile, then it starts at its first
    try with every JOB_STARTED (geco's share: stallkit.geco_ms) and PREPARE answered within
    1 s (stallkit.goal_ms on a machine slower than that), `geco status --job` shows its
    three hosts, and it ends with all three hosts' figures; the forged frames are journaled
    within the peer's budget and never under that job's id; this machine's connections are
    closed unread; no queue is in error."""
    since = time.time()
    quiet = _started_ms(journal, _node1_job(sge, job_owner.make_dir("stall-quiet")))
    # held (-h) until the attack is on
    job, out = submit_pe(sge, job_owner, "stall-pe", WAIT_ON_EVERY_HOST, "-h")
    try:
        with tcp_idle(attacker.name, NODE1, PORT, 64, netns="geco-test-n2") as idle1, \
                tcp_idle(attacker.name, NODE3, PORT, 64, netns="geco-test-n2") as idle3, \
                tcp_garbage(attacker.name, NODE1, PORT, job, netns="geco-test-n2") as forged, \
                tcp_idle(attacker.name, NODE1, PORT, 16) as outside:
            started = time.monotonic()
            # the attack is on once geco-node1 refuses the forged frames
            wait_until(lambda: journal.entries(since, CLAIMED_JOB_ID=str(job),
                                               GECO_EVENT="cluster-refused"), 60,
                       "geco-node1 to refuse the attacker's frames")
            subprocess.run(["qrls", str(job)], check=True, capture_output=True)
            wait_until(lambda: sorted(p.name for p in out.glob("up.*"))
                       == ["up.geco-node1", "up.geco-node2", "up.geco-node3"], 120,
                       f"the job's three tasks to run: {list(out.iterdir())}")
            shown = cluster("run", "1", GECO, "status", "--job", str(job), "--json")

            def refused() -> bool:  # the counts first: the journal is read once they are met
                return (forged["frames sent"] > FORGED and outside["closed by gecod"] > 0
                        and idle1["closed by gecod"] > 0 and idle3["closed by gecod"] > 0
                        and bool(_outsiders(journal, since))
                        and _from_node2(journal, since)[2] >= forged["frames sent"])

            attack_until(started, ATTACK_SECONDS, refused, lambda: time.sleep(0.5))
            (out / "go").touch()
            [record] = sge.wait_finished(job, timeout=180)
            attack = time.monotonic() - started
    finally:
        (out / "go").touch()
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)

    assert (record["failed"], record["exit_status"]) == ("0", "0"), record
    assert not journal.entries(since, JOB_ID=str(job), GECO_EVENT="barrier-failed")
    assert shown.returncode == 0, shown.stderr
    assert sorted(json.loads(shown.stdout)["jobs"][0]["hosts"]) == [
        "geco-node1", "geco-node2", "geco-node3"], shown.stdout
    [end] = journal.wait_for(30, JOB_ID=str(job), GECO_EVENT="job-end")
    assert end["NODES"] == "3" and "NODES_MISSING" not in end, end
    starts = [geco_ms(r) for r in journal.entries(since, JOB_ID=str(job),
                                                  GECO_EVENT="quarantined",
                                                  REQUEST="JOB_STARTED")]
    prepares = _ms(journal.entries(since, JOB_ID=str(job), GECO_EVENT="job-prepared",
                                   REQUEST="PREPARE"))
    assert len(starts) >= 3 and len(prepares) == 2, (starts, prepares)
    assert max(starts + prepares) < goal_ms(quiet), (starts, prepares, quiet)
    assert no_queue_in_error(sge) == {}

    # the forged frames: never under the job's id, a few records per window and summaries
    assert not journal.entries(since, JOB_ID=str(job), GECO_EVENT="cluster-refused")
    from_node2, summaries, counted = _from_node2(journal, since)
    windows = (time.time() - since) / 10 + 2
    assert len(from_node2) <= 10 * 2 * windows, len(from_node2)  # two hosts' budgets
    assert counted >= forged["frames sent"] > FORGED, (counted, forged)
    # this machine is not one of the cluster's hosts: closed before a byte was read
    outsiders = _outsiders(journal, since)
    assert outsiders and outside["closed by gecod"] > 0, (outsiders[:2], outside)
    assert idle1["closed by gecod"] > 0 and idle3["closed by gecod"] > 0, (idle1, idle3)
    figures.append(
        f"stall, cluster port, {attack:.0f} s of attack "
        f"({idle1['connected'] + idle3['connected']:,} idle connections from a cluster host, "
        f"{forged['frames sent']:,} forged frames, "
        f"{outside['connected']:,} connections from outside): the other user's 3-host job "
        f"started at once, JOB_STARTED max {max(starts):.1f} ms, PREPARE max "
        f"{max(prepares):.1f} ms; {len(from_node2)} refusal records + {len(summaries)} "
        f"summaries for the forged frames")


RELAY_JOB = """#!/bin/bash
loop='while [ ! -e {dir}/stop ]; do /usr/bin/python3 {dir}/alloc.py; sleep 0.3; done'
err="$SGE_STDERR_PATH"
rm -f "$err" && mkfifo "$err"
touch hog-up
qrsh -inherit geco-node3 "$loop"
rm -f "$err" && touch "$err"
"""


def _look_up(key: bytes, job: int) -> float:
    """A NODE_STATUS to geco-node2 from geco-node1 (as `geco status --job` asks); seconds."""
    frame = encode(MsgType.NODE_STATUS, NodeRequest(job, 1, "geco-node2"), key,
                   max_payload=CLUSTER_MAX_PAYLOAD)
    started = time.monotonic()
    reply = exchange_from(1, frame, NODE2)
    took = time.monotonic() - started
    got = decode(reply, key, max_payload=CLUSTER_MAX_PAYLOAD)
    assert got.type is MsgType.NODE_REPLY, got
    return took


def _kills(journal: Journal, since: float, hog: int) -> list[dict[str, Any]]:
    return journal.entries(since, JOB_ID=str(hog), GECO_EVENT="oom")


def _relayed(journal: Journal, since: float, hog: int) -> list[dict[str, Any]]:
    """The slave's OOM reports the master could not take (its .e file a FIFO)."""
    return journal.entries(since, JOB_ID=str(hog), GECO_EVENT="cluster-request-failed",
                           REQUEST="OOM_REPORT")


def test_a_masters_gecod_answers_while_a_slaves_oom_words_for_a_fifo_flood_it(
        sge: Any, journal: Any, three_hosts: None, job_owner: Any, attacker: JobOwner,
        figures: list[str]) -> None:
    """Given the attacker's 2-host job (master geco-node2, its stderr file a FIFO nobody
    reads; its task on geco-node3 killed for its memory every few hundred ms, each kill's
    words relayed to geco-node2), for at least 10 s and until 10 kills and refused relays
    were journaled, when the other user starts jobs on geco-node1 one after another (at
    least 4) and geco-node1 asks geco-node2 for a job's figures after each, then each job
    starts at its first try (JOB_STARTED within 1 s), each look-up is answered within 1 s
    (both: stallkit.goal_ms on a slower machine), geco-node2 refused the relayed words for
    the FIFO at once, and the attacker's job ends with both hosts' figures, nothing of
    theirs left running; no queue is in error."""
    since = time.time()
    key = (STATE / "cluster.key").read_bytes()
    victim_dir = job_owner.make_dir("stall-relay-victim")
    quiet_job = _node1_job(sge, victim_dir)
    quiet = (_started_ms(journal, quiet_job), _look_up(key, quiet_job) * 1000)
    hog_dir = attacker.make_dir("stall-relay")
    script = hog_dir / "relay.sh"
    script.write_text(RELAY_JOB.format(dir=hog_dir))
    (hog_dir / "alloc.py").write_text(ALLOCATE)
    os.chown(script, attacker.uid, attacker.gid)
    hog = sge.submit("-q", f"{QUEUE}@geco-node2,{QUEUE}@geco-node3", *ON_CLUSTER, "-pe", PE, "2",
                     "-masterq", f"{QUEUE}@geco-node2", "-cwd", "-o", "/dev/null",
                     "-l", "m_mem_free=200M", str(script), cwd=hog_dir, user=attacker.name)
    jobs: list[int] = []
    looks: list[float] = []
    try:
        wait_until(lambda: journal.entries(since, JOB_ID=str(hog), GECO_EVENT="oom-relayed")
                   or journal.entries(since, JOB_ID=str(hog),
                                      GECO_EVENT="cluster-request-failed"), 180,
                   "the attacker's slave to relay its first OOM kill")

        def victim() -> None:
            jobs.append(_node1_job(sge, victim_dir))
            looks.append(_look_up(key, jobs[-1]))

        attack = attack_until(time.monotonic(), ATTACK_SECONDS,
                              lambda: len(looks) >= VICTIM_JOBS
                              and len(_kills(journal, since, hog)) >= OOM_KILLS
                              and bool(_relayed(journal, since, hog)), victim)
    finally:
        (hog_dir / "stop").touch()
        unfifo(hog_dir / f"relay.sh.e{hog}", attacker.uid, attacker.gid)
    [hog_record] = sge.wait_finished(hog, timeout=180)

    starts = []
    for job in jobs:
        [record] = sge.accounting(job)
        assert (record["failed"], record["exit_status"]) == ("0", "0"), record
        starts.append(_started_ms(journal, job))
    assert max(starts) < goal_ms(quiet[0]), (starts, quiet)
    assert max(looks) * 1000 < goal_ms(quiet[1]), (looks, quiet)
    assert no_queue_in_error(sge) == {}
    # the attack was real: the slave's kills reached geco-node2, which refused the FIFO
    relayed = _relayed(journal, since, hog)
    kills = _kills(journal, since, hog)
    assert attack >= ATTACK_SECONDS and len(kills) >= OOM_KILLS, (attack, len(kills))
    assert relayed and all("FIFO" in e["MESSAGE"] for e in relayed), relayed[:2]
    [end] = journal.wait_for(30, JOB_ID=str(hog), GECO_EVENT="job-end")
    assert end["NODES"] == "2" and "NODES_MISSING" not in end, end
    assert hog_record["exit_status"] == "0", hog_record
    # nothing of the attacker's outlives the job, on either host (one kernel: one /proc)
    wait_until(lambda: not processes_of(attacker.uid), 60,
               f"the attacker's processes to end: {processes_of(attacker.uid)}")
    figures.append(
        f"stall, relayed OOM words for a FIFO, {attack:.0f} s ({len(kills)} kills on the "
        f"slave, {len(relayed)} relays refused by the master): the other user's "
        f"{len(jobs)} jobs started at once (JOB_STARTED p50 {statistics.median(starts):.1f} "
        f"ms, max {max(starts):.1f} ms), the master's look-ups max {max(looks) * 1000:.0f} ms")


@pytest.fixture(autouse=True)
def _no_leftover(attacker: JobOwner) -> Iterator[None]:
    yield
    subprocess.run(["qdel", "-f", "-u", attacker.name], capture_output=True, check=False)
