"""A job's mount namespace as root meets it: what the job's owner made there stays the
owner's (libgeco/geco_mntns.c, mntns/geco_mntns.c from this checkout, not the package).

- Entering: the exec() preload joins a job's namespace in sge_execd's child, as root,
  before the shepherd; its working directory, execd's spool of the task, stays the
  node's directory even where its path lies in /tmp, which is the owner's private /tmp
  inside: root never reads a ``config`` the owner planted at the same path.
- Dropping: a file of the job's /dev/shm that another process of the owner holds open
  (through ``/proc/<pid>/root``) keeps no pages past the job's end: ``drop`` empties the
  tmpfs before it lets it go, and still reports what it held.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")]

REPO = Path(__file__).resolve().parents[2]
M = 1 << 20
NOBODY = 65534
WAIT = 60.0
BASE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# geco_join_mntns() as the preload calls it, then what root reads: ./config (its working
# directory's) and the same file by its path (the namespace's view).
JOIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include "geco_mntns.h"

static void show(const char *what, const char *path)
{
    char text[64] = "";
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        printf("%s: %s\n", what, strerror(errno));
        return;
    }
    if (fgets(text, sizeof text, f) == NULL)
        text[0] = '\0';
    fclose(f);
    text[strcspn(text, "\n")] = '\0';
    printf("%s: %s\n", what, text);
}

int main(int argc, char **argv)
{
    char path[PATH_MAX], abs[PATH_MAX + 8];
    const char *step = "";
    int rc;

    if (argc != 5)
        return 2;
    rc = geco_join_mntns(argv[1], strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         path, sizeof path, &step);
    printf("rc: %d\n", rc);
    if (rc < 0)
        printf("step: %s: %s\n", step, strerror(errno));
    show("cwd config", "config");
    snprintf(abs, sizeof abs, "%s/config", argv[4]);
    show("path config", abs);
    return 0;
}
"""

# Another process of the owner, outside the job: holds a file of the job's /dev/shm open
# and tells its size and blocks while the job lives and once it is dropped.
HOLDER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
st = os.fstat(fd)
print("open", st.st_size, st.st_blocks, flush=True)
sys.stdin.readline()
st = os.fstat(fd)
print("dropped", st.st_size, st.st_blocks, flush=True)
"""


class Tools(NamedTuple):
    helper: Path  # this checkout's geco-mntns
    join: Path  # JOIN built against this checkout's libgeco/geco_mntns.c


@pytest.fixture(scope="module")
def tools() -> Iterator[Tools]:
    """geco-mntns (the Makefile's) and the join program, built from this checkout."""
    root = Path(tempfile.mkdtemp(prefix="geco-test-mntns-"))
    try:
        done = subprocess.run(["make", "-C", str(REPO), f"BUILD={root}/c", "mntns"],
                              capture_output=True, text=True, env=BASE_ENV, check=False)
        if done.returncode != 0:
            pytest.fail(f"make mntns failed:\n{done.stdout}{done.stderr}")
        (root / "join.c").write_text(JOIN)
        argv = ["cc", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{REPO}/libgeco", "-o",
                str(root / "join"), str(root / "join.c"), str(REPO / "libgeco/geco_mntns.c")]
        done = subprocess.run(argv, capture_output=True, text=True, env=BASE_ENV,
                              check=False)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed:\n{done.stderr}")
        yield Tools(root / "c" / "geco_mntns", root / "join")
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Job(NamedTuple):
    pins: Path
    pin: Path
    tmp: Path  # the job's private /tmp, as the node sees it


@pytest.fixture
def job(tools: Tools, tmp_path: Path) -> Iterator[Job]:
    """Job 909.1's namespace (a 64M /dev/shm), made as gecod makes it, dropped after."""
    tmp_path.chmod(0o755)
    pins = tmp_path / "mntns"
    pins.mkdir(mode=0o711)
    tmp = tmp_path / "909.1" / "tmp"
    tmp.mkdir(parents=True)
    tmp.chmod(0o1777)
    pin = pins / "909.1"
    try:
        made = _helper(tools, "make", str(pin), str(tmp), str(64 * M))
        assert made.returncode == 0, made.stderr
        yield Job(pins, pin, tmp)
    finally:
        if os.path.lexists(pin):
            _helper(tools, "drop", str(pin))
        subprocess.run(["umount", "-l", str(pins)], check=False, capture_output=True)


def _helper(tools: Tools, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools.helper), *args], capture_output=True, text=True,
                          timeout=WAIT, cwd="/", env=BASE_ENV, check=False)


def _as_owner_inside(job: Job, owner: Any, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` by ``sh`` as the job's owner in its namespace (as the preload joins)."""
    return subprocess.run(["nsenter", f"--mount={job.pin}", f"--setuid={owner.uid}",
                           f"--setgid={owner.gid}", "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=WAIT, cwd="/",
                          env=BASE_ENV, check=False)


def test_stall_root_joining_a_job_stays_in_the_nodes_spool_not_the_owners_planted_copy(
        tools: Tools, job: Job, job_owner: Any, figures: list[str]) -> None:
    """Given execd's spool at a path in the node's /tmp holding config "real", and the
    job's owner having made the same path in the job's private /tmp with config
    "planted", when root in that spool directory joins the job's namespace with
    geco_join_mntns(), then it is joined (1) and ./config is still the node's "real",
    while the path names the owner's copy in there; a task with no pin is 0, untouched."""
    spool = Path(tempfile.mkdtemp(prefix="geco-test-spool-", dir="/tmp"))
    try:
        (spool / "config").write_text("real\n")
        planted = _as_owner_inside(job, job_owner,
                                   f"mkdir -p {spool} && echo planted > {spool}/config")
        assert planted.returncode == 0, planted.stderr
        copy = job.tmp / spool.name / "config"
        assert copy.read_text() == "planted\n"
        assert (copy.stat().st_uid, copy.parent.stat().st_uid) == (job_owner.uid,) * 2

        # as root, and as sge_execd's child (real uid root, effective its admin user's)
        spool.chmod(0o755)
        for who in ([], ["setpriv", f"--euid={NOBODY}", "--"]):
            joined = subprocess.run([*who, str(tools.join), str(job.pins), "909", "1",
                                     str(spool)], capture_output=True, text=True,
                                    timeout=WAIT, cwd=spool, env=BASE_ENV, check=False)
            figures.append(f"{'euid nobody' if who else 'root'} joining job 909.1 from "
                           f"{spool}: " + "; ".join(joined.stdout.splitlines()))
            assert joined.returncode == 0, joined.stderr
            assert joined.stdout == ("rc: 1\ncwd config: real\n"
                                     "path config: planted\n"), (who, joined.stdout)

        # no pin for task 2: nothing joined, the working directory as it was
        none = subprocess.run([str(tools.join), str(job.pins), "909", "2", str(spool)],
                              capture_output=True, text=True, timeout=WAIT, cwd=spool,
                              env=BASE_ENV, check=False)
        assert none.stdout == "rc: 0\ncwd config: real\npath config: real\n", none.stdout
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def test_stall_a_jobs_shm_file_held_open_by_another_of_its_owners_processes_is_freed_at_drop(
        tools: Tools, job: Job, job_owner: Any, tmp_path: Path, figures: list[str]) -> None:
    """Given 8M written to the job's /dev/shm by its owner, and another process of the
    owner outside the job holding that file open through /proc/<pid>/root, when the job
    ends (its process gone) and its namespace is dropped, then drop reports the 8M and
    the held file has no size and no blocks left: the pages are freed, not kept past the
    job by a lazily unmounted tmpfs; a link the job left is removed, never followed."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 4096)
    writer = subprocess.Popen(
        ["nsenter", f"--mount={job.pin}", f"--setuid={job_owner.uid}",
         f"--setgid={job_owner.gid}", "--", "sh", "-c",
         f"mkdir /dev/shm/d && head -c {8 * M} /dev/zero > /dev/shm/d/big && "
         f"ln -s {victim} /dev/shm/link && echo written && exec cat"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/", env=BASE_ENV)
    holder: subprocess.Popen[str] | None = None
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "written\n"
        holder = subprocess.Popen(
            ["/usr/bin/python3", "-c", HOLDER, f"/proc/{writer.pid}/root/dev/shm/d/big"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd="/", env=BASE_ENV, user=job_owner.uid, group=job_owner.gid)
        assert holder.stdout is not None and holder.stdin is not None
        opened = holder.stdout.readline()
        assert opened == f"open {8 * M} {8 * M // 512}\n", (opened, holder.stderr)

        writer.communicate("", timeout=WAIT)  # the job's last process ends
        dropped = _helper(tools, "drop", str(job.pin))
        holder.stdin.write("\n")
        holder.stdin.flush()
        after = holder.stdout.readline()
        figures.append(f"job 909.1's /dev/shm held open past its end: drop said "
                       f"{dropped.stdout.strip()!r}; the holder's fstat: {after.strip()} "
                       f"(size, 512-byte blocks; {opened.strip()} before)")
        assert dropped.returncode == 0, dropped.stderr
        assert dropped.stdout == f"shm_used {8 * M}\n", dropped.stdout
        assert after == "dropped 0 0\n", after
        assert not os.path.lexists(job.pin)
        assert victim.stat().st_size == 4096
    finally:
        writer.kill()
        writer.wait()
        if holder is not None:
            holder.kill()
            holder.communicate()
