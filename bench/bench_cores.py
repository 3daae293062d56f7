"""Time core allocation on a big synthetic node, and topology loading.

Run from the repo root:  /opt/geco-dev/venv/bin/python -m bench.bench_cores [--runs N]

Allocation: ``pack:8 core:64 pu:2`` (1024 PUs, 512 cores), random job sizes
1..64 slots against a node whose cores are 0 %, 50 % or 90 % busy (random
cores, fixed seed). Each timing is one ``allocate`` call, success or refusal.
Loading: the same synthetic description, and this host (cache bypassed).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from bench._table import Row, add_json_option, write_rows
from geco.errors import CoresUnavailable
from geco.node.cores import allocate
from geco.node.topology import Topology

BIG = "pack:8 core:64 pu:2"


def _timings(fn: Callable[[], object], runs: int) -> list[float]:
    """Milliseconds per call."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


_ROWS: list[Row] = []


def _row(label: str, values: list[float], note: str = "") -> None:
    print(f"{label:<44} {statistics.median(values):>9.3f} {_p99(values):>9.3f}  {note}")
    _ROWS.append(Row(f"cores: {label}, p50", statistics.median(values), "ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="allocations per row")
    add_json_option(parser)
    args = parser.parse_args()
    rng = random.Random(42)

    print(f"{'what':<44} {'median ms':>9} {'p99 ms':>9}")
    _row(f"load synthetic '{BIG}'", _timings(lambda: Topology.load(BIG), 200))
    host = Topology.load()
    _row(f"load this host ({len(host.cores)} cores, {len(host.pus)} PUs)",
         _timings(lambda: Topology.load(fresh=True), 200))

    topo = Topology.load(BIG)
    for threads in (False, True):
        for busy_pct in (0, 50, 90):
            cores = list(topo.cores)
            rng.shuffle(cores)
            taken = cores[:len(cores) * busy_pct // 100]
            busy = frozenset(pu for c in taken for pu in c.pus)
            refused = 0
            times: list[float] = []
            for _ in range(args.runs):
                slots = rng.randint(1, 64)
                t0 = time.perf_counter_ns()
                try:
                    allocate(topo, slots, busy_pus=busy, hardware_threads=threads)
                except CoresUnavailable:
                    refused += 1
                times.append((time.perf_counter_ns() - t0) / 1e6)
            unit = "threads" if threads else "cores"
            _row(f"allocate 1..64 {unit}, {busy_pct:>2} % busy", times,
                 f"refused {refused}/{args.runs}" if refused else "")
    write_rows(args.json, _ROWS)


if __name__ == "__main__":
    main()
