"""`geco preload-config`: the preload's key=value file, rendered from geco.toml."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from geco import config, preload_config
from geco.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TEXT = ("socket=path:/run/geco/gecod-root.sock\n"
                "key_file=/etc/geco/quarantine.key\n"
                "log=syslog\n"
                "timeout_ms=10000\n"
                "max_skew_ms=30000\n"
                "policy=refuse\n"
                "exec_filter=sge_shepherd\n"
                "session_socket=path:/run/geco/gecod.sock\n"
                "session_policy=allow\n")


def geco(*args: str, conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "geco.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60,
                          env=dict(os.environ, GECO_CONFIG=str(conf)))


def test_the_defaults_render_the_documented_file() -> None:
    """Given the default configuration, then the file is the contract's five settings plus
    the skew and the two of the preload in sshd, after one comment line naming its
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
        "session_socket=port:8080", "session_policy=refuse"]


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
