"""seff's figures and the advice lines from a job task's samples (geco.usage.efficiency)."""

from __future__ import annotations

from pathlib import Path

from geco.usage.efficiency import render, render_whole, report, whole
from geco.usage.samples import Header, Sample, Series

G, M = 1 << 30, 1 << 20


def _series(cores: int, memory: int, *, wall: float, cpu: float, peak: int,
            oom_kills: int = 0, steps: int = 10) -> Series:
    """A job that used ``cpu`` seconds evenly over ``wall`` and reached ``peak`` halfway."""
    header = Header(7, 1, owner="alice", job_name="burn", host="node1", cores=cores,
                    memory=memory, started=1000.0)
    out = []
    for i in range(1, steps + 1):
        t = 1000.0 + wall * i / steps
        now = peak if i >= steps // 2 else peak // 4
        out.append(Sample(t, cpu_user_usec=int(cpu * 1e6 * i / steps), cpu_system_usec=0,
                          memory_current=now, memory_peak=now, tasks=2,
                          oom_kills=oom_kills if i == steps else 0))
    return Series(header, tuple(out))


def test_one_of_two_cores_and_300m_of_1g_is_half_cpu_and_under_a_third_of_memory() -> None:
    """As seff defines them: CPU time / (cores x wall), peak / requested; and the advice
    both ways: fewer cores, less memory."""
    r = report(_series(2, G, wall=600, cpu=600, peak=300 * M), running=False)
    assert (r.cores, r.wall, r.cpu_seconds, r.cpu_efficiency) == (2, 600.0, 600.0, 50.0)
    assert (r.memory_requested, r.memory_peak, r.memory_efficiency) == (G, 300 * M, 29.3)
    assert r.memory_peak_at == 1300.0  # the first sample at the peak
    assert r.advice == ("you asked 2 cores and used 1.0 on average: request 1",
                        "peak 300M of 1G: request 360M")


def test_far_off_requests_get_advice_both_ways() -> None:
    few = report(_series(8, 8 * G, wall=3600, cpu=1.1 * 3600, peak=2 * G), running=False)
    assert few.advice == ("you asked 8 cores and used 1.1 on average: request 2",
                          "peak 2G of 8G: request 2.4G")
    tight = report(_series(1, 8 * G, wall=3600, cpu=3600, peak=int(7.9 * G)), running=False)
    assert tight.advice == ("peak 7.9G of 8G: request more headroom (9.48G)",)


def test_a_job_that_used_what_it_asked_gets_no_advice() -> None:
    fits = report(_series(2, G, wall=600, cpu=2 * 600 * 0.97, peak=700 * M), running=False)
    assert fits.advice == ()
    noise = report(_series(2, G, wall=600, cpu=1.03 * 600, peak=700 * M), running=False)
    assert noise.advice == ("you asked 2 cores and used 1.0 on average: request 1",)


def test_an_oom_kill_says_so_and_a_short_job_gets_no_other_advice() -> None:
    r = report(_series(4, G, wall=5, cpu=1, peak=G, oom_kills=1), running=False)
    assert r.oom_kills == 1
    assert r.advice == ("the kernel's OOM killer ended 1 process(es) of the job: request "
                        "more than 1G of memory",)


def test_the_text_names_the_job_and_its_figures_and_json_has_them_all() -> None:
    r = report(_series(2, G, wall=600, cpu=600, peak=300 * M), running=True)
    text = render(r)
    assert text.splitlines()[0] == "job 7.1 (burn) of alice on node1: running, 0:10:00 wall time"
    assert "CPU efficiency 50.0%" in text and "memory efficiency 29.3%" in text
    assert "peak 300M at 0:05:00" in text
    assert all(len(line) <= 100 for line in text.splitlines())
    doc = r.as_json()
    assert doc["cpu_efficiency"] == 50.0 and doc["running"] is True
    assert doc["advice"] == list(r.advice) and len(doc["advice"]) == 2


def test_a_node_that_counts_no_cpu_time_reports_none_not_zero() -> None:
    s = _series(1, G, wall=600, cpu=1, peak=G // 2)
    blind = Series(s.header, tuple(x._replace(cpu_user_usec=-1) for x in s.samples))
    r = report(blind, running=False)
    assert (r.cpu_seconds, r.cpu_efficiency) == (None, None)
    assert "CPU time not counted" in render(r)


def test_the_readmes_example_is_what_geco_usage_prints() -> None:
    """README, "Did my job use what it asked for?": its example block, printed for the job
    it describes."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = readme.split("```text\njob 42.1 (burn)", 1)[1].split("```", 1)[0]
    s = _series(8, 8 * G, wall=3600, cpu=3960, peak=2 * G)
    r = report(Series(s.header._replace(job_id=42, host="node7"), s.samples), running=False)
    assert render(r) == "job 42.1 (burn)" + shown


def test_a_job_over_three_hosts_is_seffs_figures_over_the_sums_with_each_hosts_advice(
        ) -> None:
    """CPU time over the sum of cores x wall time, the peaks over the requests; advice
    named by host; one host's whole is its own report."""
    busy = report(_series(2, G, wall=600, cpu=1200, peak=950 * M), running=False)
    idle = report(_series(2, G, wall=600, cpu=0, peak=100 * M), running=False)
    idle = idle._replace(host="node2")
    w = whole([busy, idle, idle._replace(host="node3")])
    assert (w.hosts, w.cpu_efficiency, w.memory_efficiency) == (3, 33.3, 37.4)
    assert w.advice == ("node1: peak 950M of 1G: request more headroom (1.11G)",
                        "node2: you asked 2 cores and used 0.0 on average: request 1",
                        "node2: peak 100M of 1G: request 120M",
                        "node3: you asked 2 cores and used 0.0 on average: request 1",
                        "node3: peak 100M of 1G: request 120M")
    assert render_whole("7.1", w) == ("job 7.1 on its 3 hosts: CPU efficiency 33.3%, "
                                      "memory efficiency 37.4%\n")
    alone = whole([busy])
    assert (alone.hosts, alone.cpu_efficiency, alone.advice) == (1, 100.0, busy.advice)
