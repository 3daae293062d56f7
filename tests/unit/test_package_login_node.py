"""Login nodes: the same package and PAM lines rolled out everywhere must not lock users out
where no job can run. `geco check` calls geco's gate an open door on a host that runs no
sge_execd (and has no execd spool directory of its own): there it would refuse every user
but root and the admins. On an execution host the gate is judged as before
(tests/unit/test_ssh_pamstack.py).

The node is a fixture tree: ``proc/<pid>/{comm,status}``, an ``etc`` with sshd's PAM
stack (the README's, or Debian's plain one), and an execd spool directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from geco.config import Config
from geco.reports import doors
from geco.resourceset import short_hostname
from tests.nodekit import process
from tests.sshkit import GECO_PAM_STACK, PLAIN_PAM_STACK


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    paths = {"proc": tmp_path / "proc", "etc": tmp_path / "etc", "linger": tmp_path / "linger",
             "systemd": tmp_path / "run-systemd-system"}
    for name in ("proc", "linger"):
        paths[name].mkdir()
    (paths["etc"] / "pam.d").mkdir(parents=True)
    return paths


def sshd_door(node: dict[str, Path], stack: str, spool: Path) -> tuple[bool, str]:
    (node["etc"] / "pam.d" / "sshd").write_text(stack)
    [door] = [d for d in doors.doors(Config(execd_spool_dir=spool), **node) if d.name == "sshd"]
    return door.open, door.text


def test_on_a_host_without_sge_execd_geco_gate_is_an_open_door(
        node: dict[str, Path], tmp_path: Path) -> None:
    """Given the README's stack on a host with no sge_execd and no execd spool of its own,
    then the sshd door is open and says why and what to do."""
    spool = tmp_path / "spool"
    is_open, text = sshd_door(node, GECO_PAM_STACK, spool)
    assert is_open
    assert text == (f"sshd: pam_geco.so gates logins, but this host runs no sge_execd (and has "
                    f"no {spool / short_hostname()}): no job can run here, so it refuses every "
                    "user but root and the admins; take geco's PAM lines out on login nodes")


def test_on_a_host_without_sge_execd_no_gate_is_as_it_should_be(
        node: dict[str, Path], tmp_path: Path) -> None:
    """Given Debian's plain stack on such a host, then the sshd door is closed."""
    is_open, text = sshd_door(node, PLAIN_PAM_STACK, tmp_path / "spool")
    assert not is_open
    assert text.startswith("sshd: geco's gate is off, as it should be where this host runs no "
                           "sge_execd"), text


@pytest.mark.parametrize("how", ["sge_execd runs", "its spool directory exists"])
def test_on_an_execution_host_the_gate_is_judged_as_ever(
        node: dict[str, Path], tmp_path: Path, how: str) -> None:
    """Given an execution host (sge_execd runs, or it is down but its spool directory for
    this host is there), then the README's stack is a closed door and the plain one open."""
    spool = tmp_path / "spool"
    if how == "sge_execd runs":
        process(node["proc"], 4242, "sge_execd", 0)
    else:
        (spool / short_hostname()).mkdir(parents=True)
    assert sshd_door(node, GECO_PAM_STACK, spool) == (
        False, "sshd: pam_geco.so gates logins (account) and adopts sessions (session, last)")
    assert sshd_door(node, PLAIN_PAM_STACK, spool)[0]
