"""gecod's Prometheus endpoint in a real gecod: a job's series while it runs, a handover
that never closes the port, and the start-up cases (a bad address, a port taken).

Real gecods from :mod:`tests.gecodkit` (real cgroup v1, journald) sampling every 0.2 s;
the job's shepherd is a process named sge_shepherd that gecod contains, so its exit ends
the job through gecod's own teardown. The endpoint is asked with plain HTTP, as
Prometheus asks it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.gecodkit import (
    MARKS,
    REPO,
    Node,
    alive,
    new_job,
    start_gecod,
    status,
    stop_by_pid,
    wait_gone,
    with_unit_capabilities,
)
from tests.gecodkit import _clean_jobs as _clean_jobs  # after each test, on this module's node
from tests.gecodkit import node as node  # this module's node
from tests.sshkit import free_port

pytestmark = [*MARKS, pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import prometheus_client"],
                   capture_output=True, check=False).returncode != 0,
    reason="python3-prometheus-client is not installed (scripts/install.sh --test)")]

WAIT = 60.0


def _sections(port: int) -> str:
    return f'[usage]\ninterval = 0.2\n[metrics]\nlisten = "127.0.0.1:{port}"\n'


def _until(condition: Any, what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)
    return found


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def _answers(port: int) -> bool:
    try:
        return bool(_scrape(port))
    except OSError:
        return False


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@dataclass
class Scrapers:
    """A client scraping without pause, each reply's gecod start time kept."""

    port: int
    starts: set[float] = field(default_factory=set)
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Scrapers:
        self._thread = threading.Thread(target=self._scrape, daemon=True)
        self._thread.start()
        return self

    def _scrape(self) -> None:
        while not self._stop.is_set():
            try:
                text = _scrape(self.port)
            except OSError as exc:
                self.failures.append(str(exc))
                continue
            started = _value(text, "gecod_start_time_seconds")
            if started is not None:
                self.starts.add(started)
            self.answered += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def test_a_contained_job_is_in_the_scrape_with_its_labels_and_gone_after_its_end(
        node: Node) -> None:
    """Given gecod with [metrics] listen set, when a job's shepherd is contained, then a
    scrape shows its series labelled with its job, task, owner, queue and node and its
    memory limit as granted; after the shepherd exits, the next scrapes show none."""
    port = free_port()
    g = start_gecod(node, "metrics", sections=_sections(port))
    job = new_job()
    try:
        _until(lambda: _answers(port), "the metrics endpoint")
        node.make_job(job, slots=2, owner="nobody")
        shepherd = node.job_process(job, sock=g.sock, named_shepherd=True)
        assert shepherd.answer() == "OK"
        line = _until(lambda: next((x for x in _scrape(port).splitlines()
                                    if x.startswith("geco_job_memory_limit_bytes{")
                                    and f'job_id="{job}"' in x), None),
                      f"job {job} in the scrape")
        host = socket.gethostname().split(".")[0]
        for label in (f'job_id="{job}"', 'task_id="1"', 'owner="nobody"', f'node="{host}"'):
            assert label in line, line
        assert float(line.rsplit(" ", 1)[1]) == 256 << 20
        text = _scrape(port)
        assert _value(text, "gecod_requests_total") is not None
        assert _value(text, "geco_node_jobs") == 1
        shepherd.exit()
        wait_gone(node, f"{job}.1")
        _until(lambda: f'job_id="{job}"' not in _scrape(port), f"job {job} gone from the scrape")
        assert _value(_scrape(port), "geco_node_jobs") == 0
    finally:
        assert g.stop() == 0, g.output()
    assert "Traceback" not in g.output()


def test_the_endpoint_answers_all_through_a_handover(node: Node) -> None:
    """Given gecod serving metrics and a client scraping without pause, when root runs
    `geco handover`, then the new gecod (another start time) answers on the same port,
    the old one exits 0, and no scrape failed."""
    port = free_port()
    g = start_gecod(node, "metrics-handover", sections=_sections(port))
    # gecod's own socket answers before it has bound the metrics' port: wait for that
    _until(lambda: _answers(port), "the metrics endpoint")
    scrapers = Scrapers(port).start()
    new_pid = 0
    try:
        _until(lambda: scrapers.answered > 10, "scrapes before the handover")
        done = subprocess.run(
            [sys.executable, "-m", "geco.cli", "handover"], cwd="/", capture_output=True,
            text=True, timeout=WAIT * 2,
            env={"PYTHONPATH": str(REPO), "GECO_CONFIG": str(node.base / "metrics-handover.toml"),
                 "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        assert done.returncode == 0, (done.stderr, g.output())
        assert g.proc.wait(timeout=WAIT) == 0, g.output()
        new_pid = status(node, g.sock)["pid"]
        assert new_pid != g.pid and alive(new_pid)
        _until(lambda: len(scrapers.starts) == 2, "a scrape answered by the new gecod")
        before = scrapers.answered
        _until(lambda: scrapers.answered > before + 10, "scrapes after the handover")
        scrapers.stop()
        assert scrapers.failures == [], scrapers.failures[:5]
    finally:
        scrapers.stop()
        if new_pid:
            stop_by_pid(new_pid)
        g.stop()
    # the port is free again once both are gone: nothing kept it open
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_gecod_with_only_its_unit_s_capabilities_serves_the_metrics(node: Node) -> None:
    """conf/gecod.service's CapabilityBoundingSet is enough for the endpoint (a port above
    1023: the unit has no CAP_NET_BIND_SERVICE)."""
    port = free_port()
    g = start_gecod(node, "metrics-caps", prefix=with_unit_capabilities(),
                    sections=_sections(port))
    try:
        text = _until(lambda: _answers(port) and _scrape(port), "the metrics endpoint")
        assert _value(text, "gecod_start_time_seconds") is not None
    finally:
        assert g.stop() == 0, g.output()


def test_a_port_taken_costs_gecod_only_its_metrics(node: Node) -> None:
    """Given [metrics] listen on a port another process listens on, gecod starts and
    serves, and says in one line that it serves without metrics."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        g = start_gecod(node, "metrics-taken", sections=_sections(port))
        try:
            assert status(node, g.sock)["pid"] == g.pid
            log = g.output_with("serving without metrics")
            [line] = [x for x in log.splitlines() if "serving without metrics" in x]
            assert f"cannot listen on 127.0.0.1:{port}" in line, line
        finally:
            assert g.stop() == 0, g.output()


def test_a_listen_address_that_is_none_stops_gecod_at_start_with_one_line(
        node: Node, tmp_path: Path) -> None:
    config = node.write_config("metrics-bad", sections='[metrics]\nlisten = "localhost:9477"\n')
    done = subprocess.run([sys.executable, "-m", "geco.daemon", "--config", str(config)],
                          cwd="/", capture_output=True, text=True, timeout=WAIT,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.returncode == 1
    assert done.stderr.startswith("gecod: [metrics] listen = 'localhost:9477' does not name "
                                  "an IP address"), done.stderr
    assert done.stderr.count("\n") == 1
    assert not os.path.exists(node.socket_path("metrics-bad"))
