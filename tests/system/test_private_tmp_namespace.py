"""A job's private /tmp, /var/tmp and /dev/shm (geco.job.privatetmp, geco-mntns): made,
joined, bounded, and gone with the job, on this machine's kernel.

Processes join a job's namespace the way the exec() preload does, with setns on its pin
(``nsenter --mount=PIN``), as the test user or nobody; the /dev/shm writer runs in a
memory cgroup of the test's own, so the pages it charges, and their release, are the
kernel's own figures.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from geco.config import Config
from geco.errors import GecoError
from geco.job import privatetmp
from geco.jobkey import JobKey
from tests import privatetmpkit

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")]

NOBODY = 65534
M = 1 << 20
MEMORY_V1 = Path("/sys/fs/cgroup/memory")
WAIT = 60.0


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[Config]:
    with privatetmpkit.config(tmp_path) as made:
        yield made


def _in(where: privatetmp.Places, uid: int, gid: int, script: str,
        **kw: Any) -> subprocess.CompletedProcess[str]:
    """``script`` run by ``sh`` as uid:gid in the job's namespace."""
    return subprocess.run(["nsenter", f"--mount={where.pin}", f"--setuid={uid}",
                           f"--setgid={gid}", "--", "sh", "-c", script], capture_output=True,
                          text=True, timeout=WAIT, cwd="/", **kw)


def test_two_jobs_of_two_users_see_only_their_own_tmp_and_shm_and_leave_nothing(
        cfg: Config, job_owner: Any) -> None:
    """Given two jobs' namespaces, one of the test user and one of nobody, when each writes
    /tmp/x, /var/tmp/v and /dev/shm/y, then each reads back its own, neither sees the
    other's nor the node's /tmp holds them; the mounts are nosuid and nodev; after each
    job's removal its directories and pin are gone and what it held is counted."""
    a, b = JobKey(901, 1), JobKey(902, 1)
    mine = privatetmp.make(cfg, a, 64 * M, 0)
    theirs = privatetmp.make(cfg, b, 64 * M, 0)
    try:
        for where, (uid, gid), word in ((mine, (job_owner.uid, job_owner.gid), "mine"),
                                        (theirs, (NOBODY, NOBODY), "theirs")):
            done = _in(where, uid, gid, f"echo {word} > /tmp/x && echo {word} > /var/tmp/v "
                                        f"&& head -c 1048576 /dev/zero > /dev/shm/y && "
                                        f"cat /tmp/x /var/tmp/v && ls /dev/shm")
            assert done.returncode == 0, done.stderr
            assert done.stdout == f"{word}\n{word}\ny\n"
        assert (mine.tmp / "x").read_text() == "mine\n"
        assert (theirs.tmp / "x").read_text() == "theirs\n"
        assert not Path("/dev/shm/y").exists()
        options = _in(mine, job_owner.uid, job_owner.gid,
                      "grep -E ' /(tmp|var/tmp|dev/shm) ' /proc/self/mountinfo").stdout
        mounts = {line.split()[4]: line.split()[5] for line in options.splitlines()}
        for point in ("/tmp", "/var/tmp", "/dev/shm"):
            assert {"nosuid", "nodev"} <= set(mounts[point].split(",")), options
        # 50% of the 64M limit
        df = _in(mine, job_owner.uid, job_owner.gid, "df -B1 --output=size /dev/shm").stdout
        assert int(df.split()[-1]) == 32 * M, df

        freed = privatetmp.remove(cfg, a)
        assert freed.shm == M
        assert freed.tmp >= 8  # two small files, a block each
        assert not mine.job_dir.exists() and not os.path.lexists(mine.pin)
        assert (theirs.tmp / "x").read_text() == "theirs\n"  # the other job untouched
        assert privatetmp.remove(cfg, a) == privatetmp.Freed(0, 0)  # twice: nothing to do
    finally:
        privatetmp.remove(cfg, a)
        privatetmp.remove(cfg, b)
    assert not theirs.job_dir.exists()


def test_shm_past_its_cap_is_enospc_its_pages_are_the_jobs_and_come_back_at_its_end(
        cfg: Config, job_owner: Any) -> None:
    """Given a job's /dev/shm capped at 16M (50% of 32M), when a process of the job in a
    memory cgroup writes 12M there and then past the cap, then the write past the cap
    fails with ENOSPC, the cgroup is charged the 12M while the namespace lives, and once
    the job is removed the charge is released at once, though its last process still
    holds the namespace (the job's /dev/shm is emptied at its end)."""
    cgroup = MEMORY_V1 / f"geco-test-ptmp-{os.getpid()}"
    if not (MEMORY_V1 / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory hierarchy on this machine (the QEMU machine "
                    "covers v2)")
    cgroup.mkdir()
    key = JobKey(903, 1)
    try:
        where = privatetmp.make(cfg, key, 32 * M, 0)
        holder = subprocess.Popen(
            ["sh", "-c", f"echo $$ > {cgroup}/cgroup.procs && exec nsenter "
             f"--mount={where.pin} --setuid={job_owner.uid} --setgid={job_owner.gid} -- "
             "sh -c 'head -c 12582912 /dev/zero > /dev/shm/a && echo wrote && "
             "head -c 8388608 /dev/zero > /dev/shm/b; echo $? && exec cat'"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stderr is not None
        assert holder.stdout.readline() == "wrote\n"
        assert holder.stdout.readline() != "0\n"  # the second write failed
        charged = int((cgroup / "memory.usage_in_bytes").read_text())
        assert charged >= 12 * M, charged
        freed = privatetmp.remove(cfg, key)
        assert freed.shm == 16 * M  # full: 12M + the 4M of b that fit
        # the job's last process still holds the namespace: its /dev/shm is emptied all
        # the same (issue 48: a file held open kept the pages, charged to the ended job)
        assert int((cgroup / "memory.usage_in_bytes").read_text()) < 4 * M
        _, err = holder.communicate(timeout=WAIT)
        assert "No space left on device" in err, err
    finally:
        privatetmp.remove(cfg, key)
        cgroup.rmdir()


def test_a_job_holding_a_file_open_past_its_end_still_ends_clean(
        cfg: Config, job_owner: Any) -> None:
    """Given a process of the job with a file of its /tmp open, when the job is removed,
    then its directories are gone at once (nothing written outside the base), and the
    process still reads what it holds."""
    key = JobKey(904, 1)
    where = privatetmp.make(cfg, key, 64 * M, 0)
    reader = subprocess.Popen(
        ["nsenter", f"--mount={where.pin}", f"--setuid={job_owner.uid}",
         f"--setgid={job_owner.gid}", "--", "sh", "-c",
         "echo kept > /tmp/held && exec 3</tmp/held && echo open && read go && cat <&3"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        freed = privatetmp.remove(cfg, key)
        assert freed.tmp > 0
        assert not where.job_dir.exists() and not os.path.lexists(where.pin)
        out, _ = reader.communicate("go\n", timeout=WAIT)
        assert out == "kept\n"
    finally:
        reader.kill()
        reader.wait()
        privatetmp.remove(cfg, key)


def test_links_planted_in_a_jobs_tmp_or_as_the_base_make_root_touch_nothing_elsewhere(
        cfg: Config, tmp_path: Path, job_owner: Any) -> None:
    """Given a job that leaves a link to a file outside its /tmp and a directory link, when
    it is removed, the links go and their targets stay; given a base that is a link, or
    one a user owns, then no job gets a namespace there, in one error naming the base, and
    nothing is made in the link's target."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep\n")
    key = JobKey(905, 1)
    where = privatetmp.make(cfg, key, 64 * M, 0)
    try:
        done = _in(where, job_owner.uid, job_owner.gid,
                   f"ln -s {outside}/keep /tmp/file && ln -s {outside} /tmp/dir")
        assert done.returncode == 0, done.stderr
    finally:
        privatetmp.remove(cfg, key)
    assert (outside / "keep").read_text() == "keep\n"
    assert not where.job_dir.exists()

    for planted in ("link", "theirs"):
        base = tmp_path / f"base-{planted}"
        if planted == "link":
            base.symlink_to(outside)
        else:
            base.mkdir()
            os.chown(base, job_owner.uid, job_owner.gid)
        with pytest.raises(GecoError, match=f"base.*{base}") as info:
            privatetmp.make(cfg._replace(tmp_base=str(base)), key, 64 * M, 0)
        assert "\n" not in str(info.value)
        assert sorted(p.name for p in outside.iterdir()) == ["keep"]
        if planted == "theirs":
            assert list(base.iterdir()) == []


def test_the_helper_refuses_what_gecod_would_never_ask_in_one_line_each(
        cfg: Config, tmp_path: Path) -> None:
    """geco-mntns with a relative directory, a size that is no number, a pin that exists,
    run by nobody, or with no command: exit 1 (2 for usage) with one line, nothing
    mounted."""
    pins = cfg.state_dir / "mntns"
    pins.mkdir(parents=True)
    (pins / "taken").touch()
    helper = str(privatetmp.HELPER)
    for argv, uid, words in (
            ([helper, "make", f"{pins}/a", "tmp", "100"], 0, "must be absolute"),
            ([helper, "make", f"{pins}/a", str(tmp_path), "12x"], 0, "whole number"),
            ([helper, "make", f"{pins}/taken", str(tmp_path), "4096"], 0,
             "cannot make the pin"),
            ([helper, "make", f"{pins}/a", str(tmp_path), "4096"], NOBODY,
             "cannot make"),  # not root: the pin's directory cannot be made private
            ([helper, "-n", "proc/1/ns/mnt", "drop", f"{pins}/a"], 0, "absolute path"),
            ([helper], 0, "usage: geco-mntns")):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT, cwd="/",
                              user=uid)
        assert done.returncode == (2 if len(argv) == 1 else 1), done
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert words in done.stderr, done.stderr
    assert sorted(p.name for p in pins.iterdir()) == ["taken"]


# A gecod with a mount namespace of its own, as systemd gives gecod.service
# (ProtectSystem=; here also a /tmp of its own): it makes a job's namespace with
# `node_namespace`, the namespace sge_execd and sshd run in (here, this test's), and
# drops it again.
IN_UNIT = """
import sys
from pathlib import Path
from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey
cfg = Config(state_dir=Path(sys.argv[1]), tmp_node_namespace=sys.argv[2])
key = JobKey(906, 1)
if sys.argv[3] == "make":
    privatetmp.make(cfg, key, 64 << 20, 0)
else:
    print(privatetmp.remove(cfg, key).shm)
"""


def _in_unit(cfg: Config, node_ns: str, verb: str) -> subprocess.CompletedProcess[str]:
    """``IN_UNIT`` in a mount namespace of its own with a tmpfs on /tmp."""
    import sys

    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs unit-tmp /tmp && exec "$@"', "sh", sys.executable, "-c", IN_UNIT,
         str(cfg.state_dir), node_ns, verb],
        capture_output=True, text=True, timeout=WAIT, cwd=Path(__file__).parents[2])


@pytest.fixture
def unit_cfg(cfg: Config) -> Iterator[Config]:
    """``cfg`` with its state dir where a unit with a /tmp of its own sees it too."""
    import shutil
    import uuid

    state = Path(f"/var/lib/geco-test-privatetmp-{uuid.uuid4().hex[:8]}")
    try:
        yield cfg._replace(state_dir=state)
    finally:
        for pin in (state / "mntns").glob("*"):
            subprocess.run([str(privatetmp.HELPER), "drop", str(pin)], check=False,
                           capture_output=True)
        subprocess.run(["umount", "-l", str(state / "mntns")], check=False,
                       capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


def test_a_gecod_in_a_namespace_of_its_own_pins_jobs_where_the_node_joins_them(
        unit_cfg: Config, job_owner: Any) -> None:
    """Given gecod in a mount namespace of its unit's with a /tmp of its own, when it makes
    a job's namespace with [tmp] node_namespace naming the node's, then the node (this
    test, where sge_execd's shepherds and sshd are) joins it by its pin and finds the
    job's /tmp there, neither the node's nor gecod's; gecod's drop undoes it on the node.
    With node_namespace = "" the pin is gecod's alone: the node cannot join it."""
    cfg = unit_cfg
    node_ns = f"/proc/{os.getpid()}/ns/mnt"
    made = _in_unit(cfg, node_ns, "make")
    assert made.returncode == 0, made.stderr
    where = privatetmp.places(cfg, JobKey(906, 1))
    try:
        seen = _in(where, job_owner.uid, job_owner.gid,
                   "echo job > /tmp/mark && ls -A /tmp && grep -c ' /tmp ' /proc/self/mounts")
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == ["mark", "1"], seen.stdout
        assert (where.tmp / "mark").read_text() == "job\n"
    finally:
        dropped = _in_unit(cfg, node_ns, "drop")
    assert dropped.returncode == 0, dropped.stderr
    assert not os.path.lexists(where.pin) and not where.job_dir.exists()

    alone = _in_unit(cfg, "", "make")
    assert alone.returncode == 0, alone.stderr
    try:
        joined = _in(where, job_owner.uid, job_owner.gid, "true")
        assert joined.returncode != 0, "the node joined a namespace pinned in gecod's"
    finally:
        _in_unit(cfg, "", "drop")
        where.pin.unlink(missing_ok=True)


def test_a_base_with_less_free_than_min_free_gets_no_namespace_in_one_line(
        cfg: Config) -> None:
    """Given [tmp] min_free above what the base's file system has free, then a job gets no
    namespace, in one error naming the base and min_free, and nothing is made."""
    key = JobKey(907, 1)
    with pytest.raises(GecoError, match=r"has .* free, under \[tmp\] min_free \(1048576T\)") \
            as info:
        privatetmp.make(cfg._replace(tmp_min_free=1 << 60), key, 64 * M, 0)
    assert "\n" not in str(info.value)
    where = privatetmp.places(cfg, key)
    assert not os.path.lexists(where.pin) and not where.job_dir.exists()
    made = privatetmp.make(cfg._replace(tmp_min_free=1 << 20), key, 64 * M, 0)
    privatetmp.remove(cfg, key)
    assert made.tmp.parent == where.job_dir


def test_grid_engines_tmpdir_deeper_in_tmp_is_made_again_inside_as_the_node_has_it(
        cfg: Config, job_owner: Any) -> None:
    """Given a queue whose tmpdir is a directory in /tmp (sge_execd made the task's $TMPDIR
    in it, the owner's), then the job's private /tmp has the same path, each directory
    with the node's owner and mode; a path through a link, or one another user owns,
    gets nothing made."""
    import shutil
    import uuid

    queue_tmp = Path("/tmp", f"geco-test-qtmp-{uuid.uuid4().hex[:8]}")
    queue_tmp.mkdir(mode=0o755)
    queue_tmp.chmod(0o1777)
    task = queue_tmp / "908.1.all.q"
    task.mkdir(mode=0o700)
    os.chown(task, job_owner.uid, job_owner.gid)
    link = Path(f"{queue_tmp}-link")
    link.symlink_to(queue_tmp)
    key = JobKey(908, 1)
    where = privatetmp.make(cfg, key, 64 * M, 0)
    privatetmp.add_sge_tmpdir(cfg, key, task, job_owner.uid)
    try:
        privatetmp.add_sge_tmpdir(cfg, key, link / task.name, job_owner.uid)
        privatetmp.add_sge_tmpdir(cfg, key, task, NOBODY)
        made = where.tmp / queue_tmp.name
        assert sorted(p.name for p in where.tmp.iterdir()) == [queue_tmp.name]
        assert (made.stat().st_uid, made.stat().st_mode & 0o7777) == (0, 0o1777)
        inner = made / task.name
        assert (inner.stat().st_uid, inner.stat().st_mode & 0o7777) == (job_owner.uid, 0o700)
        seen = _in(where, job_owner.uid, job_owner.gid, f"touch {task}/t && ls {task}")
        assert seen.stdout.split() == ["t"], seen.stderr
    finally:
        privatetmp.remove(cfg, key)
        link.unlink()
        shutil.rmtree(queue_tmp)
