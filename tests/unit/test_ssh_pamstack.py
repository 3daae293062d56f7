"""`geco check` on sshd's PAM stack: gated and adopted, or a door out of every job.

The stacks are files in a fixture ``etc``: the README's own Debian stack (read from
the README, so the documented lines are the checked ones) over Debian's common-*
files with pam_systemd, and the ways a real stack goes wrong.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from geco.ssh.pamstack import Line, sshd_gate, stack
from tests.sshkit import readme_pam_stack as readme_stack

DEBIAN_COMMON = {
    "common-auth": "auth [success=1 default=ignore] pam_unix.so nullok\nauth requisite "
                   "pam_deny.so\nauth required pam_permit.so\n",
    "common-account": "account [success=1 new_authtok_reqd=done default=ignore] pam_unix.so\n"
                      "account requisite pam_deny.so\naccount required pam_permit.so\n",
    "common-session": "session [default=1] pam_permit.so\nsession requisite pam_deny.so\n"
                      "session required pam_permit.so\nsession required pam_unix.so\n"
                      "session optional pam_systemd.so\n",
}


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    (tmp_path / "pam.d").mkdir()
    (tmp_path / "ssh").mkdir()
    for name, body in DEBIAN_COMMON.items():
        (tmp_path / "pam.d" / name).write_text(body)
    return tmp_path


def sshd(etc: Path, text: str) -> tuple[bool, str]:
    (etc / "pam.d" / "sshd").write_text(text)
    return sshd_gate(etc)


def test_the_readmes_debian_stack_gates_and_adopts(etc: Path) -> None:
    """Given the README's stack over Debian's common files (pam_systemd in common-session),
    then the gate is closed: geco's account line can refuse and its session line is last."""
    assert sshd(etc, readme_stack()) == (
        False, "sshd: pam_geco.so gates logins (account) and adopts sessions (session, last)")
    lines = stack("sshd", etc / "pam.d")
    assert lines[-1] == Line("session", "required", "pam_geco.so")
    assert Line("session", "optional", "pam_systemd.so") in lines


@pytest.mark.parametrize(("text", "why"), [
    ("@include common-auth\n@include common-account\n@include common-session\n",
     "no pam_geco.so in the account stack of {d}/sshd: anyone with an account here can ssh "
     "in (the README's ssh section shows the lines)"),
    ("account optional pam_geco.so\n@include common-session\n"
     "session required pam_geco.so\n",
     "pam_geco.so is 'optional' in the account stack: it refuses nobody; make it required"),
    ("account required pam_geco.so\n@include common-session\n",
     "no pam_geco.so in the session stack of {d}/sshd: sessions run outside every job"),
    ("account required pam_geco.so\n"
     "session required pam_geco.so\n@include common-session\n",
     "pam_systemd.so runs after pam_geco.so in the session stack and moves the session out "
     "of its job; put geco's session line last"),
    # RHEL's style: include by type, a dash for a module that may be missing
    ("account required pam_geco.so\naccount include common-account\n"
     "session required pam_geco.so\n-session optional pam_systemd.so\n",
     "pam_systemd.so runs after pam_geco.so in the session stack and moves the session out "
     "of its job; put geco's session line last"),
])
def test_a_stack_that_lets_logins_or_sessions_past_the_job_is_an_open_door(
        etc: Path, text: str, why: str) -> None:
    """Given sshd stacks without geco's lines, with an account line that refuses nobody,
    without the session line, or with pam_systemd after it (Debian's include or RHEL's
    style), then each is an open door, named in one sentence."""
    assert sshd(etc, text) == (True, "sshd: " + why.format(d=etc / "pam.d"))


def test_usepam_no_skips_the_stack_and_no_sshd_is_no_door(etc: Path) -> None:
    """Given the README's stack but ``UsePAM no`` in sshd_config, then the door is open;
    given no /etc/pam.d/sshd at all (no sshd), it is closed."""
    (etc / "ssh" / "sshd_config").write_text("Port 22\nUsePAM no\nMatch User x\n  UsePAM yes\n")
    assert sshd(etc, readme_stack()) == (
        True, "sshd: UsePAM no in /etc/ssh/sshd_config: logins skip PAM, and so geco's gate")
    (etc / "pam.d" / "sshd").unlink()
    assert sshd_gate(etc) == (False, "sshd: no /etc/pam.d/sshd (no sshd on this node)")


def test_an_include_loop_or_a_missing_file_ends_quietly(etc: Path) -> None:
    """Given stacks that include each other, and one that includes a missing file, then the
    lines are read once each and the missing file gives none."""
    (etc / "pam.d" / "a").write_text("@include b\nsession required pam_a.so\n")
    (etc / "pam.d" / "b").write_text("@include a\n@include missing\nsession required pam_b.so\n")
    assert stack("a", etc / "pam.d") == [Line("session", "required", "pam_b.so"),
                                         Line("session", "required", "pam_a.so")]
