"""Read sshd's PAM stack the way libpam does, to say whether geco gates and adopts logins.

``geco check`` asks :func:`sshd_gate`: is ``pam_geco.so`` in sshd's ``account``
stack as a line that can refuse (``required``/``requisite``), in its ``session``
stack, and is no module that moves processes into cgroups of its own
(``pam_systemd``, libcgroup's ``pam_cgroup``) run after geco's session line,
which would take the session back out of the job? ``@include`` and
``include``/``substack`` are followed (a file once); ``sshd_config``'s
``UsePAM no`` bypasses the stack altogether.
"""

from __future__ import annotations

from pathlib import Path

from geco._tuple import NamedTuple

__all__ = ["Line", "sshd_account_gate", "sshd_gate", "stack"]

MODULE = "pam_geco.so"
# session modules that put the process into a cgroup of their own choosing
MOVERS = ("pam_systemd.so", "pam_cgroup.so")


class Line(NamedTuple):
    """One module line of a PAM stack: its type, control and module (base name)."""

    type: str
    control: str
    module: str


def _module_name(path: str) -> str:
    return path.rpartition("/")[2]


def stack(service: str, pam_d: Path, _seen: frozenset[str] = frozenset()) -> list[Line]:
    """The module lines of ``pam_d/service``, includes expanded, in the order libpam runs
    them (a missing or unreadable file gives none)."""
    if service in _seen:
        return []
    try:
        text = (pam_d / service).read_text(errors="replace")
    except OSError:
        return []
    seen = _seen | {service}
    lines: list[Line] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "@include" and len(words) > 1:
            lines += stack(words[1], pam_d, seen)
            continue
        if len(words) < 3:
            continue
        kind = words[0].lstrip("-")
        if words[1] in ("include", "substack"):
            lines += [line for line in stack(words[2], pam_d, seen) if line.type == kind]
            continue
        control = words[1]
        if control.startswith("["):  # [value=action ...] may hold spaces
            end = next((i for i, w in enumerate(words) if w.endswith("]")), len(words) - 1)
            control, module = " ".join(words[1:end + 1]), (words[end + 1:] or [""])[0]
        else:
            module = words[2]
        lines.append(Line(kind, control, _module_name(module)))
    return lines


def _uses_pam(sshd_config: Path) -> bool:
    """``UsePAM`` of sshd_config (the first one outside a Match block; no means no)."""
    try:
        text = sshd_config.read_text(errors="replace")
    except OSError:
        return True  # sshd's Debian and RHEL builds default to the packaged yes
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0].lower() == "match":
            break
        if words[0].lower() == "usepam" and len(words) > 1:
            return words[1].lower() == "yes"
    return True


def sshd_account_gate(etc: Path = Path("/etc")) -> bool:
    """Does sshd's account stack run pam_geco.so (whatever its control)?"""
    return any(line.type == "account" and line.module == MODULE
               for line in stack("sshd", etc / "pam.d"))


def sshd_gate(etc: Path = Path("/etc")) -> tuple[bool, str]:
    """Whether ssh logins are gated and adopted by geco: (open, one sentence for the admin).

    ``open`` is True when a user without a job could log in, or a session could run
    outside the job.
    """
    pam_d, service = etc / "pam.d", "sshd"
    if not (pam_d / service).exists():
        return False, "sshd: no /etc/pam.d/sshd (no sshd on this node)"
    if not _uses_pam(etc / "ssh" / "sshd_config"):
        return True, ("sshd: UsePAM no in /etc/ssh/sshd_config: logins skip PAM, and so "
                      "geco's gate")
    lines = stack(service, pam_d)
    account = [line for line in lines if line.type == "account" and line.module == MODULE]
    session = [i for i, line in enumerate(lines)
               if line.type == "session" and line.module == MODULE]
    if not account:
        return True, (f"sshd: no {MODULE} in the account stack of {pam_d / service}: anyone "
                      "with an account here can ssh in (the README's ssh section shows the lines)")
    if account[0].control not in ("required", "requisite"):
        return True, (f"sshd: {MODULE} is '{account[0].control}' in the account stack: it "
                      "refuses nobody; make it required")
    if not session:
        return True, (f"sshd: no {MODULE} in the session stack of {pam_d / service}: sessions "
                      "run outside every job")
    movers = [line.module for line in lines[session[-1] + 1:]
              if line.type == "session" and line.module in MOVERS]
    if movers:
        return True, (f"sshd: {', '.join(movers)} runs after {MODULE} in the session stack and "
                      "moves the session out of its job; put geco's session line last")
    return False, f"sshd: {MODULE} gates logins (account) and adopts sessions (session, last)"
