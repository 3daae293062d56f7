"""The configuration file: documented defaults, bad values, broken files."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from geco import config, configcache
from geco.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_documented_file_is_exactly_the_defaults() -> None:
    """Given conf/geco.toml (every key with its documented default),
    when it is loaded, then it equals Config() field for field: docs and code agree."""
    assert config.load(REPO / "conf" / "geco.toml") == config.Config()


def test_every_setting_is_documented_in_conf() -> None:
    """Given the Config fields, then each one appears (by its TOML name) in conf/geco.toml."""
    text = (REPO / "conf" / "geco.toml").read_text()
    for name in config.Config._fields:
        toml_name = config._TOML_NAME.get(name, name)
        assert f"\n{toml_name} = " in text, f"{name} ({toml_name}) is not documented"


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    assert config.load(tmp_path / "absent.toml") == config.Config()


def test_values_are_read_from_their_sections(tmp_path: Path) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[cgroup]\nname = "JOBS"\nversion = "2"\n[cores]\nhardware_threads = true\n'
                    '[qstat]\ncommand = "/opt/sge/bin/qstat"\ntimeout = 5\nretries = 0\n'
                    '[log]\nlevel = "DEBUG"\n')
    cfg = config.load(path)
    assert (cfg.cgroup_name, cfg.cgroup_version, cfg.hardware_threads) == ("JOBS", "2", True)
    assert (cfg.qstat, cfg.qstat_timeout, cfg.qstat_retries) == ("/opt/sge/bin/qstat", 5.0, 0)
    assert cfg.log_level == "debug"


def test_a_bad_value_is_logged_and_the_default_used(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Given a wrong-typed value and an unknown key, when loaded, then each is logged
    with what was expected and the default stays in force (pam_slurm_adopt's rule)."""
    path = tmp_path / "geco.toml"
    path.write_text('[qstat]\ntimeout = "soon"\n[cgroup]\nversion = "3"\ncolour = "red"\n')
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert cfg.qstat_timeout == 30.0 and cfg.cgroup_version == "auto"
    assert caplog.messages == [
        f"config {path}: qstat.timeout must be a positive number, got 'soon'; "
        "using the default 30.0",
        f"config {path}: cgroup.version must be one of auto, 1, 2, got '3'; "
        "using the default 'auto'",
        f"config {path}: unknown key cgroup.colour ignored",
    ]


def test_a_file_that_is_not_toml_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "geco.toml"
    path.write_text("[cgroup\nname=")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value).startswith("the configuration is not valid TOML: ")
    assert str(info.value).endswith(f"(path={path})")


def test_the_site_file_is_parsed_once_and_read_again_from_roots_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the site's geco.toml, when it is loaded twice, then the second load takes
    root's parsed copy (no TOML parsing) and gives the same settings; a changed file is
    parsed anew; a copy not owned by root is never used."""
    site = tmp_path / "geco.toml"
    site.write_text('[cgroup]\nname = "JOBS"\n')
    monkeypatch.setattr(config, "DEFAULT_PATH", site)
    monkeypatch.setattr(configcache, "DIR", tmp_path / "run")
    parsed: list[Path] = []
    real_parse = config._parse

    def counting(f: BinaryIO, path: Path) -> dict[str, Any]:
        parsed.append(path)
        return real_parse(f, path)
    monkeypatch.setattr(config, "_parse", counting)
    first, second = config.load(site), config.load(site)
    assert (first.cgroup_name, second, len(parsed)) == ("JOBS", first, 1)
    [kept] = (tmp_path / "run").iterdir()
    assert kept.stat().st_mode & 0o777 == 0o644
    site.write_text('[cgroup]\nname = "OTHER"\n')
    assert (config.load(site).cgroup_name, len(parsed)) == ("OTHER", 2)
    os.chown(kept, 65534, 65534)  # a copy root did not write (or a user replaced)
    assert (config.load(site).cgroup_name, len(parsed)) == ("OTHER", 3)


def test_the_gpu_section_and_the_cpus_reserve_are_read(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Given [gpu] and [cgroup] cpus_reserve, then they are read (the cpu list made canonical);
    a relative device path, an unknown consumable and a cpu list that is not one are each
    logged and their default kept."""
    path = tmp_path / "geco.toml"
    path.write_text('[gpu]\ncomplex = "nvidia_gpu"\nconsumable = "job"\n'
                    'devices = ["/dev/nvidia1", "/dev/nvidia0"]\n[cgroup]\ncpus_reserve = "1,0"\n')
    cfg = config.load(path)
    assert (cfg.gpu_complex, cfg.gpu_consumable, cfg.gpu_devices, cfg.cpus_reserve) == (
        "nvidia_gpu", "job", ("/dev/nvidia1", "/dev/nvidia0"), "0-1")
    path.write_text('[gpu]\nconsumable = "node"\ndevices = ["nvidia0"]\n'
                    '[cgroup]\ncpus_reserve = "0 1"\n')
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert (cfg.gpu_consumable, cfg.gpu_devices, cfg.cpus_reserve) == ("slot", (), "")
    assert caplog.messages == [
        f"config {path}: gpu.consumable must be one of slot, job, got 'node'; using the "
        "default 'slot'",
        f"config {path}: gpu.devices must be a list of absolute paths, got ['nvidia0']; "
        "using the default ()",
        f"config {path}: cgroup.cpus_reserve must be a cpu list such as \"0\" or \"0-1,8\" "
        "(\"\" = none), got '0 1'; using the default ''",
    ]
