"""`geco rsrcinfo`: the documented contract scripts and admins depend on.

Runs the real command line (``python -m geco.cli``) on recorded qstat outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from geco.resourceset import NodeResources, ResourceSet
from geco.sge import v1format

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "qstat"
JSON_KEYS = ["job_id", "task_id", "job_name", "owner", "group", "cwd", "runtime_limit",
             "is_standby", "per_slot_vmem", "trace_level", "is_array", "phi_for_user", "nodes"]
NODE_KEYS = ["name", "is_slave", "slots", "memory_limit", "vmem_limit", "gpus", "phis"]


def geco(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "geco.cli", *args], input=stdin,
                          capture_output=True, cwd=REPO, timeout=60)


def test_json_from_saved_xml_and_placement_has_the_documented_keys_and_units() -> None:
    """Given the recorded `-pe smp 2 -l h_vmem=500M,m_mem_free=1G,h_rt=120 -t 1-2` job,
    then json shows task 2 with bytes and seconds, per node."""
    out = geco("rsrcinfo", "--xml", str(FIXTURES / "combined.xml"),
               "--placement", str(FIXTURES / "combined.qstat-gt-all.xml"), "--task", "2",
               "--format", "json")
    assert out.returncode == 0 and out.stderr == b""
    doc = json.loads(out.stdout)
    assert list(doc) == JSON_KEYS and list(doc["nodes"][0]) == NODE_KEYS
    assert (doc["job_id"], doc["task_id"], doc["is_array"], doc["runtime_limit"]) == (
        9, 2, True, 120.0)
    assert doc["per_slot_vmem"] == 500 << 20
    assert doc["nodes"] == [{"name": "vm", "is_slave": False, "slots": 2,
                             "memory_limit": 2 << 30, "vmem_limit": 1000 << 20,
                             "gpus": "", "phis": ""}]


def test_xml_from_stdin_with_a_pe_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text("vm 2 all.q@vm UNDEFINED\n")
    out = geco("rsrcinfo", "--xml", "-", "--pe-hostfile", str(hostfile), "--format", "json",
               stdin=(FIXTURES / "pe_smp.xml").read_bytes())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["nodes"][0]["slots"] == 2


def test_serialize_then_unserialize_round_trips(tmp_path: Path) -> None:
    saved = tmp_path / "7.1"
    first = geco("rsrcinfo", "--xml", str(FIXTURES / "pe_smp.xml"),
                 "--placement", str(FIXTURES / "pe_smp.qstat-gt-all.xml"), "-s", str(saved),
                 "--format", "v1")
    assert first.returncode == 0, first.stderr
    assert saved.read_bytes() + b"\n" == first.stdout
    assert saved.read_bytes().startswith(b"GECOResourceSet_v1{li7,li1,")
    again = geco("rsrcinfo", "-u", str(saved), "--format", "v1")
    assert again.stdout == first.stdout


def test_shell_output_evaluates_to_the_same_hostile_values(tmp_path: Path) -> None:
    """Given a job name with quotes, $(...), newlines and spaces, when the shell format is
    eval'd by bash, then the variables hold exactly those values and nothing ran."""
    name = "x'; touch pwned; echo '$(id)\n`id` \"a b\""
    rs = ResourceSet(5, 1, job_name=name, owner="bob", group="g", cwd="/tmp/a b",
                     nodes=(NodeResources("n1", slots=3, memory_limit=100),
                            NodeResources("n 2", is_slave=True, slots=1, gpus="0,1")))
    saved = tmp_path / "5.1"
    saved.write_bytes(v1format.serialize(rs))
    shell = geco("rsrcinfo", "-u", str(saved), "--format", "shell").stdout.decode()
    script = shell + ('printf "%s\\0" "$SGE_RESOURCE_JOB_NAME" "${SGE_RESOURCE_HOSTS[1]}" '
                      '"${SGE_RESOURCE_NSLOTS[0]}" "${SGE_RESOURCE_GPU[1]}" '
                      '"$SGE_RESOURCE_JOB_CWD"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, cwd=tmp_path, timeout=30)
    assert out.stdout.split(b"\0")[:-1] == [name.encode(), b"n 2", b"3", b"0,1", b"/tmp/a b"]
    assert not (tmp_path / "pwned").exists()


def test_text_output_is_readable() -> None:
    out = geco("rsrcinfo", "--xml", str(FIXTURES / "h_vmem.xml"),
               "--placement", str(FIXTURES / "h_vmem.qstat-gt-all.xml"))
    assert out.returncode == 0
    assert out.stdout.decode().splitlines()[-1] == (
        "  master vm: 1 slot(s), memory none, memory+swap 500M")


@pytest.mark.parametrize(("args", "message"), [
    (["rsrcinfo", "-j", "4x"],
     "geco rsrcinfo: argument -j/--job: JOB[.TASK] must be numbers like 42 or 42.3, got '4x'"),
    (["rsrcinfo", "-u", "/nonexistent/1.1"],
     "geco rsrcinfo: cannot read /nonexistent/1.1: No such file or directory"),
    (["rsrcinfo", "-u", "/dev/null"],
     "geco rsrcinfo: expected 'GECOResourceSet_v1' at byte 0, got end of input "
     "(offset=0 expected='GECOResourceSet_v1' path=/dev/null)"),
    (["rsrcinfo", "--xml", "tests/fixtures/qstat/unknown_job.xml", "--pe-hostfile", "/dev/null"],
     "geco rsrcinfo: Grid Engine does not know job 1 (finished, deleted or never submitted)"),
    (["rsrcinfo", "-u", "x", "--placement", "y"],
     "geco rsrcinfo: --placement and --pe-hostfile go with --xml"),
    (["rsrcinfo"], "geco rsrcinfo: one of the arguments -j/--job --xml -u/--unserialize "
                   "is required"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    out = geco(*args)
    assert out.returncode == 2
    assert out.stdout == b""
    assert out.stderr.decode() == message + "\n"
