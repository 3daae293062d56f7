"""Each hook imports only what it needs: Grid Engine starts it for every job (twice, with
the starter three times), and a hook's start-up is mostly imports (bench/bench_hooks.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "sge_hooks" / "geco-hook"

# What a hook must not load on its common path, and why each costs it: the standard
# library's logging (geco.log writes a hook's lines itself), dataclasses (with inspect),
# the qstat XML parser, process inspection, argument parsing, subprocesses.
HEAVY = ("logging", "dataclasses", "inspect", "lxml", "psutil", "argparse", "subprocess",
         "socket", "tempfile", "geco.node.topology", "geco.sge.qstat", "nacl")

IMPORTED = """
import sys
import geco.hooks.{hook}
print(" ".join(sorted(m for m in sys.modules if m in {heavy!r} or m.startswith("lxml"))))
"""


@pytest.mark.parametrize("hook", ["prolog", "epilog", "starter"])
def test_a_hook_imports_none_of_the_heavy_modules(hook: str) -> None:
    """Given the hook's module started as the queue starts it (python -I -S), then none
    of the heavy modules was imported by it."""
    # -s -P and an environment of its own isolate it as -I would, which ignores PYTHONPATH
    out = subprocess.run([sys.executable, "-S", "-s", "-P", "-c",
                          IMPORTED.format(hook=hook, heavy=HEAVY)], env={"PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == []


def test_the_installed_hooks_run_isolated_without_site_and_know_their_name(
        tmp_path: Path) -> None:
    """Given the hook script, then its interpreter line asks for -I -S, and run under
    a name that is no hook it says so and exits 1 (never a traceback)."""
    first = SHIM.read_text().splitlines()[0]
    assert first.startswith("#!") and first.split()[1:] == ["-IS"]
    for name in ("geco-prolog", "geco-epilog", "geco-starter", "geco-pam"):
        assert (REPO / "sge_hooks" / name).resolve() == SHIM.resolve()
    odd = tmp_path / "postlog"
    odd.symlink_to(SHIM)
    out = subprocess.run([sys.executable, "-I", "-S", str(odd)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == ("geco-hook: run it as one of geco-prolog, geco-epilog, "
                                  "geco-starter, geco-pam, prolog, epilog, starter (a link or "
                                  "copy named so), not as 'postlog'")
