"""GPUs on the real Grid Engine: a job opens the GPUs it was granted and no other.

The test host books ``gpu=2`` (integration/sge/setup.sh: an INT consumable per slot, as
Son of Grid Engine sites count GPUs, so geco picks the ids). There is no GPU here: the
two GPUs are device nodes made with the NVIDIA driver's numbers, ``c 195:<minor>``, and
``[gpu] devices`` names them in id order with ids and minors crossed (id 0 is minor 1),
as the driver may number them. With no driver loaded, the kernel answers ``open()`` of
such a node with ENXIO when the job's cgroup allows it and EPERM when it denies it: the
kernel's verdict is the test's oracle. ``nvidiactl`` (195:255) stays open to every job.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration import livekit as kit

pytestmark = pytest.mark.sge
GECO = "/usr/bin/geco"

# the job's view: each device's open() verdict, /dev/null, and what it is told
PROBE = """/usr/bin/python3 - <<'EOF'
""" + kit.OPEN_VERDICT.replace("{", "{{").replace("}", "}}") + """import json, time
names = {names}
barrier = {barrier!r}
if barrier:  # both jobs of a pair hold their GPUs at the same time
    open(f"{{barrier}}.{{os.environ['JOB_ID']}}", "w").close()
    end = time.time() + 120
    while len([n for n in os.listdir(".") if n.startswith(barrier + ".")]) < 2 \\
            and time.time() < end:
        time.sleep(0.2)
print(json.dumps({{"devices": {{n: verdict(p) for n, p in names.items()}},
                  "null": verdict("/dev/null"),
                  "env": {{k: os.environ.get(k) for k in ("GECO_GPUS", "CUDA_VISIBLE_DEVICES",
                                                       "CUDA_DEVICE_ORDER")}}}}))
EOF
"""


@pytest.fixture
def gpu_node(job_dir: Any, gecod: Any) -> Any:
    """Two fake GPUs (id 0 = 195:1, id 1 = 195:0) and nvidiactl, named in [gpu] devices."""
    dev = job_dir.path / "dev"
    dev.mkdir(exist_ok=True)
    made = {"gpu0": 1, "gpu1": 0, "nvidiactl": 255}
    for name, minor in made.items():
        path = dev / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        path.chmod(0o666)
    with kit.site_settings({("gpu", "devices"): [str(dev / "gpu0"), str(dev / "gpu1")]},
                           gecod=gecod):
        yield {name: str(dev / name) for name in made}


def _run(sge: Any, job_dir: Any, name: str, devices: dict[str, str], *qsub: str,
         barrier: str = "") -> list[int]:
    return [job_dir.submit(name, *qsub, script=PROBE.format(names=devices, barrier=barrier))]


def _report(job_dir: Any, name: str, job: int) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(job_dir.output(name, job).splitlines()[-1])
    return report


def test_two_one_gpu_jobs_at_once_each_open_only_their_own_gpu(
        sge: Any, job_dir: Any, gpu_node: dict[str, str], journal: Any) -> None:
    """Given a node with two GPUs, when two jobs asking -l gpu=1 run at the same time, then
    each opens one GPU (ENXIO: allowed, no driver) and gets EPERM on the other, they hold
    different GPUs, each is told GECO_GPUS (its node id), CUDA_VISIBLE_DEVICES=0 and
    CUDA_DEVICE_ORDER=PCI_BUS_ID, their job-contained records name the GPUs, nvidiactl and
    /dev/null stay open, and both end as Grid Engine ends them."""
    jobs = [_run(sge, job_dir, "gpu1", gpu_node, "-l", "gpu=1", barrier="pair")[0]
            for _ in range(2)]
    records = [sge.wait_finished(job, timeout=180) for job in jobs]
    reports = [_report(job_dir, "gpu1", job) for job in jobs]
    contained = [journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-contained")[0]
                 for job in jobs]

    assert all((r["exit_status"], r["failed"]) == ("0", "0") for [r] in records)
    held = sorted(r["env"]["GECO_GPUS"] for r in reports)
    assert held == ["0", "1"]
    for report, record in zip(reports, contained, strict=True):
        mine = f"gpu{report['env']['GECO_GPUS']}"
        other = "gpu1" if mine == "gpu0" else "gpu0"
        assert report["devices"] == {mine: "ENXIO", other: "EPERM", "nvidiactl": "ENXIO"}
        assert report["null"] == "open"
        assert report["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert report["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert record["GPUS"] == report["env"]["GECO_GPUS"]
        assert f"GPUs {report['env']['GECO_GPUS']}" in record["MESSAGE"]


def test_a_job_without_a_gpu_request_opens_no_gpu_and_the_restriction_ends_with_the_job(
        sge: Any, job_dir: Any, gpu_node: dict[str, str], journal: Any) -> None:
    """Given a node with two GPUs, when a job requests none, then it gets EPERM on both
    (nvidiactl and /dev/null stay open) and is told CUDA_VISIBLE_DEVICES="" and GECO_GPUS="";
    its cgroups are gone when it ends, and a job then granted both GPUs opens both."""
    [none] = _run(sge, job_dir, "nogpu", gpu_node)
    [record] = sge.wait_finished(none, timeout=120)
    report = _report(job_dir, "nogpu", none)
    assert (record["exit_status"], record["failed"]) == ("0", "0")
    assert report["devices"] == {"gpu0": "EPERM", "gpu1": "EPERM", "nvidiactl": "ENXIO"}
    assert report["null"] == "open"
    assert report["env"] == {"GECO_GPUS": "", "CUDA_VISIBLE_DEVICES": "",
                             "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert kit.job_cgroups(f"{none}.1") == {}

    [both] = _run(sge, job_dir, "twogpu", gpu_node, "-l", "gpu=2")
    sge.wait_finished(both, timeout=120)
    report = _report(job_dir, "twogpu", both)
    assert report["devices"] == {"gpu0": "ENXIO", "gpu1": "ENXIO", "nvidiactl": "ENXIO"}
    assert report["env"]["GECO_GPUS"] == "0,1"
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    [contained] = journal.wait_for(10, JOB_ID=str(both), GECO_EVENT="job-contained")
    assert contained["GPUS"] == "0,1"


def test_the_ids_go_into_the_jobs_resource_file_and_geco_status(
        sge: Any, job_dir: Any, gpu_node: dict[str, str]) -> None:
    """Given a one-GPU job, while it runs its resource file's record for this node lists
    the id geco picked beside Grid Engine's count (the seed's GPU list), geco rsrcinfo
    shows it on this node's line, and geco status --job says it."""
    script = PROBE.format(names=gpu_node, barrier="") + "sleep 30\n"
    job = job_dir.submit("rsrc", "-l", "gpu=1", script=script)
    path = Path(f"/var/lib/geco/resources/{job}.1")
    try:
        kit.wait_until(lambda: _report_or_none(job_dir, job) is not None, 120,
                       "the job's report")
        text = path.read_text()
        shown = subprocess.run([GECO, "rsrcinfo", "-u", str(path)], capture_output=True,
                               text=True, check=True).stdout
        status = json.loads(subprocess.run([GECO, "status", "--job", str(job), "--json"],
                                           capture_output=True, text=True, check=True).stdout)
    finally:
        subprocess.run(["qdel", "-f", str(job)], capture_output=True, check=False)
        sge.wait_finished(job, timeout=60, accounting=False)
    picked = _report_or_none(job_dir, job)["env"]["GECO_GPUS"]
    assert picked in ("0", "1")
    assert f",s{len('count:1=') + len(picked)}:count:1={picked},s0:}}" in text
    assert f"gpus count:1={picked}" in shown, shown
    assert [j["gpus"] for j in status["jobs"]] == [picked], status


def _report_or_none(job_dir: Any, job: int) -> Any:
    try:
        return _report(job_dir, "rsrc", job)
    except (OSError, ValueError, IndexError):
        return None


def test_the_oom_and_job_end_records_name_the_jobs_gpus(
        sge: Any, job_dir: Any, gpu_node: dict[str, str], journal: Any) -> None:
    """Given a one-GPU job with m_mem_free=100M that touches 300M, then its oom record and
    its job-end record name the GPU it held, the one its job-contained record named."""
    job = job_dir.submit("gpuoom", "-l", "gpu=1,m_mem_free=100M", probe="--alloc 300")
    sge.wait_finished(job, timeout=120)
    [contained] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-contained")
    [oom] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="oom")
    [end] = journal.wait_for(10, JOB_ID=str(job), GECO_EVENT="job-end")
    assert contained["GPUS"] in ("0", "1")
    assert oom["GPUS"] == end["GPUS"] == contained["GPUS"]
    assert f"GPUs {contained['GPUS']}" in end["MESSAGE"]
