"""gecod's Prometheus endpoint (geco.daemon.metrics, geco.usage.exposition) and the
sampler's in-memory snapshot it reads (geco.usage.sampler).

The exposition is parsed back with prometheus_client's own parser; the endpoint is a
real socket on a loopback port, with clients that behave and clients that do not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.cgroup._counters import Counter, whole
from geco.config import Config
from geco.daemon import metrics
from geco.daemon.metrics import Listen, parse_listen
from geco.errors import ConfigError, GecoError
from geco.jobkey import JobKey
from geco.usage import samples
from geco.usage.sampler import Health, JobFigures, NodeFigures, Sampler, Snapshot
from geco.usage.samples import Header, Sample

exposition = pytest.importorskip("geco.usage.exposition")
parser = pytest.importorskip("prometheus_client.parser")

WAIT = 10.0
HEADER = Header(4242, 3, owner="alice", job_name="a name of the owner's choice",
                queue="all.q", host="node1", cores=2, memory=1 << 30, gpus=1, started=1000.0)
# 100 s after its start: 150 s of CPU on 2 cores = 0.75; peak 512M of 1G = 0.5
SAMPLE = Sample(1100.0, cpu_user_usec=120_000_000, cpu_system_usec=30_000_000,
                memory_current=300 << 20, memory_peak=512 << 20, tasks=7, oom_kills=1)
LABELS = {"job_id": "4242", "task_id": "3", "owner": "alice", "queue": "all.q",
          "node": "node1"}


def _series(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``{(name, labels): value}`` of an exposition text."""
    found = {}
    for family in parser.text_string_to_metric_families(body.decode()):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def _of(series: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
        **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


def _renderer(snap: Snapshot, health: Health | None = None) -> Any:
    now = health or Health(10, 2, 1)
    return exposition.Renderer(lambda: snap, lambda: now, "node1")


# -- the address ------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("", None),
    ("127.0.0.1:9477", Listen("127.0.0.1", 9477)),
    ("[::1]:9477", Listen("::1", 9477)),
    ("0.0.0.0:80", Listen("0.0.0.0", 80)),
    ("[0:0::1]:65535", Listen("::1", 65535)),
])
def test_listen_addresses_are_read(text: str, expected: Listen | None) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("9477", "names no port"),
    ("localhost:9477", "does not name an IP address: 'localhost'"),
    ("::1:9477", "must put an IPv6 address in brackets"),
    ("[127.0.0.1]:9477", "brackets are for IPv6 only"),
    (":9477", "names no address"),
    ("127.0.0.1:0", "does not name a TCP port 1..65535: '0'"),
    ("127.0.0.1:65536", "does not name a TCP port"),
    ("127.0.0.1:http", "does not name a TCP port"),
    ("127.0.0.1:\u0663", "does not name a TCP port"),
    ("127.0.0.1:", "does not name a TCP port"),
])
def test_a_bad_listen_address_is_one_error_naming_it_and_the_forms(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_listen(text)
    message = str(caught.value)
    assert message.startswith(f"[metrics] listen = {text!r} ") and why in message, message
    assert "127.0.0.1:9477" in message and "\n" not in message


def test_geco_check_can_say_where_the_metrics_are_or_why_not() -> None:
    assert metrics.describe(Config()) == "no Prometheus endpoint ([metrics] listen = \"\")"
    assert metrics.describe(Config(metrics_listen="127.0.0.1:9477")) == \
        "gecod serves Prometheus metrics on http://127.0.0.1:9477/metrics"
    assert "does not name an IP address" in metrics.describe(Config(metrics_listen="x:1"))


# -- the exposition ----------------------------------------------------------------


def test_a_job_is_exported_with_its_labels_and_figures_and_never_its_name() -> None:
    snap = Snapshot(1100.0, (JobFigures(HEADER, SAMPLE),),
                    NodeFigures(cores=8, cores_free=6, memory=16 << 30, memory_free=15 << 30,
                                memory_used=300 << 20, jobs=1), rounds=5)
    body = _renderer(snap).render()
    s = _series(body)
    assert _of(s, "geco_job_cpu_seconds_total", **LABELS, mode="user") == 120.0
    assert _of(s, "geco_job_cpu_seconds_total", **LABELS, mode="system") == 30.0
    assert _of(s, "geco_job_memory_bytes", **LABELS) == 300 << 20
    assert _of(s, "geco_job_memory_peak_bytes", **LABELS) == 512 << 20
    assert _of(s, "geco_job_memory_limit_bytes", **LABELS) == 1 << 30
    assert _of(s, "geco_job_cores", **LABELS) == 2
    assert _of(s, "geco_job_gpus", **LABELS) == 1
    assert _of(s, "geco_job_tasks", **LABELS) == 7
    assert _of(s, "geco_job_oom_kills_total", **LABELS) == 1
    assert _of(s, "geco_job_start_time_seconds", **LABELS) == 1000.0
    assert _of(s, "geco_job_cpu_efficiency_ratio", **LABELS) == pytest.approx(0.75)
    assert _of(s, "geco_job_memory_efficiency_ratio", **LABELS) == pytest.approx(0.5)
    assert b"a name of the owner" not in body
    node = {"node": "node1"}
    assert (_of(s, "geco_node_cores", **node), _of(s, "geco_node_cores_free", **node)) == (8, 6)
    assert _of(s, "geco_node_memory_bytes", **node) == 16 << 30
    assert _of(s, "geco_node_memory_free_bytes", **node) == 15 << 30
    assert _of(s, "geco_node_memory_used_bytes", **node) == 300 << 20
    assert _of(s, "geco_node_jobs", **node) == 1
    assert _of(s, "gecod_requests_total", **node) == 10
    assert _of(s, "gecod_refused_total", **node) == 2
    assert _of(s, "gecod_queue_depth", **node) == 1
    assert _of(s, "gecod_sample_rounds_total", **node) == 5
    assert _of(s, "gecod_last_sample_timestamp_seconds", **node) == 1100.0
    # one label set per job: every job series carries exactly the job's labels
    for (name, labels), _value in s.items():
        if name.startswith("geco_job_"):
            assert {k: v for k, v in labels if k != "mode"} == LABELS, name


def test_what_the_kernel_does_not_count_is_left_out_not_exported_as_minus_one() -> None:
    """Given a job whose sample has -1 for every counter, no limit and no known start,
    then only what it was granted is exported: no -1, no efficiency."""
    header = HEADER._replace(memory=0, started=0.0)
    body = _renderer(Snapshot(1100.0, (JobFigures(header, Sample(1100.0)),))).render()
    s = _series(body)
    names = {name for name, labels in s if ("job_id", "4242") in labels}
    assert names == {"geco_job_cores", "geco_job_gpus"}
    assert b"-1" not in body


def test_a_job_s_series_go_with_it_at_the_next_round() -> None:
    other = HEADER._replace(job_id=7, task_id=1)
    snaps = [Snapshot(1100.0, (JobFigures(HEADER, SAMPLE), JobFigures(other, SAMPLE))),
             Snapshot(1130.0, (JobFigures(other, SAMPLE),))]
    renderer = exposition.Renderer(lambda: snaps[0], lambda: Health(0, 0, 0), "node1")
    renderer.prepare()
    assert b'job_id="4242"' in renderer.render() and b'job_id="7"' in renderer.render()
    snaps.pop(0)
    renderer.prepare()
    assert b'job_id="4242"' not in renderer.render() and b'job_id="7"' in renderer.render()


def test_the_jobs_are_rendered_once_per_round_and_the_health_at_each_scrape() -> None:
    snap = Snapshot(1100.0, (JobFigures(HEADER, SAMPLE),))
    health = [Health(1, 0, 0)]
    renderer = exposition.Renderer(lambda: snap, lambda: health[0], "node1")
    renderer.prepare()
    made = renderer._made
    health[0] = Health(2, 1, 0)
    renderer.prepare()  # the same round: nothing made again
    assert renderer._made is made
    assert _of(_series(renderer.render()), "gecod_requests_total", node="node1") == 2


def test_a_label_value_with_quotes_and_newlines_is_escaped() -> None:
    header = HEADER._replace(owner='a"b\\c\nd', queue="q")
    s = _series(_renderer(Snapshot(1100.0, (JobFigures(header, SAMPLE),))).render())
    assert _of(s, "geco_job_cores", **{**LABELS, "owner": 'a"b\\c\nd', "queue": "q"}) == 2


# -- the sampler's snapshot -----------------------------------------------------------


class _Backend:
    """The few Backend calls the sampler makes, over a dict of jobs whose counters are
    files of one number each (as cgroup files are)."""

    def __init__(self, files: Path) -> None:
        self.files = files
        self.jobs: dict[JobKey, dict[str, int]] = {}
        self.cpus: dict[JobKey, str] = {}

    def job_keys(self) -> list[JobKey]:
        return sorted(self.jobs)

    def usage_counters(self, key: JobKey) -> list[Counter]:
        if key not in self.jobs:
            raise GecoError(f"job {key} is gone")
        d = self.files / str(key)
        d.mkdir(parents=True, exist_ok=True)
        for name, value in self.jobs[key].items():
            (d / name).write_text(f"{value}\n")
        return [whole(d / name, name) for name in self.jobs[key]]

    def exists(self, key: JobKey) -> bool:
        return key in self.jobs

    def read_limits(self, key: JobKey) -> Any:
        class _Limits:
            cpus = self.cpus.get(key, "")
        return _Limits()

    def available_cpus(self) -> str:
        return "0-7"


class _NoLoop:
    def add_timer(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("the test runs rounds itself")


@pytest.fixture
def sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sampler, Any]]:
    tmp_path.chmod(0o755)
    backend = _Backend(tmp_path / "cgroups")

    def header_of(cfg: Config, key: JobKey, host: str, rs: object) -> Header:
        return HEADER._replace(job_id=key.job, task_id=key.task, host=host)

    monkeypatch.setattr(samples, "header_of", header_of)
    cfg = Config()._replace(state_dir=tmp_path / "state", cpus_reserve="7",
                            memory_reserve=0)
    s = Sampler(_NoLoop(), backend, cfg, node="node1")  # type: ignore[arg-type]
    try:
        yield s, backend
    finally:
        s.close()


def test_each_round_replaces_the_snapshot_and_a_job_gone_is_in_no_later_one(
        sampler: tuple[Sampler, Any]) -> None:
    s, backend = sampler
    assert s.latest == Snapshot()
    usage = {"cpu_user_usec": 5_000_000, "cpu_system_usec": 0, "memory_current": 100 << 20,
             "memory_peak": 200 << 20, "pids_current": 3, "oom_kill": 0}
    backend.jobs = {JobKey(1, 1): usage, JobKey(2, 1): usage}
    backend.cpus = {JobKey(1, 1): "0-1", JobKey(2, 1): "2"}
    rounds = []
    s.on_round = lambda: rounds.append(s.latest)
    s.sample_all()
    first = s.latest
    assert [f.header.job_id for f in first.jobs] == [1, 2]
    assert first.jobs[0].sample.memory_current == 100 << 20
    assert first.rounds == 1 and rounds == [first]
    # cpus 0-6 for jobs (7 is reserved), 0-2 held; every header grants 1G
    assert first.node is not None
    assert (first.node.cores, first.node.cores_free, first.node.jobs) == (7, 4, 2)
    assert first.node.memory_used == 200 << 20
    assert first.node.memory_free == first.node.memory - (2 << 30)
    del backend.jobs[JobKey(1, 1)]
    s.sample_all()
    assert [f.header.job_id for f in s.latest.jobs] == [2]
    assert s.latest.node is not None and s.latest.node.cores_free == 6
    assert first.jobs[0].header.job_id == 1  # the old snapshot itself is never changed


def test_a_job_whose_file_is_refused_is_still_in_the_snapshot(
        sampler: tuple[Sampler, Any]) -> None:
    """Its owner can hold its samples file's lock: that costs the file its sample, not
    the job its series."""
    s, backend = sampler
    backend.jobs = {JobKey(3, 1): {"memory_current": 1}}
    s.cfg.usage_dir.mkdir(parents=True)
    os.mkfifo(s.cfg.usage_dir / "3.1")  # not a file gecod writes to
    s.sample_all()
    assert [f.header.job_id for f in s.latest.jobs] == [3]
    assert s.latest.jobs[0].sample.memory_current == 1


# -- the endpoint ---------------------------------------------------------------------


class _Body:
    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, text: bytes = b"geco_node_jobs 1\n") -> None:
        self.text = text
        self.renders = 0

    def prepare(self) -> None:
        pass

    def render(self) -> bytes:
        self.renders += 1
        return self.text


@pytest.fixture
def endpoint() -> Iterator[metrics.Endpoint]:
    where = Listen("127.0.0.1", 0)
    sock = metrics.listener(where)
    e = metrics.Endpoint(sock, _Body(), "test")
    e.start()
    try:
        yield e
    finally:
        e.close()


def _port(e: metrics.Endpoint) -> int:
    return int(e.listener.getsockname()[1])


def _ask(port: int, request: bytes, timeout: float = WAIT) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_get_metrics_is_served_with_its_length_and_type(endpoint: metrics.Endpoint) -> None:
    reply = _ask(_port(endpoint), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4" in head
    assert b"Content-Length: 17\r\n" in head and body == b"geco_node_jobs 1\n"
    head_only = _ask(_port(endpoint), b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n")
    assert head_only.startswith(b"HTTP/1.1 200 OK") and head_only.endswith(b"\r\n\r\n")
    assert _ask(_port(endpoint), b"GET / HTTP/1.1\n\n").endswith(b"at /metrics\n")


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),
    (b"GET /metrics/../../etc/passwd HTTP/1.1\r\n\r\n", b"404"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),
    (b"GET /metrics\r\n\r\n", b"400"),
    (b"GET /metrics SPDY/3\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    (b"GET /" + b"m" * 9000 + b" HTTP/1.1\r\n\r\n", b"431"),
])
def test_anything_but_a_get_of_the_metrics_gets_an_error_and_no_traceback(
        endpoint: metrics.Endpoint, request_bytes: bytes, status: bytes,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        try:
            reply = _ask(_port(endpoint), request_bytes)
        except ConnectionResetError:  # closed with the rest of a big request unread
            reply = b"HTTP/1.1 " + status
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
    assert endpoint.body.renders == 0  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    # and the endpoint serves on
    assert _ask(_port(endpoint), b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")


def test_a_client_that_sends_nothing_holds_the_endpoint_only_until_its_deadline(
        endpoint: metrics.Endpoint) -> None:
    """Given a client connected and silent, when a second one asks, then it is served
    once the first one's deadline passed (about a second), not after it gives up."""
    with socket.create_connection(("127.0.0.1", _port(endpoint))) as silent:
        time.sleep(0.1)  # accepted first
        started = time.monotonic()
        reply = _ask(_port(endpoint), b"GET /metrics HTTP/1.1\r\n\r\n")
        waited = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 200"), reply
        assert waited < metrics._READ_DEADLINE + 3.0, waited
        silent.settimeout(WAIT)
        assert silent.recv(100) == b""  # dropped at its deadline, with no reply
    assert endpoint.refused >= 1 and endpoint.served == 1


def test_a_client_that_never_reads_its_reply_is_dropped_at_the_write_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_WRITE_DEADLINE", 0.5)
    e = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(b"x" * (64 << 20)),
                         "test")
    e.start()
    try:
        with socket.create_connection(("127.0.0.1", _port(e))) as lazy:
            lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            lazy.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            deadline = time.monotonic() + WAIT
            while e.refused == 0:
                assert time.monotonic() < deadline, "the lazy reader was never dropped"
                time.sleep(0.05)
    finally:
        e.close()


def test_close_ends_the_thread_at_once_even_with_a_silent_client_connected() -> None:
    e = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(), "test")
    e.start()
    with socket.create_connection(("127.0.0.1", _port(e))):
        time.sleep(0.1)
        started = time.monotonic()
        e.close()
        assert time.monotonic() - started < 0.5
    assert e.listener.fileno() == -1


def test_a_client_half_way_through_its_request_at_a_handover_gets_its_reply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A handover closes the endpoint with ``finish``: the client already taken, its
    request still coming in, is answered, not reset (the successor takes the next)."""
    monkeypatch.setattr(metrics, "_READ_DEADLINE", WAIT)  # the machine's speed plays no part
    e = metrics.Endpoint(metrics.listener(Listen("127.0.0.1", 0)), _Body(b"up 1\n"), "test")
    e.start()
    with socket.create_connection(("127.0.0.1", _port(e)), timeout=WAIT) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\n")
        _wait_for(lambda: bool(e._clients), "the endpoint taking the client")
        closer = threading.Thread(target=e.close, kwargs={"finish": True})
        closer.start()
        _wait_for(e._closing.is_set, "the handover's close")
        client.sendall(b"Host: x\r\n")  # a head in pieces: read on after the close
        time.sleep(0.2)  # room for the piece to be read alone (the pass needs no timing)
        client.sendall(b"\r\n")
        reply = b""
        while chunk := client.recv(65536):
            reply += chunk
        closer.join(timeout=WAIT)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"up 1\n"), reply
    assert not closer.is_alive() and e.listener.fileno() == -1


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        time.sleep(0.01)


def test_many_connections_at_once_cost_one_thread(endpoint: metrics.Endpoint) -> None:
    before = threading.active_count()
    held = []
    with contextlib.ExitStack() as stack:
        for _ in range(50):
            with contextlib.suppress(OSError):  # the kernel's backlog may refuse some
                s = stack.enter_context(socket.socket())
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", _port(endpoint)))
                held.append(s)
        time.sleep(0.2)
        assert threading.active_count() == before


# -- opening it ---------------------------------------------------------------------


def test_a_port_taken_costs_only_the_metrics_with_one_line(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = Config(metrics_listen=f"127.0.0.1:{port}")
        with caplog.at_level(logging.ERROR, logger="geco"):
            e = metrics.open_endpoint(cfg, Listen("127.0.0.1", port), Snapshot,
                                      lambda: Health(0, 0, 0), "node1")
    assert e is None
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"cannot listen on 127.0.0.1:{port}" in record.getMessage()
    assert "serving without metrics" in record.getMessage()


def test_without_the_prometheus_library_gecod_serves_on_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # as on a node without python3-prometheus-client: importing the exposition fails
    import geco.usage

    for name in [n for n in sys.modules if n.split(".")[0] == "prometheus_client"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "geco.usage.exposition")
    monkeypatch.delattr(geco.usage, "exposition")
    inherited = metrics.listener(Listen("127.0.0.1", 0))
    cfg = Config(metrics_listen="127.0.0.1:9477")
    with caplog.at_level(logging.ERROR, logger="geco"):
        e = metrics.open_endpoint(cfg, Listen("127.0.0.1", 9477), Snapshot,
                                  lambda: Health(0, 0, 0), "node1", inherited)
    assert e is None and inherited.fileno() == -1
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "install python3-prometheus-client" in record.getMessage()


def test_a_socket_handed_over_is_used_when_it_is_the_configured_one() -> None:
    first = metrics.listener(Listen("127.0.0.1", 0))
    port = first.getsockname()[1]
    try:
        assert metrics.listener(Listen("127.0.0.1", port), first) is first
    finally:
        first.close()


def test_a_socket_handed_over_for_another_address_is_closed_and_a_new_one_bound() -> None:
    old = metrics.listener(Listen("127.0.0.1", 0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    new = metrics.listener(Listen("127.0.0.1", port), old)
    try:
        assert old.fileno() == -1 and new.getsockname() == ("127.0.0.1", port)
    finally:
        new.close()


# -- the shipped dashboard and rules ------------------------------------------------------

CONF = Path(__file__).resolve().parents[2] / "conf"


def _exported_names() -> set[str]:
    snap = Snapshot(1100.0, (JobFigures(HEADER, SAMPLE),),
                    NodeFigures(8, 6, 16 << 30, 15 << 30, 300 << 20, 1), rounds=5)
    return {name for name, _labels in _series(_renderer(snap).render())}


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"\bgecod?_[a-z_]+\b", text))


def test_the_dashboard_and_the_rules_name_only_series_gecod_exports() -> None:
    """Every geco_* and gecod_* name in conf/grafana-dashboard.json and
    conf/prometheus-rules.yml is one the endpoint exports (a rename would leave a
    panel or an alert silently empty)."""
    exported = _exported_names()
    dashboard = json.loads((CONF / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and _names_in(" ".join(exprs)) <= exported, _names_in(" ".join(exprs)) - exported
    rules = (CONF / "prometheus-rules.yml").read_text()
    assert _names_in(rules) - exported == set(), _names_in(rules) - exported
    # the dashboard asks for its Prometheus on import, and every panel uses it
    assert dashboard["templating"]["list"][0] == {
        **dashboard["templating"]["list"][0], "type": "datasource", "query": "prometheus"}
    assert {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p} \
        == {"${datasource}"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
