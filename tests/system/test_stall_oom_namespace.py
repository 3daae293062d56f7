"""The OOM report's writer enters the job's mount namespace (its private /tmp), or writes
nothing: never a file another user planted at the same path in the node's /tmp.

:func:`geco.oom.append_to_owner_file` with a :class:`geco.oom.JobNamespace`, on this
machine's kernel: a job's namespace made and pinned by ``geco-mntns`` (as gecod makes
it), the job owner's stderr file in the job's /tmp, and a file of nobody's, writable by
all, at the same path in the node's /tmp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco import oom
from geco.config import Config
from geco.errors import GecoError
from geco.job import privatetmp
from geco.jobkey import JobKey
from tests import privatetmpkit

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")]

NOBODY = 65534
M = 1 << 20
KEY = JobKey(931, 1)


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[Config]:
    with privatetmpkit.config(tmp_path) as made:
        yield made


@pytest.fixture
def planted() -> Iterator[Path]:
    """/tmp/<name> in the node's /tmp: nobody's, empty, mode 0666."""
    with privatetmpkit.planted("oom-ns", NOBODY, NOBODY) as path:
        yield path


def _owners_file(where: privatetmp.Places, name: str, owner: Any) -> Path:
    """The job's stderr file in its /tmp, the owner's, with one line in it."""
    path = where.tmp / name
    path.write_text("earlier output\n")
    os.chown(path, owner.uid, owner.gid)
    return path


def test_the_report_goes_to_the_jobs_own_tmp_file_not_the_nodes(
        cfg: Config, planted: Path, job_owner: Any) -> None:
    """Given a job's namespace whose /tmp/<name> is its owner's stderr file and another
    user's /tmp/<name> in the node's, when the report is appended with the job's namespace,
    then the job's file has it and the node's stays empty."""
    where = privatetmp.make(cfg, KEY, 64 * M, 0)
    own = _owners_file(where, planted.name, job_owner)
    written = oom.append_to_owner_file(planted, "geco: x\n", job_owner.uid, job_owner.gid,
                                       namespace=privatetmp.namespace(cfg, KEY))
    assert written == planted  # the path as the job names it
    assert own.read_text() == "earlier output\ngeco: x\n"
    assert planted.read_text() == ""


def test_a_namespace_gone_since_it_was_seen_gets_nothing_written(
        cfg: Config, planted: Path, job_owner: Any) -> None:
    """Given the job's namespace seen when the job was looked up, when the job has ended
    (pin dropped) before the report is written, then nothing is written anywhere and the
    error says why."""
    privatetmp.make(cfg, KEY, 64 * M, 0)
    namespace = privatetmp.namespace(cfg, KEY)
    assert namespace.pinned
    privatetmp.remove(cfg, KEY)
    with pytest.raises(GecoError, match="private /tmp is gone"):
        oom.append_to_owner_file(planted, "geco: x\n", job_owner.uid, job_owner.gid,
                                 namespace=namespace)
    assert planted.read_text() == ""


def test_a_pin_that_cannot_be_entered_gets_nothing_written(
        cfg: Config, planted: Path, job_owner: Any) -> None:
    """Given a pin that is no namespace (a plain file: a pin gecod's own namespace sees
    without its mount), then nothing is written and the error names the pin."""
    pin = privatetmp.places(cfg, KEY).pin
    pin.parent.mkdir(parents=True)
    pin.write_text("")
    with pytest.raises(GecoError, match=r"cannot enter the job's .* mount namespace") as got:
        oom.append_to_owner_file(planted, "geco: x\n", job_owner.uid, job_owner.gid,
                                 namespace=privatetmp.namespace(cfg, KEY))
    assert got.value.fields["pin"] == pin
    assert planted.read_text() == ""


def test_a_job_without_a_namespace_is_written_as_before(
        cfg: Config, job_owner: Any) -> None:
    """Given a job that never had a namespace (private /tmp off), then its file at the
    node's path gets the report, as without one."""
    directory = job_owner.make_dir("oom-ns")
    try:
        path = directory / "job.e931"
        path.write_text("earlier output\n")
        os.chown(path, job_owner.uid, job_owner.gid)
        namespace = privatetmp.namespace(cfg, KEY)
        assert not namespace.pinned
        assert oom.append_to_owner_file(path, "geco: x\n", job_owner.uid, job_owner.gid,
                                        namespace=namespace) == path
        assert path.read_text() == "earlier output\ngeco: x\n"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# gecod under systemd: a mount namespace of its unit's with a /tmp of its own, in which
# the pins it makes in the node's (node_namespace) are plain files. It makes the job's
# namespace, plants /tmp/<name> in its own /tmp too, appends the report with the node's
# namespace named (argv[2]) and then with none, and prints what became of each.
IN_UNIT = """
import os, sys
from pathlib import Path
from geco import oom
from geco.config import Config
from geco.errors import GecoError
from geco.job import privatetmp
from geco.jobkey import JobKey
state, node_ns, name, uid, gid = sys.argv[1:6]
cfg = Config(state_dir=Path(state), tmp_node_namespace=node_ns)
key = JobKey(932, 1)
where = privatetmp.make(cfg, key, 64 << 20, 0)
own = where.tmp / name
own.write_text("")
os.chown(own, int(uid), int(gid))
mine = Path("/tmp", name)
mine.write_text("")
mine.chmod(0o666)
for ns in (node_ns, ""):
    try:
        oom.append_to_owner_file(mine, "geco: x\\n", int(uid), int(gid),
                                 namespace=privatetmp.namespace(cfg._replace(
                                     tmp_node_namespace=ns), key))
        print("written")
    except GecoError as exc:
        print("refused", exc.msg)
print(repr(own.read_text()), repr(mine.read_text()))
privatetmp.remove(cfg, key)
"""


def test_a_gecod_in_a_namespace_of_its_own_enters_the_nodes_to_find_the_job(
        planted: Path, job_owner: Any) -> None:
    """Given gecod in a mount namespace of its unit's with a /tmp of its own (the job's
    pin there a plain file), when it appends with [tmp] node_namespace naming the node's,
    then the job's /tmp file has the report; with node_namespace = "" nothing is
    written, neither in gecod's /tmp nor in the node's."""
    import sys

    state = Path(f"/var/lib/geco-test-oomns-{uuid.uuid4().hex[:8]}")
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs unit-tmp /tmp && exec "$@"', "sh", sys.executable, "-c",
             IN_UNIT, str(state), f"/proc/{os.getpid()}/ns/mnt", planted.name,
             str(job_owner.uid), str(job_owner.gid)],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    finally:
        subprocess.run(["umount", "-l", str(state / "mntns")], check=False,
                       capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    written, refused, files = done.stdout.splitlines()
    assert written == "written"
    assert refused.startswith("refused ") and "cannot enter the job's" in refused, refused
    assert files == "'geco: x\\n' ''"
    assert planted.read_text() == ""
