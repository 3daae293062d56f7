"""No job carries geco's library, whichever Grid Engine starts it (issue 38).

Open Cluster Scheduler 9.1's sge_execd execs sge_shepherd with its own environment,
``LD_PRELOAD`` included, and its shepherd passes that on to the job (``INHERIT_ENV``);
Son of Grid Engine 8.1.9's shepherd gets an environment without ``LD_PRELOAD``. Here a
program the kernel names ``sge_execd`` (``tests/preload/execd_exec.c``) starts a fake
shepherd both ways under the preload, against a fake gecod that answers OK
(``tests/preloadkit.py``); the shepherd (``tests/preload/shepherd_job.c``) reports its
environment and ``/proc/<pid>/maps``, then starts a "job" with its environment that
reports the same.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.preloadkit import VARIANTS, Built, Node, new_node

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the test key must be owned by "
                       "root"),
]


@pytest.fixture
def node(built: Built) -> Iterator[Node]:
    """A fresh node (job 42.3) whose sge_shepherd is shepherd_job."""
    with new_node(built) as n:
        shutil.copy(built.plain("shepherd_job"), n.shepherd)
        yield n


@dataclass
class Report:
    """What one process (the shepherd or the job) said it carries."""

    pid: int = 0
    env: list[str] = field(default_factory=list)
    maps: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Start:
    """One shepherd start: the execd's pid, each role's report, the rest of stdout."""

    returncode: int
    execd_pid: int
    reports: dict[str, Report]
    rest: str
    stderr: str


def start_shepherd(node: Node, variant: str, env: dict[str, str], *,
                   soge: bool = False) -> Start:
    """Run execd_exec VARIANT <node's sge_shepherd> in the job directory with ``env``
    (its environment, LD_PRELOAD and all), the Son of Grid Engine way with ``soge``."""
    argv = [str(node.built.prog("execd_exec")), variant, str(node.shepherd)]
    proc = subprocess.run([*argv, "soge"] if soge else argv, capture_output=True, env=env,
                          cwd=node.job_dir, timeout=60, check=False)
    reports: dict[str, Report] = {}
    rest, execd_pid = [], 0
    for line in proc.stdout.decode().splitlines():
        role, _, what = line.partition(" ")
        kind, _, value = what.partition(" ")
        if role == "execd" and kind == "pid":
            execd_pid = int(value)
        elif role in ("shepherd", "job") and kind in ("pid", "env", "maps"):
            report = reports.setdefault(role, Report())
            if kind == "pid":
                report.pid = int(value)
            else:
                getattr(report, kind).append(value)
        else:
            rest.append(line)
    return Start(proc.returncode, execd_pid, reports, "\n".join(rest), proc.stderr.decode())


def execd_env(node: Node, preload: str, **extra: str) -> dict[str, str]:
    """An execd's environment: the node's (config) with LD_PRELOAD=``preload``."""
    return {**node.env(), "LD_PRELOAD": preload, **extra}


def entries(env: dict[str, str]) -> list[str]:
    """``env`` as the strings a process's environment holds, in order."""
    return [f"{name}={value}" for name, value in env.items()]


def assert_carried(start: Start, env: list[str], mapped: list[Path],
                   unmapped: list[Path]) -> None:
    """Both the shepherd and the job ran, each with exactly the environment ``env``, the
    files ``mapped`` mapped and ``unmapped`` not."""
    assert (start.returncode, start.rest) == (0, ""), start
    assert set(start.reports) == {"shepherd", "job"}, start
    for role, report in start.reports.items():
        assert report.env == env, role
        for path in mapped:
            assert str(path) in report.maps, (role, path)
        for path in unmapped:
            assert str(path) not in report.maps, (role, path)


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_ocs_shepherd_and_its_job_carry_no_geco_library(node: Node, variant: str) -> None:
    """Given an sge_execd whose environment preloads geco's library and another one, as
    Open Cluster Scheduler's does, when it execs sge_shepherd and gecod acks,
    then the shepherd (the same pid that asked gecod) and the job it starts have
    LD_PRELOAD naming only the other library, which is mapped while geco's is not, and
    every other variable as the execd had it."""
    fake = node.gecod("ok")
    env = execd_env(node, f"{node.built.lib} {node.built.other}")
    start = start_shepherd(node, variant, env)
    assert start.stderr == ""
    assert_carried(start, entries({**env, "LD_PRELOAD": str(node.built.other)}),
                   mapped=[node.built.other], unmapped=[node.built.lib])
    assert start.reports["shepherd"].pid == start.execd_pid
    assert [(r.job, r.task, r.pid) for r in fake.requests] == [(42, 3, start.execd_pid)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_soge_shepherd_gets_its_environment_as_it_is(node: Node, variant: str) -> None:
    """Given an sge_execd with the preload that execs sge_shepherd with an environment
    without LD_PRELOAD, as Son of Grid Engine 8.1.9's does, when gecod acks,
    then the shepherd and its job get exactly that environment, and neither maps geco's
    library."""
    fake = node.gecod("ok")
    env = execd_env(node, str(node.built.lib))
    start = start_shepherd(node, variant, env, soge=True)
    assert start.stderr == ""
    without = {name: value for name, value in env.items() if name != "LD_PRELOAD"}
    assert_carried(start, entries(without), mapped=[], unmapped=[node.built.lib])
    assert [r.pid for r in fake.requests] == [start.execd_pid]


# LD_PRELOAD as the execd has it -> as the shepherd gets it (None: no variable);
# {geco} is geco's library, {a} and {b} two others
SHAPES = {
    "only geco's": ("{geco}", None),
    "geco's first": ("{geco} {a}", "{a}"),
    "geco's last, colons": ("{a}:{geco}", "{a}"),
    "between two": ("{a} {geco}:{b}", "{a}:{b}"),
    "runs of separators": (" :{a}:: {geco} :{b}: ", "{a}:{b}"),
    "geco's twice": ("{geco}:{a}:{geco}", "{a}"),
    "spaces only around it": ("  {geco}  ", None),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_other_preloads_stay_in_order(node: Node, shape: str) -> None:
    """Given LD_PRELOAD listing geco's library among others, split at spaces and colons as
    ld.so splits it, when the shepherd is exec'd, then every other entry stays in its
    order, each after the separator that came before it, and the variable is gone when
    nothing else is left."""
    node.gecod("ok")
    other_b = node.root / "other_b.so"
    shutil.copy(node.built.other, other_b)
    names = {"geco": node.built.lib, "a": node.built.other, "b": other_b}
    given, expected = SHAPES[shape]
    env = execd_env(node, given.format(**names))
    start = start_shepherd(node, "execve", env)
    assert start.stderr == ""
    kept = {**env, "LD_PRELOAD": expected.format(**names)} if expected else {
        name: value for name, value in env.items() if name != "LD_PRELOAD"}
    others = [path for key, path in names.items() if key != "geco" and f"{{{key}}}" in given]
    assert_carried(start, entries(kept), mapped=others, unmapped=[node.built.lib])


def test_a_shepherd_started_without_quarantine_carries_no_geco_library_either(
        node: Node) -> None:
    """Given no gecod and policy=allow, when the shepherd is exec'd, then it starts with a
    warning, and neither it nor its job carries geco's library."""
    node.write_conf(policy="allow", timeout_ms=300)
    env = execd_env(node, f"{node.built.other}:{node.built.lib}")
    start = start_shepherd(node, "execlp", env)
    assert start.stderr.startswith(f"geco: sge_shepherd (pid {start.execd_pid}, job 42.3): ")
    assert start.stderr.endswith("; starting it without quarantine (policy=allow)\n")
    assert_carried(start, entries({**env, "LD_PRELOAD": str(node.built.other)}),
                   mapped=[node.built.other], unmapped=[node.built.lib])


def test_an_inert_library_takes_itself_out_of_a_shepherd_too(node: Node) -> None:
    """Given no config (the library inert), when the shepherd is exec'd, then it starts with
    the inert warning, without geco's library in LD_PRELOAD or mapped."""
    env = execd_env(node, str(node.built.lib), GECO_PRELOAD_CONF=str(node.root / "none.conf"))
    start = start_shepherd(node, "execv", env)
    assert start.stderr.startswith(f"geco: sge_shepherd (pid {start.execd_pid}) starts "
                                   "without quarantine: preload inactive: ")
    without = {name: value for name, value in env.items() if name != "LD_PRELOAD"}
    assert_carried(start, entries(without), mapped=[], unmapped=[node.built.lib])


TOO_BIG = {
    "variables": ("its environment has more than 2047 variables",
                  {f"V{i}": "x" for i in range(2100)}, 1),
    "LD_PRELOAD": ("its LD_PRELOAD rewritten would take more than 8191 bytes", {}, 200),
}


@pytest.mark.parametrize("case", TOO_BIG)
def test_an_environment_too_big_to_rewrite_is_passed_on_as_it_is(node: Node,
                                                                 case: str) -> None:
    """Given an execd environment the preload cannot rewrite without allocating (more
    variables, or a longer LD_PRELOAD, than its static room), when the shepherd is exec'd,
    then it still starts, with that environment as it is (geco's library inert in the
    job) and one warning naming the limit."""
    why, extra, copies = TOO_BIG[case]
    node.gecod("ok")
    env = execd_env(node, " ".join([str(node.built.other)] * copies + [str(node.built.lib)]),
                    **extra)
    start = start_shepherd(node, "execve", env)
    assert start.stderr == (f"geco: sge_shepherd (pid {start.execd_pid}): starts with "
                            "LD_PRELOAD as it is, geco's library included (inert in a job): "
                            f"{why}\n")
    assert_carried(start, entries(env), mapped=[node.built.other, node.built.lib],
                   unmapped=[])

