"""A user's clone has nothing beside it: no file of the project reaches outside the checkout.

Scripts, tests and documents that read the developers' notes directory beside the
repository, or an absolute path of one developer's machine, work there and break, or
quietly skip, everywhere else.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the notes' directory beside the checkout, its variable, a developer's work tree (spelt
# in pieces, so that this file does not name them itself)
NOTES = b"sha" + b"red"
OUTSIDE = re.compile(rb"\.\./" + NOTES + rb"\b|\bGECO_" + NOTES.upper() + rb"\b|/wo" + rb"rk/("
                     + NOTES + rb"|main)\b")


def project_files() -> list[Path]:
    """What git tracks plus what it would add (untracked, not ignored)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    return [REPO / name.decode() for name in out.split(b"\0") if name]


def test_no_file_of_the_project_refers_to_a_path_outside_the_checkout() -> None:
    files = [path for path in project_files() if path.is_file()]
    assert len(files) > 100  # the listing itself worked
    found = [f"{path.relative_to(REPO)}:{number}"
             for path in files
             for number, line in enumerate(path.read_bytes().splitlines(), 1)
             if OUTSIDE.search(line)]
    assert found == []
