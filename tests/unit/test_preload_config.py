"""`geco preload-config`: the preload's key=value file, rendered from geco.toml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from geco import config
from geco.errors import ConfigError
from geco.wire import preload_config

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TEXT = ("socket=path:/run/geco/gecod-root.sock\n"
                "key_file=/etc/geco/quarantine.key\n"
                "log=syslog\n"
                "timeout_ms=10000\n"
                "max_skew_ms=30000\n"
                "policy=refuse\n"
                "exec_filter=sge_shepherd\n"
                "session_socket=path:/run/geco/gecod.sock\n"
                "session_policy=in-job\n"
                "job_cgroups=/GECO\n"
                "session_admin_uids=\n"
                "session_admin_gids=\n"
                "session_bypass=/etc/geco/ssh-bypass\n"
                "job_mntns=/var/lib/geco/mntns\n")


def geco(*args: str, conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "geco.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env=dict(os.environ, GECO_CONFIG=str(conf)))


def test_the_defaults_render_the_documented_file() -> None:
    """Given the default configuration, then the file is the contract's five settings plus
    the skew and the six of the preload in sshd, after one comment line naming its
    source."""
    text = preload_config.render(config.Config(), source="/etc/geco/geco.toml")
    assert text == ("# written by `geco preload-config` from /etc/geco/geco.toml; edit "
                    "geco.toml and re-run it\n" + DEFAULT_TEXT)


def test_settings_are_rendered_in_the_preloads_units_and_forms() -> None:
    """Given a service name, fractional seconds and several filters, then the socket is
    gecod's privileged one for that port (the preload must not call NSS inside sshd; no
    user can connect there), times are ms and the filters comma-separated."""
    cfg = config.Config()._replace(gecod_socket="service:http-alt",
                              gecod_request_timeout=2.5, gecod_max_skew=0.25,
                              gecod_unreachable_policy="allow",
                              gecod_exec_filter=("sge_shepherd", "geco-shepherd"),
                              gecod_key_file=Path("/srv/geco/q.key"), gecod_preload_log="none",
                              ssh_gecod_unreachable="refuse")
    assert preload_config.render(cfg).splitlines()[1:] == [
        "socket=path:/run/geco/gecod-8080-root.sock", "key_file=/srv/geco/q.key", "log=none",
        "timeout_ms=2500", "max_skew_ms=250",
        "policy=allow", "exec_filter=sge_shepherd,geco-shepherd",
        "session_socket=port:8080", "session_policy=refuse", "job_cgroups=/GECO",
        "session_admin_uids=", "session_admin_gids=", "session_bypass=/etc/geco/ssh-bypass",
        "job_mntns=/var/lib/geco/mntns"]


@pytest.mark.parametrize(("unreachable", "policy"), [
    ("decide-here", "in-job"), ("refuse", "refuse"), ("allow", "allow")])
def test_the_sshd_preload_fails_closed_unless_told_to_allow(unreachable: str,
                                                            policy: str) -> None:
    """Given [ssh] gecod_unreachable, then the sshd preload's session_policy is in-job for
    decide-here (a session gecod cannot place runs only inside a job's cgroup, for an admin
    or while the bypass file exists), refuse for refuse, and allow only for allow."""
    cfg = config.Config()._replace(ssh_gecod_unreachable=unreachable)
    assert f"\nsession_policy={policy}\n" in preload_config.render(cfg)


@pytest.mark.parametrize(("change", "line"), [
    ({}, "/GECO"),
    ({"cgroup_name": "JOBS"}, "/JOBS"),
    ({"cgroup_version": "1", "cgroup_v2_base": "/sys/fs/cgroup/elsewhere"}, "/GECO"),
    ({"cgroup_version": "2"}, "/GECO"),
    ({"cgroup_version": "2", "cgroup_v2_base": "/sys/fs/cgroup/system.slice/geco-jobs.service/"
      "jobs"}, "/system.slice/geco-jobs.service/jobs"),
    ({"cgroup_v2_base": "/sys/fs/cgroup/system.slice/geco-jobs.service/jobs"},
     "/GECO,/system.slice/geco-jobs.service/jobs"),
    ({"cgroup_mount": Path("/cg"), "cgroup_version": "2", "cgroup_v2_base": "/cg"}, "/"),
], ids=["default", "name", "v1", "v2", "v2-base", "auto-both", "v2-root"])
def test_job_cgroups_are_where_proc_self_cgroup_shows_geco_jobs(change: dict[str, object],
                                                                line: str) -> None:
    """Given [cgroup] settings, then job_cgroups names the path prefix(es) under which
    <job>.<task> cgroups are geco's, as /proc/self/cgroup shows them: v1 /<name>, v2 the
    v2_base made relative to mount (/<name> when unset), both while the version is auto."""
    cfg = config.Config()._replace(**change)  # type: ignore[arg-type]
    assert f"\njob_cgroups={line}\n" in preload_config.render(cfg)


def test_admins_are_resolved_to_ids_and_unknown_ones_are_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given [ssh] admins and admin_groups, then the file holds their uids and gids in order,
    each once (the preload compares ids: it must not call NSS inside sshd), and a name this
    node does not know is left out and named in a last comment line."""
    users = {"ann": 1001, "bob": 1002, "bob2": 1002}
    groups = {"wheel": 10, "ops": 2000}
    monkeypatch.setattr(preload_config.pwd, "getpwnam",
                        lambda n: SimpleNamespace(pw_uid=users[n]))
    monkeypatch.setattr(preload_config.grp, "getgrnam",
                        lambda n: SimpleNamespace(gr_gid=groups[n]))
    cfg = config.Config()._replace(ssh_admins=("bob", "ann", "bob2", "gone"),
                                   ssh_admin_groups=("ops", "wheel", "nosuch"),
                                   ssh_bypass_file=Path("/srv/geco/open"))
    assert preload_config.render(cfg).splitlines()[-6:] == [
        "job_cgroups=/GECO", "session_admin_uids=1002,1001", "session_admin_gids=2000,10",
        "session_bypass=/srv/geco/open", "job_mntns=/var/lib/geco/mntns",
        "# not on this node, left out of session_admin_*: gone, nosuch (re-run geco "
        "preload-config once they are)"]


def test_real_accounts_resolve_through_the_databases() -> None:
    """Given accounts every Debian node has, then their ids come from pwd and grp."""
    cfg = config.Config()._replace(ssh_admins=("root", "nobody"),
                                   ssh_admin_groups=("nogroup",))
    lines = preload_config.render(cfg).splitlines()
    assert lines[-4:-2] == ["session_admin_uids=0,65534", "session_admin_gids=65534"]


def test_more_admins_than_the_preload_holds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given 65 admins with distinct uids, then rendering refuses them by name: the preload
    holds 64."""
    monkeypatch.setattr(preload_config.pwd, "getpwnam",
                        lambda n: SimpleNamespace(pw_uid=int(n[1:])))
    cfg = config.Config()._replace(ssh_admins=tuple(f"u{i}" for i in range(65)))
    with pytest.raises(ConfigError) as info:
        preload_config.render(cfg)
    assert str(info.value) == ("ssh.admins must name at most 64 accounts (the preload's "
                               "limit), got 65")


@pytest.mark.parametrize(("change", "text"), [
    ({"gecod_socket": "tcp:1"}, "socket address 'tcp:1' is not understood; accepted forms: "),
    ({"gecod_socket": "path:/run/a #b"},
     "gecod.socket must be one line without surrounding blanks or ' #', got "
     "'path:/run/a #b-root'"),
    ({"gecod_privileged_socket": "port:99"},
     "socket address 'port:99' must be a Unix socket (path:<absolute path>)"),
    ({"gecod_key_file": Path("/etc/geco/q.key ")},
     "gecod.key_file must be one line without surrounding blanks or ' #', got "
     "'/etc/geco/q.key '"),
    ({"gecod_request_timeout": 0.0001}, "gecod.request_timeout must be 0.001 to 3600 seconds, "
                                        "got 0.0001"),
    ({"gecod_max_skew": 3601.0}, "gecod.max_skew must be 0.001 to 3600 seconds, got 3601.0"),
    ({"gecod_unreachable_policy": "maybe"}, "gecod.unreachable_policy must be one of refuse, "
                                            "allow, got 'maybe'"),
    ({"gecod_exec_filter": ()}, "gecod.exec_filter must name 1 to 16 programs, got 0"),
    ({"gecod_exec_filter": ("bin/sge_shepherd",)},
     "gecod.exec_filter must hold program basenames (letters, digits, . _ + -), got "
     "'bin/sge_shepherd'"),
    ({"gecod_exec_filter": ("a,b",)},
     "gecod.exec_filter must hold program basenames (letters, digits, . _ + -), got 'a,b'"),
    ({"ssh_bypass_file": Path("/etc/geco/ssh #bypass")},
     "ssh.bypass_file must be one line without surrounding blanks or ' #', got "
     "'/etc/geco/ssh #bypass'"),
    ({"ssh_bypass_file": Path("/" + "b" * 4000)},
     "the preload config would be 4390 bytes; the preload reads at most 4095 (fewer [ssh] "
     "admins or shorter paths)"),
    ({"cgroup_name": "a,b"},
     "cgroup.name must be one directory name (no '/' or ',') of at most 254 bytes, got 'a,b'"),
    ({"cgroup_name": "x" * 255},
     "cgroup.name must be one directory name (no '/' or ',') of at most 254 bytes, got "),
    ({"cgroup_v2_base": "/srv/jobs"},
     "cgroup.v2_base must lie below cgroup.mount (/sys/fs/cgroup), got '/srv/jobs'"),
    ({"cgroup_v2_base": "/sys/fs/cgroup/a,b"},
     "cgroup.v2_base must be at most 255 bytes below cgroup.mount, without ',', got "
     "'/sys/fs/cgroup/a,b'"),
    ({"cgroup_v2_base": "/sys/fs/cgroup/a #b"},
     "cgroup.v2_base must be one line without surrounding blanks or ' #', got '/a #b'"),
])
def test_a_value_the_preload_could_not_read_is_refused_by_name(change: dict[str, object],
                                                                text: str) -> None:
    cfg = config.Config()._replace(**change)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        preload_config.render(cfg)
    assert str(info.value).startswith(text)


def test_the_command_prints_or_writes_atomically(tmp_path: Path) -> None:
    """Given a geco.toml, then `geco preload-config` prints the file, and with --output
    writes it (0644, parent created) with the same text."""
    conf = tmp_path / "geco.toml"
    conf.write_text('[gecod]\nsocket = "4000"\n')
    shown = geco("preload-config", conf=conf)
    assert (shown.returncode, shown.stderr) == (0, "")
    assert shown.stdout.splitlines()[1] == "socket=path:/run/geco/gecod-4000-root.sock"
    assert shown.stdout.startswith(f"# written by `geco preload-config` from {conf};")
    out = tmp_path / "etc" / "preload.conf"
    written = geco("preload-config", "--output", str(out), conf=conf)
    assert (written.returncode, written.stdout, written.stderr) == (0, "", "")
    assert out.read_text() == shown.stdout
    assert out.stat().st_mode & 0o777 == 0o644
    assert os.listdir(out.parent) == ["preload.conf"]


def test_a_bad_setting_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    conf = tmp_path / "geco.toml"
    conf.write_text('[gecod]\nsocket = "localhost:80"\n')
    out = tmp_path / "preload.conf"
    res = geco("preload-config", "-o", str(out), conf=conf)
    assert res.returncode == 2
    assert res.stderr.startswith("geco preload-config: socket address 'localhost:80' is not "
                                 "understood; accepted forms: ")
    assert not out.exists()
