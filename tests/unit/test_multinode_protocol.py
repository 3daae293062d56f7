"""The cluster channel's requests and the whole job's figures, without a cluster.

PREPARE, ABORT and RELEASE name the one host they are for and carry the job's resource
set; a frame of them may be larger than the local socket allows (a job of many hosts),
but only where the receiver says so. The master's job-end record merges every host's
figures and names the hosts whose figures are missing. A slave host knows its job's
master, and sends its OOM reports there instead of writing an owner's file of its own.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from geco import config as config_mod
from geco import log
from geco.accounting import Accounting
from geco.errors import ConfigError, GecoError, ProtocolError
from geco.jobkey import JobKey
from geco.oom import OomEvent, handle
from geco.resourceset import NodeResources, ResourceSet
from geco.wire import cluster
from geco.wire.frame import PEERCRED, PUBLIC_KEY, decode, encode, expected_length
from geco.wire.messages import CLUSTER_MAX_PAYLOAD, MsgType, NodeRequest

KEY = bytes(range(32))


@pytest.mark.parametrize(("payload", "why"), [
    (b"\x01" + bytes(7) + b"\x01" + bytes(7) + b"node07", "in at most 255 bytes ending in a NUL"),
    (b"\x01" + bytes(7) + b"\x01" + bytes(7) + b"x" * 256 + b"\0", "ending in a NUL"),
    (b"\x01" + bytes(7) + b"\x01" + bytes(7) + b"../etc\0", "must be a host name"),
    (b"\x01" + bytes(7) + b"\x01" + bytes(7) + b"\0", "must be a host name"),
    (bytes(8) + b"\x01" + bytes(7) + b"node07\0", "job and task ids must be >= 1"),
])
def test_a_cluster_request_without_a_proper_host_or_ids_is_refused(payload: bytes,
                                                                    why: str) -> None:
    """Given a PREPARE payload with no NUL-terminated host, a host that is not a host name,
    or job 0, then decoding it fails as ``payload`` with the reason."""
    frame = encode(MsgType.PREPARE, payload, KEY)

    with pytest.raises(ProtocolError) as info:
        decode(frame, KEY)
    assert info.value.reason == "payload" and why in str(info.value)


def test_a_request_names_its_host_and_carries_the_resources_byte_for_byte() -> None:
    """Given a PREPARE for node07 with resources holding any bytes, then it round-trips."""
    req = NodeRequest(42, 3, "node07.cluster", b"GECOResourceSet_v1{\0\xff}")
    got = decode(encode(MsgType.PREPARE, req, KEY), KEY)

    assert got.type is MsgType.PREPARE and got.message == req


def test_a_large_prepare_passes_only_where_the_cluster_cap_is_given() -> None:
    """Given a PREPARE of 20,000 bytes (a job of some 400 hosts), then the cluster channel's
    cap takes it, and the local socket's (4096) refuses it as ``length`` from its header."""
    req = NodeRequest(42, 1, "node07", b"x" * 20_000)
    frame = encode(MsgType.PREPARE, req, KEY, max_payload=CLUSTER_MAX_PAYLOAD)

    assert decode(frame, KEY, max_payload=CLUSTER_MAX_PAYLOAD).message == req
    with pytest.raises(ProtocolError) as info:
        expected_length(frame[:12])
    assert info.value.reason == "length"
    with pytest.raises(ValueError, match="at most 4096"):
        encode(MsgType.PREPARE, req, KEY)


def test_cluster_requests_never_carry_the_peercred_flag() -> None:
    """Given a PREPARE with the PEERCRED flag (MAC'd with the public key), then it is
    refused: only a holder of the cluster key may ask."""
    frame = encode(MsgType.PREPARE, NodeRequest(42, 1, "node07"), PUBLIC_KEY,
                   flags=PEERCRED)

    with pytest.raises(ProtocolError) as info:
        decode(frame, KEY)
    assert info.value.reason == "flags"


def test_the_whole_job_merges_every_hosts_figures_and_names_the_missing() -> None:
    """Given this host's figures, node2's RELEASE answer and no answer from node3, then the
    job-end fields give the largest peak, the CPU and OOM sums, each host's figures, and
    node3 as missing."""
    here = Accounting(memory_peak=100, cpu_user=1.0, cpu_system=0.5, oom_kills=0)
    node2 = Accounting(memory_peak=300, cpu_user=2.0, cpu_system=0.25, oom_kills=1)
    answers = [cluster.Answer("node2", "released", "", {"accounting": node2._asdict()}),
               cluster.Answer("node3", "unreachable", "connection refused")]

    whole = cluster.whole_job("node1", here, answers)

    assert whole.fields["NODES"] == 3
    assert whole.fields["JOB_MEMORY_PEAK_MAX"] == 300
    assert (whole.fields["JOB_CPU_USER_SEC"], whole.fields["JOB_CPU_SYSTEM_SEC"]) == (
        "3.000", "0.750")
    assert whole.fields["JOB_OOM_KILLS"] == 1
    assert whole.fields["NODES_MISSING"] == "node3"
    assert sorted(json.loads(str(whole.fields["NODE_FIGURES"]))) == ["node1", "node2"]
    assert "no figures from node3" in whole.text


def test_the_cluster_settings_are_read_and_a_bad_one_falls_back(tmp_path: Path) -> None:
    """Given [cluster] with a service address, a key file, lenient slaves and a bad
    timeout, then those are used and the timeout keeps its default; an address that is a
    Unix socket is refused as the cluster port, naming the setting."""
    path = tmp_path / "geco.toml"
    path.write_text('[cluster]\naddress = "port:7000"\nkey_file = "/etc/x.key"\n'
                    'slaves = "lenient"\ntimeout = -1\n')
    cfg = config_mod.load(path)

    assert (cfg.cluster_address, cfg.cluster_key_file, cfg.cluster_slaves,
            cfg.cluster_timeout) == ("port:7000", Path("/etc/x.key"), "lenient", 10.0)
    assert cluster.port(cfg) == 7000
    with pytest.raises(ConfigError, match=r"\[cluster\] address must be a TCP port"):
        cluster.port(cfg._replace(cluster_address="path:/run/x.sock"))


RS = ResourceSet(job_id=42, task_id=1, owner="alice", job_name="mpi",
                 nodes=(NodeResources("node1.cluster"), NodeResources("node2", is_slave=True),
                        NodeResources("node3", is_slave=True)))


def test_a_slave_host_knows_its_jobs_master_and_the_master_has_none() -> None:
    """Given a job over node1 (master), node2 and node3, then node2 and node3 name node1 as
    the job's master host and every other host; node1 is the master itself; a host not in
    the job has no master for it."""
    assert [cluster.master(RS, h) for h in ("node1", "node2", "node3.cluster", "node4")] == [
        None, "node1.cluster", "node1.cluster", None]
    assert cluster.other_hosts(RS, "node2") == ("node1.cluster", "node3")


class NoBackend:
    """The policy ``kernel`` never touches the cgroups."""


def test_an_oom_kill_on_a_slave_goes_to_the_master_once_in_the_owners_words(
        caplog: pytest.LogCaptureFixture) -> None:
    """Given two kills in job 42.1 on slave node2 and no stderr file there, when they are
    handled with a relay to the master, then the relay gets one text with both paragraphs
    (the words a kill on the master would write); when the relay fails, that is journaled
    as oom-report-failed and nothing is raised."""
    events = [OomEvent(JobKey(42, 1), "node2", 300 << 20, 301 << 20, pid=4242,
                       command="python3", kill_count=n) for n in (1, 2)]
    sent: list[str] = []

    handle(events, "kernel", NoBackend(), relay=sent.append)  # type: ignore[arg-type]

    assert len(sent) == 1 and sent[0].count("geco: job 42.1 on node node2 used more memory") == 2
    assert sent[0].endswith("\n")

    def refuse(text: str) -> None:
        raise GecoError("the job's master host node1 did not take it: no-answer")

    with caplog.at_level(logging.WARNING, logger="geco"):
        handle(events[:1], "kernel", NoBackend(), relay=refuse)  # type: ignore[arg-type]
    [failed] = [r for r in caplog.records
                if getattr(r, log.FIELDS_ATTR, {}).get("GECO_EVENT") == "oom-report-failed"]
    assert "master host node1 did not take it" in failed.getMessage()
