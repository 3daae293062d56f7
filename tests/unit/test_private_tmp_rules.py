"""A job's private /tmp: where its places are, the /dev/shm cap ([tmp] shm_size), the
settings read from geco.toml (geco.job.privatetmp, geco.config)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from geco import config
from geco.config import Config
from geco.job import privatetmp
from geco.jobkey import JobKey

M, G = 1 << 20, 1 << 30


def test_the_shm_cap_is_a_share_of_the_jobs_limit_or_a_size_in_whole_pages() -> None:
    cfg = Config()
    assert privatetmp.shm_bytes(cfg, 4 * G, 64 * G) == 2 * G  # 50% of the job's limit
    assert privatetmp.shm_bytes(cfg, 0, 64 * G) == 32 * G  # no limit: of the jobs' memory
    assert privatetmp.shm_bytes(cfg._replace(tmp_shm_size="25%"), 3 * M + 5, 0) == 768 * 1024
    assert privatetmp.shm_bytes(cfg._replace(tmp_shm_size="4G"), 1 * G, 64 * G) == 4 * G
    assert privatetmp.shm_bytes(cfg._replace(tmp_shm_size="1%"), 100, 0) == 4096  # a page


def test_a_jobs_places_are_under_the_base_and_the_state_dir() -> None:
    key = JobKey(42, 3)
    here = privatetmp.places(Config(state_dir=Path("/var/lib/geco")), key)
    assert here == privatetmp.Places(Path("/var/lib/geco/mntns/42.3"),
                                     Path("/var/lib/geco/tmp/42.3"),
                                     Path("/var/lib/geco/tmp/42.3/tmp"),
                                     Path("/var/lib/geco/tmp/42.3/var-tmp"))
    there = privatetmp.places(Config(tmp_base="/scratch/jobs", tmp_var_tmp=False), key)
    assert (there.tmp, there.var_tmp) == (Path("/scratch/jobs/42.3/tmp"), None)


def test_the_tmp_section_is_read_and_a_bad_value_is_one_line_and_the_default(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[tmp]\nbase = "/scratch/jobs"\nvar_tmp = false\nshm_size = "8G"\n')
    cfg = config.load(path)
    assert (cfg.tmp_base, cfg.tmp_var_tmp, cfg.tmp_shm_size) == ("/scratch/jobs", False, "8G")
    for bad in ('"150%"', '"lots"', "50", '"0%"'):
        path.write_text(f"[tmp]\nshm_size = {bad}\nbase = \"scratch\"\n")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="geco.config"):
            cfg = config.load(path)
        assert (cfg.tmp_shm_size, cfg.tmp_base) == ("50%", "")
        [shm, base] = caplog.messages
        assert "tmp.shm_size must be a share of the job's memory limit such as \"50%\"" in shm
        assert "tmp.base must be an absolute path" in base


def test_what_a_job_that_cannot_get_its_tmp_meets_is_read_and_shown_by_geco_check(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "geco.toml"
    path.write_text('[tmp]\nprivate = true\nmin_free = "10G"\non_failure = "shared"\n'
                    'node_namespace = ""\n')
    cfg = config.load(path)
    assert (cfg.tmp_min_free, cfg.tmp_on_failure, cfg.tmp_node_namespace) == (
        10 * G, "shared", "")
    line = privatetmp.describe(cfg)
    assert "while 10G are free there" in line and "run with the node's" in line, line
    assert "nodes without the exec() preload: none" in line
    assert "not run (re-queued)" in privatetmp.describe(Config(tmp_private=True))
    path.write_text('[tmp]\non_failure = "ignore"\nnode_namespace = "proc/1"\n'
                    'min_free = "lots"\n')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="geco.config"):
        cfg = config.load(path)
    assert (cfg.tmp_on_failure, cfg.tmp_node_namespace, cfg.tmp_min_free) == (
        "requeue", "/proc/1/ns/mnt", 0)
    assert len(caplog.messages) == 3, caplog.messages
