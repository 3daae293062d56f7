"""gecod's Prometheus endpoint scraped by a real Prometheus while a real Grid Engine job runs.

The site's gecod with ``[metrics] listen`` on a free loopback port and a sampler round
every second; Debian's Prometheus (``/usr/bin/prometheus``, started here on another free
loopback port, scraping every second, with the package's copy of
``conf/prometheus-rules.yml`` loaded) asked
through its HTTP API: the job's series carry its labels and figures while it runs, the
shipped rules evaluate, every query of the shipped Grafana dashboard is valid PromQL,
and the job's series are gone once it has ended.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from geco.resourceset import short_hostname
from tests.integration.livekit import no_queue_in_error, site_settings
from tests.sshkit import free_port

pytestmark = pytest.mark.sge

# as the package installs them (conf/prometheus-rules.yml, conf/grafana-dashboard.json)
RULES = Path("/usr/share/geco/prometheus/geco-rules.yml")
DASHBOARD = Path("/usr/share/geco/grafana/geco-dashboard.json")
PROMETHEUS, PROMTOOL = Path("/usr/bin/prometheus"), Path("/usr/bin/promtool")
WAIT = 180.0  # seconds for anything a job or a scrape does, on a machine as busy as it gets
T = TypeVar("T")
# Touch 200M, then keep one core busy for 15 s of CPU (the job asks for two and 512M).
BURN = ("exec /usr/bin/python3 -c 'import time\n"
        "held = bytearray(200 << 20)\n"
        "for i in range(0, len(held), 4096): held[i] = 1\n"
        "while time.process_time() < 15: pass'\n")


def _until(probe: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """What ``probe`` returns once it is not None (or falsy), asked until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.2)


class Prometheus:
    """A Prometheus server of this test's, on a loopback port: its HTTP API."""

    def __init__(self, base: Path, target: str) -> None:
        self.port = free_port()
        self.log = base / "prometheus.log"
        config = base / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "geco",
                                "static_configs": [{"targets": [target]}]}]}))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={config}",
                 f"--storage.tsdb.path={base / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 # a series gone from the scrape is gone from queries at once (staleness
                 # markers); 5 s covers a scrape missed on a busy machine meanwhile
                 "--query.lookback-delta=5s", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=base,
                start_new_session=True)

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                doc = json.loads(reply.read())
        except urllib.error.HTTPError as exc:  # Prometheus refused the query: say why
            raise AssertionError(f"{params}: {exc.read().decode(errors='replace')}") from None
        except OSError:
            assert self.proc.poll() is None, f"Prometheus exited: {self.log.read_text()}"
            return None
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of ``promql`` now ([] while Prometheus is not up yet)."""
        data = self.get("/api/v1/query", query=promql)
        return [] if data is None else list(data["result"])

    def one(self, promql: str) -> tuple[dict[str, str], float] | None:
        """The labels and value of the one series ``promql`` gives, None while none."""
        found = self.query(promql)
        assert len(found) <= 1, found
        return (found[0]["metric"], float(found[0]["value"][1])) if found else None

    def ready(self) -> bool:
        """Whether Prometheus serves queries: it answers 503 while its database opens."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=10):
                return True
        except urllib.error.HTTPError as exc:
            assert exc.code == 503, f"/-/ready: {exc.code} {exc.read().decode(errors='replace')}"
        except OSError:
            assert self.proc.poll() is None, f"Prometheus exited: {self.log.read_text()}"
        return False

    def stop(self) -> None:
        self.proc.terminate()  # SIGTERM to its pid: Prometheus closes its database
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def prometheus(base: Path, target: str) -> Iterator[Prometheus]:
    server = Prometheus(base, target)
    try:
        _until(server.ready, "Prometheus ready")
        yield server
    finally:
        server.stop()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(reply.read().decode())


def _dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every query of the shipped dashboard, its variables
    ($node, $owner) set to all."""
    doc = json.loads(DASHBOARD.read_text())
    assert doc["templating"]["list"][0]["type"] == "datasource"
    return [(panel["title"], target["expr"].replace("$node", ".*").replace("$owner", ".*"))
            for panel in doc["panels"] for target in panel.get("targets", [])]


def test_the_shipped_rules_are_valid_prometheus_rules() -> None:
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout), done.stdout


def test_prometheus_sees_a_running_job_with_its_labels_and_figures_and_not_after_it_ended(
        sge: Any, gecod: Any, job_dir: Any, job_owner: Any, tmp_path: Path) -> None:
    """Given gecod's endpoint scraped every second by a real Prometheus, when a job
    granted 2 cores and 512M burns one core and holds 200M, then PromQL finds its series
    labelled with its job, task, owner, queue and node, its limit and cores as granted,
    its CPU seconds rising and its memory above 200M; the shipped recording rules give
    its cores used; and once the job has ended its series are in no scrape and no query."""
    port = free_port()
    tmp_path.chmod(0o755)
    with site_settings({("metrics", "listen"): f"127.0.0.1:{port}",
                        ("usage", "interval"): 1.0}, gecod), \
            prometheus(tmp_path, f"127.0.0.1:{port}") as prom:
        _until(lambda: prom.one('up{job="geco"} == 1'), "Prometheus scraping gecod")
        job = job_dir.submit("metrics", "-pe", "smp", "2", "-l", "m_mem_free=256M",
                             script=BURN)
        labels = {"job_id": str(job), "task_id": "1", "owner": job_owner.name,
                  "queue": sge.queue, "node": short_hostname()}
        selector = f'{{job_id="{job}",task_id="1"}}'

        limit = _until(lambda: prom.one(f"geco_job_memory_limit_bytes{selector}"),
                       f"job {job}'s series in Prometheus")
        assert {k: limit[0].get(k) for k in labels} == labels, limit
        assert "job_name" not in limit[0] and limit[0]["job"] == "geco"
        assert limit[1] == 512 << 20
        cores = prom.one(f"geco_job_cores{selector}")
        assert cores is not None and cores[1] == 2
        memory = _until(lambda: prom.one(f"geco_job_memory_bytes{selector} >= {200 << 20}"),
                        f"job {job} holding 200M")
        assert memory[1] <= 512 << 20
        user = f'geco_job_cpu_seconds_total{{job_id="{job}",task_id="1",mode="user"}}'
        first = _until(lambda: prom.one(f"{user} > 0"), f"job {job}'s CPU seconds")
        _until(lambda: prom.one(f"{user} > {first[1]}"), f"job {job}'s CPU seconds rising")
        ratio = _until(lambda: prom.one(f"geco_job_cpu_efficiency_ratio{selector} > 0"),
                       f"job {job}'s CPU efficiency")
        assert ratio[1] <= 1.5, ratio
        # the shipped rules: evaluated without error, the job's cores used recorded
        used = _until(lambda: prom.one(f"geco:job_cores_used:rate5m{selector} > 0"),
                      f"the recording rule of job {job}'s cores used")
        assert used[1] <= 2.5, used
        assert prom.one(f'geco:owner_cores:sum{{owner="{job_owner.name}"}}') is not None
        groups = prom.get("/api/v1/rules")["groups"]
        assert {r["health"] for g in groups for r in g["rules"]} == {"ok"}, groups
        # the node and gecod itself
        node = {"node": short_hostname()}
        cores_free = prom.one(f'geco_node_cores_free{{node="{node["node"]}"}}')
        node_cores = prom.one(f'geco_node_cores{{node="{node["node"]}"}}')
        assert cores_free is not None and node_cores is not None
        assert 0 <= cores_free[1] <= node_cores[1] - 2
        assert _until(lambda: prom.one("gecod_requests_total > 0"), "gecod's requests")
        # the shipped dashboard: every query valid, the job in its per-job panels
        answers = {title: prom.query(expr) for title, expr in _dashboard_queries()}
        assert len(answers) >= 15
        shown = answers["CPU efficiency since the job started (seff)"]
        assert [r["metric"]["job_id"] for r in shown] == [str(job)], shown

        [record] = sge.wait_finished(job, timeout=WAIT)
        assert (record["exit_status"], record["failed"]) == ("0", "0"), record
        _until(lambda: f'job_id="{job}"' not in _scrape(port),
               f"job {job}'s series gone from gecod's endpoint")
        _until(lambda: not prom.query(f'{{__name__=~"geco_job_.+",job_id="{job}"}}'),
               f"job {job}'s series gone from Prometheus' queries")
    assert no_queue_in_error(sge) == {}
