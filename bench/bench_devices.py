"""Time a GPU node's work per job: picking GPUs, and denying the others to a cgroup v2.

Run as root from the repo root:

    /opt/geco-dev/venv/bin/python -m bench.bench_devices [--runs 200]

Picking: :func:`geco.node.gpus.pick` on a synthetic 8-GPU, 2-socket node (GPUs 0-3 on NUMA
node 0, 4-7 on 1) for 1, 2 and 4 GPUs near socket 1, with 0-3 others busy (random, fixed
seed), plus reading the busy picture as geco does under the node lock: the resource
files of 7 running jobs (floor: one such file read).

Denying: each run makes a fresh cgroup under ``geco-test-bench-devices-<pid>`` in this host's
cgroup2 (``/sys/fs/cgroup/unified``; the mount given by ``--mount``) and times one
:func:`geco.cgroup._bpfdev.deny_devices` call on it (the program assembled, loaded,
verified and attached), for 1, 7 and 63 denied devices (``c 195:N``, a GPU node's
majors); the sizes alternate run by run, so machine noise hits them alike. The
cgroup is removed after each run (not timed). Floor, measured in the same run and
the same place: mkdir + rmdir of an empty cgroup. Everything is removed afterwards,
also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from bench._common import percentile, sigterm_exits
from bench._table import Row, add_json_option, write_rows
from geco import gpushare
from geco.cgroup._bpfdev import deny_devices
from geco.errors import GecoError
from geco.node import gpus
from geco.resourceset import NodeResources, ResourceSet
from geco.sge import resourcefile

SIZES = (1, 7, 63)


TWO_SOCKETS = tuple(gpus.Gpu(i, f"/dev/nvidia{i}", 195, i, i // 4) for i in range(8))


def _picking(runs: int) -> list[Row]:
    """Time gpus.pick and the busy picture's read (7 resource files) under a fake state dir."""
    import random
    import tempfile

    rng = random.Random(7)
    rows = []
    for count in (1, 2, 4):
        took = []
        for _ in range(runs):
            busy = rng.sample(range(8), rng.randint(0, 8 - count))
            started = time.perf_counter_ns()
            gpus.pick(TWO_SOCKETS, count, busy, near=(1,))
            took.append((time.perf_counter_ns() - started) / 1e3)
        rows.append((f"pick {count} of 8 GPUs (2 sockets)", took))
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        keys = [resourcefile.write(where, ResourceSet(100 + i, 1, owner="alice", nodes=(
            NodeResources("here", gpus=str(i)),))).name for i in range(7)]
        picture, one = [], []
        for _ in range(runs):
            started = time.perf_counter_ns()
            held = {i for k in keys for rs in [resourcefile.read(where, k)] if rs
                    for i in gpushare.parse_share(rs.nodes[0].gpus)[1]}
            picture.append((time.perf_counter_ns() - started) / 1e3)
            started = time.perf_counter_ns()
            (where / keys[0]).read_bytes()
            one.append((time.perf_counter_ns() - started) / 1e3)
        assert held == set(range(7))
    floor = percentile(one, 0.5)
    out = []
    for what, took in [*rows, ("the busy picture: 7 running jobs' resource files", picture)]:
        p50 = percentile(took, 0.5)
        print(f"{what:<52} {p50:>8.1f} {percentile(took, 0.9):>8.1f}")
        out.append(Row(f"{what}, p50", p50, "us", floor=floor,
                       floor_label="one resource file read"))
    print(f"{'floor: one resource file read':<52} {floor:>8.1f} {percentile(one, 0.9):>8.1f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed calls per size")
    parser.add_argument("--mount", type=Path, default=Path("/sys/fs/cgroup/unified"),
                        help="a cgroup2 mount (default: this hybrid host's)")
    add_json_option(parser)
    args = parser.parse_args()
    if not (args.mount / "cgroup.controllers").exists():
        raise SystemExit(f"bench_devices: no cgroup2 mounted at {args.mount}")
    sigterm_exits()
    print(f"{'GPU picking (' + str(args.runs) + ' runs each)':<52} {'p50 us':>8} {'p90 us':>8}")
    picked = _picking(args.runs)
    parent = args.mount / f"geco-test-bench-devices-{os.getpid()}"
    parent.mkdir()
    took: dict[int, list[float]] = {n: [] for n in SIZES}
    floor: list[float] = []
    try:
        for run in range(args.runs):
            cg = parent / f"r{run}"
            started = time.perf_counter_ns()
            cg.mkdir()
            cg.rmdir()
            floor.append((time.perf_counter_ns() - started) / 1e3)
            for n in SIZES:
                cg.mkdir()
                started = time.perf_counter_ns()
                deny_devices(cg, [("c", 195, minor) for minor in range(n)])
                took[n].append((time.perf_counter_ns() - started) / 1e3)
                cg.rmdir()  # the program goes with it (no EBUSY seen: nothing to wait for)
    except GecoError as exc:
        print(f"bench_devices: {exc}", file=sys.stderr)
        return 1
    finally:
        for cg in parent.iterdir():
            if cg.is_dir():
                with contextlib.suppress(OSError):
                    cg.rmdir()
        parent.rmdir()
    p50_floor = percentile(floor, 0.5)
    rows = []
    print(f"{'what (' + str(args.runs) + ' runs each)':<44} {'p50 us':>8} {'p90 us':>8}")
    for n in SIZES:
        p50 = percentile(took[n], 0.5)
        print(f"{f'deny_devices, {n} device(s) (load + attach)':<44} {p50:>8.0f} "
              f"{percentile(took[n], 0.9):>8.0f}")
        rows.append(Row(f"deny {n} device{'s' if n > 1 else ''} (BPF load + attach), p50",
                        p50, "us", floor=p50_floor, floor_label="cgroup mkdir+rmdir"))
    print(f"{'floor: mkdir + rmdir of an empty cgroup':<44} {p50_floor:>8.0f} "
          f"{percentile(floor, 0.9):>8.0f}")
    write_rows(args.json, [*picked, *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
