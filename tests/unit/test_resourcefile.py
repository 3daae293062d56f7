"""Resource files: atomic, readable back, corrupt ones reported with their path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from geco.errors import GecoError, ResourceFormatError
from geco.jobkey import JobKey
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import resourcefile, v1format

RS = ResourceSet(42, 3, job_name="a,b{c}:\nd", owner="alice", group="users", cwd="/home/alice",
                 nodes=(NodeResources("n001", slots=4, memory_limit=1 << 30),))


def test_a_written_file_reads_back_equal_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = resourcefile.write(tmp_path / "resources", RS)
    assert path == tmp_path / "resources" / "42.3"
    assert resourcefile.read(tmp_path / "resources", JobKey(42, 3)) == RS
    assert os.listdir(tmp_path / "resources") == ["42.3"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_no_file_is_none_and_remove_says_so(tmp_path: Path) -> None:
    assert resourcefile.read(tmp_path, JobKey(1, 1)) is None
    assert resourcefile.remove(tmp_path, JobKey(1, 1)) is False
    resourcefile.write(tmp_path, RS)
    assert resourcefile.remove(tmp_path, JobKey(42, 3)) is True
    assert not (tmp_path / "42.3").exists()


def test_a_truncated_file_is_a_format_error_naming_the_file(tmp_path: Path) -> None:
    """Given a file cut short (a disk that filled under an older writer), then reading it
    raises ResourceFormatError with the byte offset and the path."""
    (tmp_path / "42.3").write_bytes(v1format.serialize(RS)[:30])
    with pytest.raises(ResourceFormatError) as info:
        resourcefile.read(tmp_path, JobKey(42, 3))
    assert info.value.offset == 28  # where the cut-off walltime field starts
    assert str(info.value).endswith(f"path={tmp_path / '42.3'})")


def test_an_unwritable_place_is_an_error_and_nothing_is_left(tmp_path: Path) -> None:
    """Given a state dir that cannot exist (its parent is a file), then write raises a
    GecoError naming the path and errno."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GecoError) as info:
        resourcefile.write(blocker / "resources", RS)
    assert str(info.value).startswith("cannot write the resource file: ")
    assert "errno=ENOTDIR" in str(info.value)
    assert os.listdir(tmp_path) == ["file"]
