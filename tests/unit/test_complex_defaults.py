"""Grid Engine's complex defaults for memory (geco.sge.complexes): parsed from ``qconf -sc``,
asked at most once per period, and never a reason for a job not to start."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from geco.config import Config
from geco.node.limits import MemoryDefault
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import complexes
from geco.sge.lookup import Found

G = 1 << 30
M = 1 << 20
# `qconf -sc` of Son of Grid Engine 8.1.9 (trimmed), and a Univa row with its extra columns
QCONF_SC = """#name      shortcut   type        relop requestable consumable default  urgency
#----------------------------------------------------------------------------------------
arch                a          RESTRING    ==    YES         NO         NONE     0
h_vmem              h_vmem     MEMORY      <=    YES         YES        2G       0
m_mem_free          mmf        MEMORY      <=    YES         YES        0        0
s_vmem              s_vmem     MEMORY      <=    YES         NO         0        0
slots               s          INT         <=    YES         YES        1        1000
# >#< starts a comment but comments are not saved across edits --------
"""
UNIVA_ROW = "m_mem_free mfree MEMORY <= YES JOB 512M 0 NO NONE 0 YES\n"


def test_consumable_memory_complexes_with_a_default_are_read_per_slot() -> None:
    assert complexes.parse(QCONF_SC) == {"h_vmem": 2 * G}
    assert complexes.parse(QCONF_SC + UNIVA_ROW) == {"h_vmem": 2 * G, "m_mem_free": 512 * M}
    assert complexes.parse("h_vmem h_vmem MEMORY <= YES NO 2G 0\n") == {}
    assert complexes.parse("h_vmem h_vmem MEMORY <= YES YES lots 0\n") == {}


def test_a_fresh_answer_is_reused_and_a_stale_one_asked_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Given a kept answer younger than FRESH_SEC, then it is used (no qconf); older, then
    qconf is asked again: here it cannot run, which is said once and kept for RETRY_SEC,
    and no default comes of it."""
    cfg = Config(state_dir=tmp_path, qstat="/nonexistent/qstat", qstat_timeout=5.0)
    kept = tmp_path / "complexes"
    kept.write_text(QCONF_SC)
    assert complexes.memory_defaults(cfg) == {"h_vmem": 2 * G}
    stale = time.time() - complexes.FRESH_SEC - 1
    os.utime(kept, (stale, stale))
    with caplog.at_level(logging.WARNING, logger="geco.sge.complexes"):
        assert complexes.memory_defaults(cfg) == {}
        assert complexes.memory_defaults(cfg) == {}
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith("cannot read Grid Engine's complex defaults (")
    assert "/nonexistent/qconf" in caplog.messages[0]
    assert kept.read_text() == ""


def test_the_node_default_comes_first_and_the_complex_fills_in(tmp_path: Path) -> None:
    """Given [cgroup] memory_per_slot = 1G and Grid Engine's h_vmem default of 2G, then a job
    without a request gets RAM 1G and RAM+swap 2G per slot; a job with a request keeps it
    and qconf is not asked."""
    (tmp_path / "complexes").write_text(QCONF_SC)
    cfg = Config(state_dir=tmp_path, memory_per_slot=G)
    none = NodeResources("n1", slots=2)
    assert MemoryDefault.for_job(cfg, found(none), none) == MemoryDefault(G, 2 * G)
    assert MemoryDefault.for_job(cfg, found(none), none).applied(none) == none._replace(
        memory_limit=2 * G, vmem_limit=4 * G)
    (tmp_path / "complexes").unlink()
    asked = NodeResources("n1", slots=2, memory_limit=G)
    assert MemoryDefault.for_job(cfg, found(asked), asked) == MemoryDefault(G, 0)
    assert not (tmp_path / "complexes").exists()


def test_a_job_known_from_the_spool_alone_gets_no_default(tmp_path: Path) -> None:
    """Given the qmaster unreachable (the job's requests unknown, not absent), then no
    default applies, neither the node's nor Grid Engine's: it could cap what the job was
    granted, and the site runs such jobs without memory limits."""
    (tmp_path / "complexes").write_text(QCONF_SC)
    cfg = Config(state_dir=tmp_path, memory_per_slot=G)
    none = NodeResources("n1", slots=2)
    assert MemoryDefault.for_job(cfg, found(none, "spool"), none) == MemoryDefault()


def found(node: NodeResources, source: str = "qstat") -> Found:
    return Found(ResourceSet(7, 1, nodes=(node,)), source, 0.0)
