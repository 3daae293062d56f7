#!/opt/geco-dev/venv/bin/python
"""The start barrier of a parallel job: PREPARE to every slave host, all ready.

What the master's prolog adds for a job with N slave hosts: :func:`geco.wire.cluster.prepare`
sends each slave's gecod a PREPARE (at once, one TCP connection each) and waits for every
answer. The slaves here are the real cluster-channel servers
(:class:`geco.daemon.clusterserve.ClusterServer`) in this process, each with its own real
cgroup v1 parent (``geco-test-bench-sim<k>``), state dir and loopback address
(``127.0.1.<k>``, named ``geco-bench-sim<k>`` in /etc/hosts for the run, marked and removed
afterwards): the emulated cluster has 3 hosts, so 16 and 64 are simulated this way, and
1 and 3 are measured the same way for a fair line. Each round is a new job (one slot per
host), RELEASEd afterwards.

All N simulated slaves share this machine's cores, so their own work (a few ms of cgroup
writes each) queues up here, while on real hosts it runs in parallel. What the master
itself adds per host is measured apart, the same way but with no cgroup work: a
NODE_STATUS (``geco status --job``) to N hosts for a job none of them runs ("fan-out").
On a real cluster the barrier takes about the fan-out of N hosts plus one slave's work
(the 1-host barrier).

Floor, measured in the same run: a bare TCP loopback round trip (connect, 100 bytes
each way, close). Goal (issue 14): the barrier adds at most 2x the single-host prolog
(``bench_hooks.py``: 15 ms median with gecod) for 3 hosts, and grows no worse than
linearly with a small constant (prepares sent in parallel).

    /opt/geco-dev/venv/bin/python -m bench.bench_barrier [--rounds 10] [--hosts 1,3,16,64]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._common import percentile, remove_test_cgroups, sigterm_exits, v1_backend
from bench._table import Row, add_json_option, write_rows
from geco.cgroup import V1Backend
from geco.config import Config
from geco.daemon import clusterserve
from geco.daemon.context import GecodContext
from geco.daemon.runloop import RunLoop
from geco.daemon.server import Server
from geco.node.topology import Topology
from geco.pools import Pools
from geco.resourceset import NodeResources, ResourceSet, short_hostname
from geco.wire import cluster, keys
from geco.wire.messages import MsgType

HOSTS_FILE = Path("/etc/hosts")
MARK = "# geco-test-bench"
PORT = 16446


def name(k: int) -> str:
    return f"geco-bench-sim{k}"


def hosts_lines(count: int) -> None:
    """Name the simulated hosts in /etc/hosts (marked lines, removed by :func:`unhosts`)."""
    unhosts()
    with HOSTS_FILE.open("a") as f:
        for k in range(1, count + 1):
            f.write(f"127.0.1.{k} {name(k)} {MARK}\n")


def unhosts() -> None:
    lines = HOSTS_FILE.read_text().splitlines(keepends=True)
    HOSTS_FILE.write_text("".join(x for x in lines if not x.rstrip().endswith(MARK)))


def tcp_floor(rounds: int) -> float:
    """Median seconds of a bare loopback TCP round trip (connect, 100 bytes each way)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"x" * 100)
            c.recv(100)
        took.append(time.perf_counter() - started)
    server.close()
    return percentile(took, 0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="jobs per host count")
    parser.add_argument("--hosts", default="1,3,16,64", help="slave host counts")
    add_json_option(parser)
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]
    most = max(counts)
    sigterm_exits()
    tmp = Path(tempfile.mkdtemp(prefix="geco-bench-barrier-"))
    key_file = tmp / "cluster.key"
    keys.generate_key(key_file)
    key = keys.load_key(key_file)
    topology = Topology.load()
    base = Config(state_dir=tmp / "master", cluster_key_file=key_file,
                  cluster_address=f"port:{PORT}", execd_spool_dir=tmp / "spool")
    backends: list[V1Backend] = []
    rows: list[Row] = []
    loop = RunLoop(1.0)
    every_pools: list[Pools] = []
    serving = threading.Thread(target=loop.run, name="bench-barrier-loop", daemon=True)
    try:
        hosts_lines(most)
        for k in range(1, most + 1):
            backend = v1_backend(f"geco-test-bench-sim{k}", V1Backend)
            backend.ensure_root()
            backends.append(backend)
            cfg = base._replace(state_dir=tmp / name(k), cgroup_name=f"geco-test-bench-sim{k}",
                                cluster_bind=f"127.0.1.{k}")
            ctx = GecodContext(cfg, backend, topology, hostname=name(k))
            # each simulated host has pools of its own, as a real one has (their caps are
            # per job and per asking host: shared, the hosts' PREPAREs of one job would
            # take turns on one thread)
            pools = Pools.open(1)
            every_pools.append(pools)
            channel = clusterserve.ClusterChannel(ctx, key, clusterserve.listen(cfg), pools)
            Server(loop, [channel.lane], bytes(32), ctx, pools)
        serving.start()
        floor = tcp_floor(200)
        job = 880000
        for n in counts:
            took = []
            for _ in range(args.rounds):
                job += 1
                nodes = (NodeResources(short_hostname()),
                         *(NodeResources(name(k), is_slave=True) for k in range(1, n + 1)))
                rs = ResourceSet(job, 1, owner="root", nodes=nodes)
                started = time.perf_counter()
                failed = cluster.prepare(rs, base)
                took.append(time.perf_counter() - started)
                if failed:
                    raise SystemExit(f"bench_barrier: {failed[0].host}: {failed[0].reason}")
                cluster.ask_all([name(k) for k in range(1, n + 1)], MsgType.RELEASE, job, 1,
                                key, base)
            median = percentile(took, 0.5)
            print(f"{n:3d} slave hosts: barrier p50 {median * 1000:.1f} ms, "
                  f"p90 {percentile(took, 0.9) * 1000:.1f} ms, "
                  f"{median / n * 1000:.2f} ms per host; TCP round trip "
                  f"{floor * 1e6:.0f} us")
            goal = f"<= {2 * 15} (2 x prolog)" if n == 3 else "-"
            rows.append(Row(f"barrier, {n} slave host{'s' if n > 1 else ''}, p50",
                            median * 1000, "ms", goal, floor * 1000, "TCP round trip"))
        for n in counts:
            hosts = [name(k) for k in range(1, n + 1)]
            took = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                answers = cluster.ask_all(hosts, MsgType.NODE_STATUS, 1, 1, key, base)
                took.append(time.perf_counter() - started)
                if any(a.status != "refused" for a in answers):
                    raise SystemExit(f"bench_barrier: fan-out: {answers[0]}")
            median = percentile(took, 0.5)
            print(f"{n:3d} hosts: fan-out p50 {median * 1000:.1f} ms, "
                  f"{median / n * 1000:.2f} ms per host")
            rows.append(Row(f"cluster fan-out, {n} host{'s' if n > 1 else ''}, p50",
                            median * 1000, "ms", "linear", floor * 1000, "TCP round trip"))
        write_rows(args.json, rows)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        serving.join(timeout=10)
        loop.close()
        for pools in every_pools:
            pools.shutdown(cancel_futures=True)
        for backend in backends:
            remove_test_cgroups(backend)
        unhosts()
    return 0


if __name__ == "__main__":
    sys.exit(main())
