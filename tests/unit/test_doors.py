"""`geco check`'s view of the doors out of a job: atd, cron, systemd linger, sshd, the stray
killing (sshd's PAM stacks in detail: tests/unit/test_ssh_pamstack.py).

The node is a fixture tree: ``proc/<pid>/{comm,status}`` for the daemons, an
``etc`` with ``at.allow``/``cron.allow``, and a linger directory. What a live
atd looks like from inside a real job is in tests/integration/test_strays_live.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from geco import cli
from geco.config import Config, load
from geco.reports import doors
from tests.nodekit import process


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    paths = {"proc": tmp_path / "proc", "etc": tmp_path / "etc", "linger": tmp_path / "linger"}
    for p in paths.values():
        p.mkdir()
    paths["systemd"] = tmp_path / "run-systemd-system"  # made when a test has systemd run
    return paths


def lines(cfg: Config, node: dict[str, Path]) -> dict[str, tuple[bool, str]]:
    return {d.name: (d.open, d.text) for d in doors.doors(cfg, **node)}


def test_a_quiet_node_with_stray_killing_on_has_every_door_closed(node: dict[str, Path]) -> None:
    """Given no atd, no cron, no linger, when the doors are looked at, every one is closed."""
    found = lines(Config(), node)

    assert {name: is_open for name, (is_open, _) in found.items()} == {
        "atd": False, "cron": False, "linger": False, "sshd": False, "systemd": False,
        "strays": False}
    assert found["strays"][1] == ("stray killing: on (a user's processes outside every job "
                                  "die when their last job on this node ends; exempt: root, "
                                  "uid < 1000, nobody)")


def test_root_daemons_and_lingering_users_are_open_doors(node: dict[str, Path]) -> None:
    """Given atd and cron running as root, a process of a user calling itself atd, and
    linger for a user and for root, when the doors are looked at, then atd and cron are
    open with their pids, linger names the user only, and a user's 'atd' is no door."""
    process(node["proc"], 812, "atd", 0)
    process(node["proc"], 9, "cron", 0)
    process(node["proc"], 4000, "atd", 1000)
    (node["linger"] / "alice").touch()
    (node["linger"] / "root").touch()

    found = lines(Config(), node)

    assert found["atd"] == (True, "atd runs (pid 812): a job can start processes outside its "
                                  "cgroups with at, also after it ended (stop atd, or list "
                                  f"only admins in {node['etc']}/at.allow)")
    assert found["cron"][0] and found["cron"][1].startswith("cron runs (pid 9): ")
    assert found["linger"] == (True, "systemd linger is on for alice: their user manager runs "
                                     "processes (systemd-run --user) outside every job "
                                     "(loginctl disable-linger USER)")


def test_an_allow_file_of_exempt_users_only_closes_the_door(node: dict[str, Path]) -> None:
    """Given atd running and /etc/at.allow listing only root, and cron running with a
    cron.allow that lists a user, when the doors are looked at, then atd is closed and
    cron is open."""
    process(node["proc"], 812, "atd", 0)
    process(node["proc"], 9, "cron", 0)
    (node["etc"] / "at.allow").write_text("# admins\nroot\n")
    (node["etc"] / "cron.allow").write_text("root\nsomeuser-that-is-not-here\n")

    found = lines(Config(), node)

    assert found["atd"] == (False, f"atd runs (pid 812), but {node['etc']}/at.allow admits "
                                   "only exempt users (root)")
    assert found["cron"][0]


def test_systemd_on_cgroup_v1_without_the_systemd_base_is_an_open_door(
        node: dict[str, Path], tmp_path: Path) -> None:
    """Given systemd as the init system and a cgroup v1 layout, when [cgroup] v1_systemd_base
    is not set, then systemd is a door (a daemon-reload can move job processes out of their
    memory cgroup) naming the fix; when it is set, the door is closed; on v2 the same holds
    for v2_base."""
    node["systemd"].mkdir()
    v1 = Config()._replace(cgroup_mount=tmp_path)  # no cgroup.controllers: v1
    found = lines(v1, node)["systemd"]
    assert found == (True, "systemd: [cgroup] v1_systemd_base is not set, so on a daemon-reload "
                           "systemd can move a job's processes out of its memory, pids and "
                           "cpuacct cgroups (set v1_systemd_base = "
                           "\"/system.slice/geco-jobs.service/jobs\" with geco-jobs.service "
                           "installed; scripts/install.sh does)")
    base = "/system.slice/geco-jobs.service/jobs"
    assert lines(v1._replace(cgroup_v1_systemd_base=base), node)["systemd"] == (
        False, f"systemd: jobs are in {base} ([cgroup] v1_systemd_base), a subtree it leaves "
               "alone when its unit is delegated")
    (tmp_path / "cgroup.controllers").write_text("cpuset memory\n")
    assert lines(v1, node)["systemd"][0]
    assert "[cgroup] v2_base is not set" in lines(v1, node)["systemd"][1]


def test_stray_killing_off_is_an_open_door(node: dict[str, Path]) -> None:
    """Given [strays] kill = false, when the doors are looked at, then that is a door."""
    found = lines(Config()._replace(strays_kill=False), node)

    assert found["strays"] == (True, "stray killing: off ([strays] kill = false): what a job "
                                     "leaves through these doors outlives it")


def test_geco_check_prints_a_line_per_door_and_exits_1_when_one_is_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a geco.toml with stray killing off, when `geco check` runs, then it prints one
    line per door, 'open' for that one, names it on stderr and exits 1."""
    config = tmp_path / "geco.toml"
    config.write_text("[strays]\nkill = false\n")
    monkeypatch.setenv("GECO_CONFIG", str(config))

    code = cli.main(["check"])

    out, err = capsys.readouterr()
    assert code == 1
    assert "open  stray killing: off ([strays] kill = false)" in out
    doors = [ln for ln in out.splitlines() if not ln.startswith("node  ")]
    assert len(doors) == 6
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("node  ")] == [
        "cores", "memory", "default", "gpus", "moves", "tmp", "metrics", "health"]
    assert 'node  metrics  no Prometheus endpoint ([metrics] listen = "")' in out
    # atd or cron may run on this machine too: only the stray killing's line is known
    assert re.fullmatch(r"geco check: \d door\(s\) out of a job open on \S+: (.+, )?strays\n",
                        err), err


def test_the_strays_section_is_read_and_bad_values_fall_back(tmp_path: Path) -> None:
    """Given [strays] with every key, then a bad value, the values (or defaults) are used."""
    path = tmp_path / "geco.toml"
    path.write_text('[strays]\nkill = false\nmin_uid = 500\nexempt_users = ["ops", "backup"]\n'
                    "grace = 0.5\ndelay = 3\n")
    cfg = load(path)
    assert (cfg.strays_kill, cfg.strays_min_uid, cfg.strays_exempt_users, cfg.strays_grace,
            cfg.strays_delay) == (False, 500, ("ops", "backup"), 0.5, 3.0)

    path.write_text('[strays]\nexempt_users = "ops"\nmin_uid = -1\n')
    cfg = load(path)
    assert (cfg.strays_exempt_users, cfg.strays_min_uid) == (("nobody",), 1000)
