"""A node as a fixture tree, for what `geco check` reads: ``proc/<pid>/{comm,status}``
(tests/unit/test_doors.py, test_package_login_node.py)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["process"]


def process(proc: Path, pid: int, comm: str, uid: int) -> None:
    """A process ``pid`` named ``comm`` of ``uid`` under the fixture ``proc``."""
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_bytes(comm.encode() + b"\n")
    (d / "status").write_bytes(f"Name:\t{comm}\nState:\tS (sleeping)\nPPid:\t1\n"
                               f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n".encode())
