"""A job's usage samples file (geco.usage.samples): bounded, whole, and safe from its owner.

Real files in a temporary directory; the owner checks need root (files are root's).
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from geco import jobfiles
from geco.errors import GecoError
from geco.jobkey import JobKey
from geco.usage import samples
from geco.usage.samples import Header, Sample

KEY = JobKey(42, 1)
HEADER = Header(42, 1, owner="nobody", job_name="burn", host="node1", cores=2,
                memory=1 << 30, started=1000.0)
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the files are root's")


def _usage_dir(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path / "usage"


def _sample(t: float) -> Sample:
    return Sample(t, cpu_user_usec=int(t * 1e6), cpu_system_usec=0, memory_current=100,
                  memory_peak=200, tasks=3, oom_kills=0)


@root_only
def test_samples_come_back_as_written_under_their_header(tmp_path: Path) -> None:
    d = _usage_dir(tmp_path)
    for t in (1000.0, 1030.0, 1060.0):
        samples.append(d, HEADER, _sample(t), max_samples=100)
    series = samples.read(d, KEY)
    assert series is not None
    assert series.header == HEADER
    assert series.samples == tuple(_sample(t) for t in (1000.0, 1030.0, 1060.0))
    # what the kernel does not count stays -1
    assert series.samples[0].memory_pressure_usec == -1


@root_only
def test_a_full_file_keeps_every_other_sample_and_the_last_never_more_than_the_bound(
        tmp_path: Path) -> None:
    """Given max_samples 8, when 100 samples come, then the file never holds more than 8
    records, the last sample written is always the last kept, and the span still starts
    near the job's start."""
    d = _usage_dir(tmp_path)
    for i in range(100):
        samples.append(d, HEADER, _sample(1000.0 + i), max_samples=8)
        series = samples.read(d, KEY)
        assert series is not None and len(series.samples) <= 8
        assert series.samples[-1].time == 1000.0 + i
    size = jobfiles.samples(d, KEY).stat().st_size
    assert size <= len(samples.MAGIC) + 200 + 8 * samples.RECORD.size
    assert series.samples[0].time == 1000.0  # the job's start is never thinned away


@root_only
def test_a_record_cut_short_by_a_crash_is_dropped(tmp_path: Path) -> None:
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    with jobfiles.samples(d, KEY).open("ab") as f:
        f.write(b"\x01\x02\x03")
    series = samples.read(d, KEY)
    assert series is not None and series.samples == (_sample(1000.0),)
    samples.append(d, HEADER, _sample(1001.0), max_samples=10)
    series = samples.read(d, KEY)
    assert series is not None and [s.time for s in series.samples] == [1000.0, 1001.0]


@root_only
def test_the_file_is_roots_and_readable_by_no_one_else_without_a_private_group(
        tmp_path: Path) -> None:
    """nobody's primary group (nogroup) is not theirs alone: the file is root's only."""
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    st = jobfiles.samples(d, KEY).stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600)
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


@root_only
def test_a_symlinked_directory_or_a_planted_fifo_is_refused_and_nothing_written_elsewhere(
        tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "usage"
    link.symlink_to(target)
    with pytest.raises(GecoError, match="symbolic link"):
        samples.append(link, HEADER, _sample(1000.0), max_samples=10)
    assert list(target.iterdir()) == []
    link.unlink()
    d = _usage_dir(tmp_path)
    d.mkdir()
    os.mkfifo(jobfiles.samples(d, KEY))
    started = time.monotonic()
    with pytest.raises(GecoError, match="not a regular file"):
        samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    assert time.monotonic() - started < 10  # refused, not hung on the FIFO


@root_only
def test_a_lock_its_owner_holds_on_the_file_stalls_no_writer_and_no_reader(
        tmp_path: Path) -> None:
    """Given the job's file locked exclusively by a reader that never lets go (its owner
    may open it, and flock grants LOCK_EX on a read-only descriptor), when the sampler
    appends (wait 0) and root reads the file, then both are done at once: root's writers
    lock a file of their own that no user can open (root's, 0600)."""
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    with jobfiles.samples(d, KEY).open("rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_EX)
        started = time.monotonic()
        samples.append(d, HEADER, _sample(1001.0), max_samples=2)  # a thinning, too
        series = samples.read(d, KEY)
        took = time.monotonic() - started
    assert series is not None and [s.time for s in series.samples] == [1000.0, 1001.0]
    print(f"append and read with the owner's lock held: {took * 1000:.1f} ms")
    lock = os.stat(d / ".lock")
    assert (lock.st_uid, stat.S_IMODE(lock.st_mode)) == (0, 0o600)


@root_only
def test_a_writer_waits_for_another_within_its_bound_and_says_so(tmp_path: Path) -> None:
    """Given another writer holding the writers' lock, when the sampler appends (wait 0),
    then it fails at once with one line naming the lock, and appends again once free."""
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    with open(d / ".lock", "rb") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(GecoError, match="usage samples' writers is busy"):
            samples.append(d, HEADER, _sample(1001.0), max_samples=10)
        assert samples.read(d, KEY) is not None  # readers never wait for writers
    samples.append(d, HEADER, _sample(1002.0), max_samples=10)
    series = samples.read(d, KEY)
    assert series is not None and [s.time for s in series.samples] == [1000.0, 1002.0]


@root_only
def test_readers_never_see_a_half_thinned_file(tmp_path: Path) -> None:
    """A writer thinning the file over and over, a reader reading all the while: every read
    is a whole file (its times increase, one header)."""
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(0.0), max_samples=4)
    done = threading.Event()

    def write() -> None:
        for i in range(1, 400):
            samples.append(d, HEADER, _sample(float(i)), max_samples=4, wait=5.0)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    while not done.is_set() or reads == 0:
        series = samples.read(d, KEY)
        assert series is not None and series.header == HEADER
        times = [s.time for s in series.samples]
        assert times == sorted(set(times)) and 1 <= len(times) <= 4, times
        reads += 1
    writer.join()


def test_no_file_is_no_samples_and_a_foreign_file_one_clear_error(tmp_path: Path) -> None:
    assert samples.read(tmp_path, KEY) is None
    (tmp_path / str(KEY)).write_bytes(b"not ours\n")
    with pytest.raises(GecoError, match="is not a geco usage file"):
        samples.read(tmp_path, KEY)


@root_only
def test_an_earlier_job_of_the_same_number_leaves_its_samples_to_no_one(
        tmp_path: Path) -> None:
    """Grid Engine reuses job numbers: a file last written before this job started is an
    earlier job's, and this job's first sample starts it afresh under its own header."""
    d = _usage_dir(tmp_path)
    samples.append(d, HEADER, _sample(1000.0), max_samples=10)
    os.utime(jobfiles.samples(d, KEY), (5000.0, 5000.0))
    later = HEADER._replace(owner="root", job_name="next", started=9000.0)
    samples.append(d, later, _sample(9001.0), max_samples=10)
    series = samples.read(d, KEY)
    assert series is not None and series.header == later
    assert [s.time for s in series.samples] == [9001.0]


@root_only
def test_another_hosts_samples_travel_bounded_and_are_kept_beside_this_hosts(
        tmp_path: Path) -> None:
    """Given a slave host's file of 1,000 samples, when it is exported for its master, then
    at most GATHERED samples go (the first and the last among them); the master keeps them
    as <job>.<task>@<host>, and the job reads back as this host's samples then that host's;
    the reaper's name check takes both names and no other."""
    d = _usage_dir(tmp_path)
    for i in range(1000):
        samples.append(d, HEADER, _sample(1000.0 + i), max_samples=2000)
    mine = samples.read(d, KEY)
    assert mine is not None
    sent = samples.load(samples.export(mine, samples.GATHERED), "node2's samples")
    assert len(sent.samples) == samples.GATHERED
    assert (sent.samples[0], sent.samples[-1]) == (mine.samples[0], mine.samples[-1])
    assert [s.time for s in sent.samples] == sorted(s.time for s in sent.samples)

    other = tmp_path / "master"
    other.mkdir()
    (other / "usage").mkdir()
    samples.append(other / "usage", HEADER, _sample(999.0), max_samples=10)
    samples.keep_copy(other / "usage", samples.Series(sent.header._replace(host="node2"),
                                                      sent.samples))
    assert sorted(n for n in os.listdir(other / "usage") if samples.is_file_name(n)) == \
        ["42.1", "42.1@node2"]
    got = samples.read_job(other / "usage", KEY)
    assert [s.header.host for s in got] == ["node1", "node2"]
    assert got[1].samples == sent.samples
    assert [n for n in ("42.1", "42.1@node2", "42.1@", "42.1@../x", "x@node2", "42.1@a b")
            if samples.is_file_name(n)] == ["42.1", "42.1@node2"]


@root_only
def test_a_copy_under_a_header_naming_no_host_is_refused_and_nothing_written(
        tmp_path: Path) -> None:
    d = _usage_dir(tmp_path)
    d.mkdir()
    for host in ("../etc", "", "a/b"):
        with pytest.raises(GecoError, match="not a host name"):
            samples.keep_copy(d, samples.Series(HEADER._replace(host=host), (_sample(1.0),)))
    assert os.listdir(d) == []
    with pytest.raises(GecoError, match="not a geco usage file"):
        samples.load(b"GECO_NOT\n", "node2's samples")
